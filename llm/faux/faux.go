package faux

import (
	"context"
	"iter"
	"math"
	"sync"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/agentfleet/agentfleet/agent"
)

// Texts the reference uses.
const (
	AbortedText   = "Request was aborted"
	NoMoreText    = "No more faux responses queued"
	DefaultTokens = 4
)

// Response is one scripted reply (the type a run request's faux script
// decodes into).
type Response = agent.ScriptedResponse

// Options shape the stream.
type Options struct {
	// TokenSize is the chunk size in tokens; a chunk is TokenSize*4
	// characters. Zero means DefaultTokens.
	TokenSize int
	// TokensPerSecond paces the chunks; zero streams without delay.
	TokensPerSecond float64
	// FixedPace puts the chunks at fixed times from the stream's start, as
	// a provider that streams at its own pace whatever its reader does: a
	// late chunk does not push the later ones back. Without it the pacing
	// is pi's, each pause counting from the previous hand-over, so
	// lateness adds up (the offered rate then depends on how busy the
	// reader's machine is, which a load test must not).
	FixedPace bool
	// Fallback answers when the queue is empty; nil answers with pi's
	// "No more faux responses queued" error.
	Fallback func(llm agent.Context) Response
}

// Model is a scripted model. Its Stream method is an agent.StreamFn. It is
// safe for concurrent use; each call takes the next response.
type Model struct {
	opts Options

	mu        sync.Mutex
	responses []Response
	calls     int
}

// New returns a faux model with responses queued.
func New(opts Options, responses ...Response) *Model {
	if opts.TokenSize <= 0 {
		opts.TokenSize = DefaultTokens
	}
	return &Model{opts: opts, responses: responses}
}

// Push queues more responses.
func (m *Model) Push(responses ...Response) {
	m.mu.Lock()
	m.responses = append(m.responses, responses...)
	m.mu.Unlock()
}

// Calls returns how many model calls were made, aborted ones included.
func (m *Model) Calls() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}

// Pending returns how many responses are still queued.
func (m *Model) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.responses)
}

func (m *Model) next() (Response, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if len(m.responses) == 0 {
		return Response{}, false
	}
	r := m.responses[0]
	m.responses = m.responses[1:]
	return r, true
}

// Stream implements agent.StreamFn.
func (m *Model) Stream(ctx context.Context, model agent.Model, llm agent.Context, _ agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	return func(yield func(agent.StreamEvent) bool) {
		resp, ok := m.next() // used up even if the call is aborted before it starts
		if !ok && m.opts.Fallback != nil {
			resp, ok = m.opts.Fallback(llm), true
		}
		s := streamer{ctx: ctx, yield: yield, chunk: chunkChars(m.opts.TokenSize), tps: m.opts.TokensPerSecond, fixed: m.opts.FixedPace}
		s.msg = agent.Message{Role: agent.RoleAssistant, API: model.API, Provider: model.Provider,
			Model: model.ID, StopReason: agent.StopReasonStop, Timestamp: time.Now().UnixMilli()}
		// The reference reports an empty queue before it looks at the abort.
		if !ok {
			s.fail(agent.StopReasonError, NoMoreText)
			return
		}
		if ctx.Err() != nil {
			s.abort()
			return
		}
		s.msg.Usage.Input = estimateTokens(contextChars(llm))
		hdr := s.msg
		if !s.handOver(agent.StreamEvent{Type: agent.StreamStart, Message: &hdr}) {
			return
		}
		// No abort check between blocks: the reference pushes a block's end
		// and the next block's start before its consumer sees either, so an
		// abort at an end event is seen only after the next start.
		out := 0
		for i, block := range resp.Content {
			n, ok := s.block(i, block)
			if !ok {
				return
			}
			out += n
		}
		s.msg.Usage.Output = estimateTokens(out)
		s.msg.Usage.TotalTokens = s.msg.Usage.Input + s.msg.Usage.Output
		model.ComputeCost(&s.msg.Usage)
		switch resp.StopReason {
		case agent.StopReasonError, agent.StopReasonAborted:
			s.fail(resp.StopReason, resp.ErrorMessage)
		default:
			reason := resp.StopReason
			if reason == "" {
				reason = agent.StopReasonStop
			}
			s.msg.StopReason = reason
			final := s.msg
			s.yield(agent.StreamEvent{Type: agent.StreamDone, Reason: reason, Message: &final})
		}
	}
}

type streamer struct {
	ctx   context.Context
	yield func(agent.StreamEvent) bool
	chunk int
	tps   float64
	msg   agent.Message
	timer *time.Timer
	// pushed is when the stream's start or its last delta was handed
	// over. The reference's producer pushes without waiting for its
	// consumer, and pushes a block's end and the next block's start with
	// the delta before them; it sleeps from there, so handling those
	// events overlaps the pause instead of adding to it.
	pushed time.Time
	fixed  bool      // FixedPace
	due    time.Time // FixedPace: when the last chunk was due
}

// handOver yields the stream's start or a delta: the next pause counts
// from it.
func (s *streamer) handOver(ev agent.StreamEvent) bool {
	if s.tps > 0 {
		s.pushed = time.Now()
		if s.fixed && s.due.IsZero() {
			s.due = s.pushed // the stream's start
		}
	}
	return s.yield(ev)
}

// block streams one content block and returns its size in characters;
// false means stop (aborted or the consumer is gone).
func (s *streamer) block(i int, b agent.Content) (int, bool) {
	var full string
	var start, delta, end agent.StreamEventType
	switch b.Type {
	case agent.ContentText:
		full, start, delta, end = b.Text, agent.StreamTextStart, agent.StreamTextDelta, agent.StreamTextEnd
		s.msg.Content = append(s.msg.Content, agent.Content{Type: agent.ContentText})
	case agent.ContentThinking:
		full, start, delta, end = b.Thinking, agent.StreamThinkingStart, agent.StreamThinkingDelta, agent.StreamThinkingEnd
		s.msg.Content = append(s.msg.Content, agent.Content{Type: agent.ContentThinking})
	case agent.ContentToolCall:
		args := b.Arguments
		if args == nil {
			args = map[string]any{}
		}
		raw, _ := agent.MarshalJSON(args)
		full, start, delta, end = string(raw), agent.StreamToolCallStart, agent.StreamToolCallDelta, agent.StreamToolCallEnd
		s.msg.Content = append(s.msg.Content, agent.Content{Type: agent.ContentToolCall, ID: b.ID, Name: b.Name, Arguments: map[string]any{}})
	default:
		// Images are not something a model streams; keep them as they are.
		s.msg.Content = append(s.msg.Content, b)
		return 0, true
	}
	if !s.yield(agent.StreamEvent{Type: start, ContentIndex: i, ID: b.ID, Name: b.Name}) {
		return 0, false
	}
	// At least one delta: an empty block streams one empty chunk.
	for pos := 0; ; {
		n, units := chunkAt(full[pos:], s.chunk)
		if !s.pace(units) {
			s.abort()
			return 0, false
		}
		piece := full[pos : pos+n]
		pos += n
		ev := agent.StreamEvent{Type: delta, ContentIndex: i, Delta: piece}
		c := &s.msg.Content[i]
		switch b.Type {
		case agent.ContentText:
			c.Text = full[:pos] // a substring: no copying as the text grows
		case agent.ContentThinking:
			c.Thinking = full[:pos]
		case agent.ContentToolCall:
			if pos == len(full) {
				c.Arguments = b.Arguments
				ev.Arguments = b.Arguments
			}
		}
		if !s.handOver(ev) {
			return 0, false
		}
		if pos >= len(full) {
			break
		}
	}
	final := b
	if b.Type == agent.ContentToolCall && final.Arguments == nil {
		final.Arguments = map[string]any{}
	}
	s.msg.Content[i] = final
	ev := agent.StreamEvent{Type: end, ContentIndex: i, Content: full}
	if b.Type == agent.ContentToolCall {
		ev.Content = ""
		ev.ToolCall = &final
	}
	return len(b.Name) + len(full), s.yield(ev)
}

// pace waits before a chunk of n characters, counting from pushed (or,
// with FixedPace, from when the last chunk was due); false when aborted.
func (s *streamer) pace(n int) bool {
	if s.tps > 0 {
		d := time.Duration(math.MaxInt64) // a pace too slow to express: wait for the abort
		if secs := float64(estimateTokens(n)) / s.tps; secs < float64(math.MaxInt64)/float64(time.Second) {
			d = time.Duration(secs * float64(time.Second))
			switch {
			case s.fixed && !s.due.IsZero():
				s.due = s.due.Add(d)
				d = time.Until(s.due)
			case !s.pushed.IsZero():
				d -= time.Since(s.pushed)
			}
		}
		if d <= 0 {
			return s.ctx.Err() == nil
		}
		if s.timer == nil {
			s.timer = time.NewTimer(d)
		} else {
			s.timer.Reset(d)
		}
		select {
		case <-s.timer.C:
		case <-s.ctx.Done():
			s.timer.Stop()
		}
	}
	return s.ctx.Err() == nil
}

func (s *streamer) abort() { s.fail(agent.StopReasonAborted, AbortedText) }

func (s *streamer) fail(reason agent.StopReason, text string) {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.msg.StopReason = reason
	s.msg.ErrorMessage = text
	final := s.msg
	s.yield(agent.StreamEvent{Type: agent.StreamError, Reason: reason, Message: &final})
}

// estimateTokens is ceil(chars/4), without overflow.
func estimateTokens(chars int) int { return chars/4 + min(chars%4, 1) }

// chunkAt returns the byte length of the next chunk of s: limit
// characters counted in UTF-16 units, as the reference's string slicing
// does, but never splitting a character (a delta stays valid UTF-8); and the
// units it holds.
func chunkAt(s string, limit int) (n, units int) {
	for n < len(s) && units < limit {
		r, size := utf8.DecodeRuneInString(s[n:])
		n += size
		units += utf16.RuneLen(r)
	}
	return n, units
}

// chunkChars is tokenSize*4, or the whole block for a tokenSize too large to
// multiply.
func chunkChars(tokenSize int) int {
	if tokenSize > math.MaxInt/4 {
		return math.MaxInt
	}
	return tokenSize * 4
}

// contextChars sizes the request for the usage estimate. Tool-call
// arguments count by name and id only: an estimate need not serialise them.
func contextChars(llm agent.Context) int {
	n := len(llm.SystemPrompt)
	for i := range llm.Messages {
		for _, b := range llm.Messages[i].Content {
			n += len(b.Text) + len(b.Thinking) + len(b.Name) + len(b.ID)
		}
	}
	return n
}
