package agent

import (
	"context"
	"iter"
	"strings"
)

// ThinkingLevel is the reasoning effort asked of the model.
type ThinkingLevel string

const (
	ThinkingOff     ThinkingLevel = "off"
	ThinkingMinimal ThinkingLevel = "minimal"
	ThinkingLow     ThinkingLevel = "low"
	ThinkingMedium  ThinkingLevel = "medium"
	ThinkingHigh    ThinkingLevel = "high"
	ThinkingXHigh   ThinkingLevel = "xhigh"
	ThinkingMax     ThinkingLevel = "max"
)

// ModelCost is the price of a model in dollars per million tokens.
type ModelCost struct {
	Input      float64 `json:"input"`
	Output     float64 `json:"output"`
	CacheRead  float64 `json:"cacheRead"`
	CacheWrite float64 `json:"cacheWrite"`
}

// Model describes the model a run talks to. The core only forwards it to the
// stream function and stamps assistant messages with its identity.
type Model struct {
	ID            string    `json:"id"`
	Name          string    `json:"name,omitempty"`
	API           string    `json:"api"`
	Provider      string    `json:"provider"`
	BaseURL       string    `json:"baseUrl,omitempty"`
	Reasoning     bool      `json:"reasoning,omitempty"`
	Input         []string  `json:"input,omitempty"`
	Cost          ModelCost `json:"cost"`
	ContextWindow int       `json:"contextWindow,omitempty"`
	MaxTokens     int       `json:"maxTokens,omitempty"`
}

// UnknownModel is pi's placeholder model of an Agent built without one.
func UnknownModel() Model {
	return Model{ID: "unknown", Name: "unknown", API: "unknown", Provider: "unknown"}
}

// ComputeCost fills u.Cost from the model's prices.
func (m Model) ComputeCost(u *Usage) {
	u.Cost.Input = m.Cost.Input * float64(u.Input) / 1e6
	u.Cost.Output = m.Cost.Output * float64(u.Output) / 1e6
	u.Cost.CacheRead = m.Cost.CacheRead * float64(u.CacheRead) / 1e6
	u.Cost.CacheWrite = m.Cost.CacheWrite * float64(u.CacheWrite) / 1e6
	u.Cost.Total = u.Cost.Input + u.Cost.Output + u.Cost.CacheRead + u.Cost.CacheWrite
}

// Context is a conversation: the system prompt, the messages and the tools.
// The loop keeps its own Context per run; a stream function receives one
// whose messages went through TransformContext and ConvertToLLM.
type Context struct {
	SystemPrompt string
	Messages     []Message
	Tools        []*Tool
}

// StreamOptions are the per-request options forwarded to a stream function.
type StreamOptions struct {
	APIKey      string
	Reasoning   ThinkingLevel // "" when thinking is off
	SessionID   string
	Temperature *float64
	MaxTokens   int
}

// StreamEventType names an assistant stream event.
type StreamEventType string

const (
	StreamStart         StreamEventType = "start"
	StreamTextStart     StreamEventType = "text_start"
	StreamTextDelta     StreamEventType = "text_delta"
	StreamTextEnd       StreamEventType = "text_end"
	StreamThinkingStart StreamEventType = "thinking_start"
	StreamThinkingDelta StreamEventType = "thinking_delta"
	StreamThinkingEnd   StreamEventType = "thinking_end"
	StreamToolCallStart StreamEventType = "toolcall_start"
	StreamToolCallDelta StreamEventType = "toolcall_delta"
	StreamToolCallEnd   StreamEventType = "toolcall_end"
	StreamDone          StreamEventType = "done"
	StreamError         StreamEventType = "error"
)

// StreamEvent is one event of pi's assistant message stream, carried as a
// delta: receivers build the partial message with a MessageBuilder instead of
// getting a copy of it with every event. This is also the wire form of
// message_update.
type StreamEvent struct {
	Type         StreamEventType `json:"type"`
	ContentIndex int             `json:"contentIndex"`
	// Delta is the appended text (text/thinking) or raw JSON fragment (toolcall).
	Delta string `json:"delta,omitempty"`
	// Content is the full text of a block on text_end / thinking_end.
	Content string `json:"content,omitempty"`
	// Signature is the block's text or thinking signature, on *_start and *_end.
	Signature string `json:"signature,omitempty"`
	// ID and Name identify the call on toolcall_start.
	ID   string `json:"id,omitempty"`
	Name string `json:"name,omitempty"`
	// Arguments are the best-effort parsed arguments so far on toolcall_delta.
	Arguments map[string]any `json:"arguments,omitempty"`
	// ToolCall is the final call on toolcall_end.
	ToolCall *Content `json:"toolCall,omitempty"`
	// Reason is the stop reason on done / error.
	Reason StopReason `json:"reason,omitempty"`
	// Message is the message header (role, api, provider, model; no content)
	// on start, and the final message on done / error. It is not sent on the
	// wire as part of message_update.
	Message *Message `json:"-"`
}

// StreamFn asks a model for one assistant message. It yields `start`, block
// events and exactly one final `done` or `error` event, and stops early when
// yield returns false. It never reports failure any other way: request, model
// and runtime errors, and ctx being cancelled, end the stream with an `error`
// event whose message has StopReason error or aborted and an ErrorMessage.
// Events are yielded on the caller's goroutine, so a stream function must not
// touch a Message it yielded after yield returns. llm's messages are the
// run's own: a stream function reads them and never changes them.
type StreamFn func(ctx context.Context, model Model, llm Context, opts StreamOptions) iter.Seq[StreamEvent]

// MessageBuilder rebuilds a partial assistant message from stream events. The
// agent keeps its streaming message with it, and bus uses it to rebuild the
// partial message from message_update events on the wire.
type MessageBuilder struct {
	msg Message
	// bufs accumulate the text of each block, so a long stream of deltas
	// costs amortised appends instead of one string copy per delta. Strings
	// handed out view bytes that are never written again.
	bufs []*strings.Builder
}

// Reset starts a new message from a header (the start event's Message).
func (b *MessageBuilder) Reset(header Message) {
	header.Content = nil
	b.msg = header
	b.bufs = b.bufs[:0]
}

// appendText adds a delta to block i's buffer and returns the whole text.
func (b *MessageBuilder) appendText(i int, prev, delta string) string {
	for len(b.bufs) <= i {
		b.bufs = append(b.bufs, nil)
	}
	sb := b.bufs[i]
	if sb == nil || sb.Len() != len(prev) {
		// First delta of the block (or the block was replaced): start over.
		sb = &strings.Builder{}
		sb.Grow(max(64, 2*(len(prev)+len(delta))))
		sb.WriteString(prev)
		b.bufs[i] = sb
	}
	sb.WriteString(delta)
	return sb.String()
}

// Message returns the message built so far. Its content slice is shared with
// the builder: copy it before the next Apply if you keep it.
func (b *MessageBuilder) Message() *Message { return &b.msg }

// Apply folds one block event into the message. Events that do not fit the
// message (an index out of order) are ignored rather than trusted.
func (b *MessageBuilder) Apply(ev *StreamEvent) {
	i := ev.ContentIndex
	switch ev.Type {
	case StreamTextStart:
		b.put(i, Content{Type: ContentText, TextSignature: ev.Signature})
	case StreamThinkingStart:
		b.put(i, Content{Type: ContentThinking, ThinkingSignature: ev.Signature})
	case StreamToolCallStart:
		b.put(i, Content{Type: ContentToolCall, ID: ev.ID, Name: ev.Name, Arguments: map[string]any{}})
	case StreamTextDelta:
		if c := b.at(i, ContentText); c != nil {
			c.Text = b.appendText(i, c.Text, ev.Delta)
		}
	case StreamThinkingDelta:
		if c := b.at(i, ContentThinking); c != nil {
			c.Thinking = b.appendText(i, c.Thinking, ev.Delta)
		}
	case StreamToolCallDelta:
		if c := b.at(i, ContentToolCall); c != nil && ev.Arguments != nil {
			c.Arguments = ev.Arguments
		}
	case StreamTextEnd:
		if c := b.at(i, ContentText); c != nil {
			c.Text = ev.Content
			if ev.Signature != "" {
				c.TextSignature = ev.Signature
			}
		}
	case StreamThinkingEnd:
		if c := b.at(i, ContentThinking); c != nil {
			c.Thinking = ev.Content
			if ev.Signature != "" {
				c.ThinkingSignature = ev.Signature
			}
		}
	case StreamToolCallEnd:
		if c := b.at(i, ContentToolCall); c != nil && ev.ToolCall != nil {
			*c = *ev.ToolCall
		}
	}
}

func (b *MessageBuilder) put(i int, c Content) {
	switch {
	case i == len(b.msg.Content):
		b.msg.Content = append(b.msg.Content, c)
	case i >= 0 && i < len(b.msg.Content):
		b.msg.Content[i] = c
	}
}

func (b *MessageBuilder) at(i int, typ string) *Content {
	if i < 0 || i >= len(b.msg.Content) || b.msg.Content[i].Type != typ {
		return nil
	}
	return &b.msg.Content[i]
}
