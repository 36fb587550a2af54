package worker

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"strings"
	"sync"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
	"github.com/agentfleet/agentfleet/llm/overflow"
	"github.com/agentfleet/agentfleet/worker/internal/compaction"
	"github.com/agentfleet/agentfleet/worker/internal/metering"
)

// ModelWindow is a model table entry's context window and compaction
// defaults (0: pi's, scaled for the window).
type ModelWindow struct {
	ContextWindow    int
	ReserveTokens    int
	KeepRecentTokens int
}

// Compaction of a long run's context (issue 58, docs/protocol.md
// "Compaction"), on the agent's TransformContext seam:
//
//   - before each model call, when the context the model would be sent
//     exceeds window - reserve (or a compact control message asks), the
//     messages before a turn boundary keepRecentTokens back are summarised
//     by a model (internal/compaction) and the call is sent the summary
//     message and the kept messages instead;
//   - a call the provider refuses as too long (llm/overflow) is compacted
//     and sent again, once;
//   - compaction_start and compaction_end are published; the end holds the
//     summary and the transcript index of the first kept message, from
//     which a resumed attempt rebuilds the context (resume.go) without
//     compacting it again, and a continuation loads it (the snapshot holds
//     the compacted context, continuation.go);
//   - the agent's own transcript keeps every message during an agent run
//     (the events hold them all); a resume starts from the compacted one.
//
// Invariant: live message i >= dropped is transcript message
// keptFrom + i - dropped; live messages before dropped are what summary
// stands for. The loop's transcript only grows between compactions, so
// the indices of one agent run stay valid.
type compactor struct {
	r            *run
	set          compaction.Settings
	auto         bool // the request asked for compaction: threshold and overflow
	model        agent.Model
	modelName    string
	stream       agent.StreamFn // the summary call, through the run's stack
	limit        *ModelLimit    // the summary model's shared rate limit
	instructions string

	// mu guards what the control owner touches (manual); the rest is the
	// loop's own, one call at a time.
	mu         sync.Mutex
	manual     *manualCompact
	answeredTo uint64

	summary  string
	dropped  int
	keptFrom int
	fresh    int // live index from which reported usage counts
	last     []agent.Message
	sumTS    int64
	// gone are the call keys and the number of assistant messages of what
	// the summary stands for: new calls' keys avoid them and count them
	// (internal/callkey, invariant 1), so keys stay unique in the run.
	goneKeys  map[string]bool
	goneTurns int
}

// forget records msgs, now stood for by the summary, for the call keys.
func (c *compactor) forget(msgs []agent.Message) {
	if c.goneKeys == nil {
		c.goneKeys = maps.Clone(c.r.earlier.usedCallKeys)
		if c.goneKeys == nil {
			c.goneKeys = map[string]bool{}
		}
	}
	for i := range msgs {
		if msgs[i].Role != agent.RoleAssistant {
			continue
		}
		c.goneTurns++
		for _, tc := range msgs[i].ToolCalls() {
			c.goneKeys[tc.ID] = true
		}
	}
}

// instructionsSep joins the instructions of compact messages.
const instructionsSep = "; "

type manualCompact struct {
	parts []string // the messages' instructions, oldest first
	seq   uint64
}

func (m *manualCompact) instructions() string { return strings.Join(m.parts, instructionsSep) }

// planCompaction sets the run's compactor up: automatic when the request
// has "compaction", manual (the compact verb) whenever the model's window
// is known. Problems of the request are added; a request for compaction on
// a model without a known window runs without it, with a notice.
func (r *run) planCompaction(add func(string, ...any)) {
	req, w := r.req, r.w
	window := r.model.ContextWindow
	mw, ok := w.cfg.ModelWindows[r.modelRef.String()]
	if ok && mw.ContextWindow > 0 {
		window = mw.ContextWindow
	}
	asked := req.Compaction
	if window <= 0 {
		if asked != nil {
			r.notice = joinNotice(r.notice, fmt.Sprintf("compaction is off: model %s has no known context window (contextWindow in the worker's model table)", r.modelRef))
		}
		return
	}
	reserve, keep := mw.ReserveTokens, mw.KeepRecentTokens
	var instructions string
	if asked != nil {
		if asked.ReserveTokens > 0 {
			reserve = asked.ReserveTokens
		}
		if asked.KeepRecentTokens > 0 {
			keep = asked.KeepRecentTokens
		}
		instructions = asked.Instructions
	}
	// Every call asks its output reserve as max_tokens, which servers count
	// against the window: the threshold leaves room for it.
	set, problems := compaction.Resolve(window, reserve, keep, r.outputReserve(req.MaxTokens))
	if asked == nil && len(problems) > 0 {
		return // the table's defaults do not fit: no manual compaction either
	}
	for _, p := range problems {
		add("%s", p)
	}
	c := &compactor{r: r, set: set, auto: asked != nil, model: r.model, modelName: r.modelRef.String(),
		instructions: instructions, stream: r.stream, limit: r.modelLimit}
	if asked != nil && asked.Model != nil && *asked.Model != r.modelRef && r.req.Faux == nil {
		if w.cfg.NoFaux && asked.Model.Provider == "faux" {
			add("compaction.model %s: this worker does not run faux models (--allow-faux is off)", asked.Model)
			return
		}
		p := w.providers[asked.Model.Provider]
		if p == nil {
			add("compaction.model: unknown model provider %q: this worker has %s", clipString(asked.Model.Provider, 64), w.providerNames())
			return
		}
		c.model, c.modelName = p.Model(asked.Model.ID), asked.Model.String()
		if c.model.ID == "" {
			c.model.ID = asked.Model.ID
		}
		// A summary call sends up to the context at the threshold less what
		// is kept, plus the previous summary, and asks the summary's
		// output: a summariser whose window is known must hold that.
		sw := c.model.ContextWindow
		if mw, ok := w.cfg.ModelWindows[asked.Model.String()]; ok && mw.ContextWindow > 0 {
			sw = mw.ContextWindow
		}
		if need := set.Window - set.Reserve() - set.KeepRecentTokens + 2*set.SummaryMaxTokens(); sw > 0 && sw < need {
			add("compaction.model %s has a context window of %d tokens, less than the %d a summary call may need (the context at the threshold less keepRecentTokens, the previous summary and the summary's output)",
				asked.Model, sw, need)
			return
		}
		c.stream = meteredProvider{p}.Stream
		// Its calls wait in its own rate-limit group and are priced at its
		// own prices (worstCost takes the call's model).
		c.limit = nil
		if ml, ok := w.modelLimit(*asked.Model); ok {
			c.limit = &ml
		}
	}
	r.comp = c
}

func joinNotice(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// wire finishes the compactor once the run's stream stack exists.
func (c *compactor) wire() { c.stream = c.r.wrapStream(c.stream, c.limit, c.modelName) }

// requestManual queues a compact control message for the next model call.
// Invariant: a compaction answers every compact message delivered before
// it; its controlSeq is the newest's, so a resumed attempt takes none of
// those up to it again (answeredTo). Two before one call are one
// compaction with both instructions, within
// bus.MaxCompactionInstructionsJoined: the oldest whole ones that do not
// fit are left out, so that a flood of messages cannot grow the summary
// prompt past what its model takes.
func (c *compactor) requestManual(instructions string, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq <= c.answeredTo {
		return // an earlier attempt's compaction answered it
	}
	var parts []string
	if m := c.manual; m != nil {
		parts = m.parts
	}
	if instructions != "" {
		parts = append(parts, instructions)
	}
	for size := len(strings.Join(parts, instructionsSep)); size > bus.MaxCompactionInstructionsJoined && len(parts) > 1; {
		size -= len(parts[0]) + len(instructionsSep)
		parts = parts[1:]
	}
	c.manual = &manualCompact{parts: parts, seq: seq}
}

// answered records the newest compact message an earlier attempt's
// successful compaction answered.
func (c *compactor) answered(seq uint64) {
	c.mu.Lock()
	c.answeredTo = max(c.answeredTo, seq)
	c.mu.Unlock()
}

func (c *compactor) takeManual() *manualCompact {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.manual
	c.manual = nil
	return m
}

// view is what the model is sent of live.
func (c *compactor) view(live []agent.Message) []agent.Message {
	if c.summary == "" || c.dropped > len(live) {
		return live
	}
	out := make([]agent.Message, 0, 1+len(live)-c.dropped)
	out = append(out, bus.CompactionSummaryMessage(c.summary, c.sumTS))
	return append(out, live[c.dropped:]...)
}

// tokens is the size of the context the model is sent (the view): the
// summary counts once, in the usage a call sent it reported, else in the
// estimate.
func (c *compactor) tokens(live []agent.Message) int {
	if c.summary == "" || c.dropped > len(live) {
		return compaction.ContextTokens(live, c.fresh)
	}
	// View index of live index i >= dropped: i - dropped + 1.
	return compaction.ContextTokens(c.view(live), c.fresh-c.dropped+1)
}

// transform is the agent's TransformContext.
func (c *compactor) transform(ctx context.Context, live []agent.Message) ([]agent.Message, error) {
	c.last = live
	if c.r.tally.Stopping() {
		return c.view(live), nil
	}
	reason, manual := "", c.takeManual()
	tokens := c.tokens(live)
	switch {
	case manual != nil:
		reason = bus.CompactionManual
	case c.auto && c.set.ShouldCompact(tokens):
		reason = bus.CompactionThreshold
	}
	if reason != "" {
		err := c.compact(ctx, live, reason, tokens, manual, c.set.KeepRecentTokens)
		if err == errNothingToCompact && manual != nil {
			// Asked for: everything but the newest turn goes, as much as
			// a cut on a turn boundary allows.
			err = c.compact(ctx, live, reason, tokens, manual, 1)
			if err == errNothingToCompact {
				// Answered, so that a resumed attempt does not take it
				// again (Recover's AnsweredSeqs): published here, on the
				// agent's goroutine, as the compaction events are.
				_, _ = c.r.pub.Fleet(bus.EventControlRejected, bus.ControlRejected{Type: bus.EventControlRejected, Kind: bus.KindCompact,
					Reason: "nothing to compact: the context is its newest turn alone", ControlSeq: manual.seq})
			}
		}
		if err != nil && err != errNothingToCompact && err != errManualFailed {
			return nil, err
		}
	}
	return c.view(live), nil
}

// errNothingToCompact: every message is within keepRecentTokens.
var errNothingToCompact = errors.New("nothing to compact: the context is within keepRecentTokens")

// errManualFailed: a manual compaction's summary call failed; the run goes
// on.
var errManualFailed = errors.New("the manual compaction failed")

// compact summarises live[dropped:cut] into the summary. A summary call
// that fails fails the run (compaction_failed, its reason in run_finished
// and in compaction_end), unless a compact message asked for it
// (errManualFailed).
func (c *compactor) compact(ctx context.Context, live []agent.Message, reason string, tokens int, manual *manualCompact, keep int) error {
	r := c.r
	cut := compaction.FindCut(live, c.dropped, keep)
	if cut <= c.dropped {
		r.log.Info("compaction skipped: nothing to cut", "reason", reason, "tokens", tokens)
		return errNothingToCompact
	}
	start := bus.CompactionStart{Type: bus.EventCompactionStart, Reason: reason, TokensBefore: tokens}
	instructions := c.instructions
	if manual != nil {
		start.ControlSeq = manual.seq
		if len(manual.parts) > 0 {
			instructions = joinNotice(instructions, manual.instructions())
		}
	}
	if _, err := r.pub.Fleet(bus.EventCompactionStart, start); err != nil {
		return err
	}
	// A model refuses a call asking more output than it has (its maxTokens).
	maxOut := c.set.SummaryMaxTokens()
	if m := c.model.MaxTokens; m > 0 {
		maxOut = min(maxOut, m)
	}
	summary, final, err := compaction.Summarize(ctx, c.stream, c.model, live[c.dropped:cut], c.summary, instructions, maxOut)
	end := bus.CompactionEnd{Type: bus.EventCompactionEnd, Reason: reason, TokensBefore: tokens, Model: c.modelName,
		ControlSeq: start.ControlSeq}
	if final != nil {
		u := final.Usage
		end.Usage = &u
	}
	if err != nil {
		end.Error = clipString(err.Error(), bus.MaxErrorBytes)
		end.Cancelled = ctx.Err() != nil
		_, _ = r.pub.Fleet(bus.EventCompactionEnd, end)
		switch {
		case ctx.Err() != nil || r.tally.Stopping():
			// Cancelled, or a call a run or tenant budget refused: that
			// reason stands (the refusal recorded it).
		case manual != nil:
			// As pi's /compact: the failure is reported (compaction_end)
			// and the run goes on with its context as it was.
			r.log.Warn("manual compaction failed; the run goes on", "err", end.Error)
			return errManualFailed
		default:
			r.overBudget(bus.ReasonCompactionFailed, end.Error)
		}
		return err
	}
	from := c.dropped
	c.forget(live[from:cut])
	c.keptFrom += cut - c.dropped
	c.summary, c.dropped, c.fresh = summary, cut, len(live)
	c.sumTS = live[cut-1].Timestamp
	view := c.view(live)
	end.Summary, end.FirstKeptIndex, end.MessagesSummarized = summary, c.keptFrom, cut-from
	end.TokensAfter = compaction.ContextTokens(view, len(view))
	if _, err := r.pub.Fleet(bus.EventCompactionEnd, end); err != nil {
		return err
	}
	if l := r.listener; l != nil {
		l.transcriptBytes = int(jsonSize(view)) // the bound counts what is held, not the history
	}
	r.log.Info("context compacted", "reason", reason, "tokensBefore", tokens, "tokensAfter", end.TokensAfter,
		"firstKeptIndex", c.keptFrom)
	return nil
}

// restore rebuilds the context of a resumed run from its last successful
// compaction_end: the agent starts from the summary and the kept messages
// (not the full transcript, all), and what was compacted is not again.
func (c *compactor) restore(end *bus.CompactionEnd, all []agent.Message) []agent.Message {
	if !bus.CompactionFits(all, end) {
		return all
	}
	ctxMsgs := bus.CompactedContext(all, end)
	c.forget(all[:end.FirstKeptIndex])
	c.summary, c.keptFrom, c.dropped, c.fresh = end.Summary, end.FirstKeptIndex, 1, len(ctxMsgs)
	c.sumTS = ctxMsgs[0].Timestamp
	return ctxMsgs
}

// adopt takes the summary a continued run's compacted context starts
// with (its first message, bus.CompactionSummaryMessage) as the previous
// summary: a later compaction updates it (pi's update prompt) instead of
// summarising it as a user's text. Index 0 is the summary's in the
// continuation's transcript, so kept messages start at 1.
func (c *compactor) adopt(msgs []agent.Message) {
	if c.summary != "" || len(msgs) == 0 || msgs[0].Role != agent.RoleUser || len(msgs[0].Content) != 1 {
		return
	}
	text := msgs[0].TextOf()
	if !strings.HasPrefix(text, bus.CompactionSummaryPrefix) || !strings.HasSuffix(text, bus.CompactionSummarySuffix) {
		return
	}
	c.summary = strings.TrimSuffix(strings.TrimPrefix(text, bus.CompactionSummaryPrefix), bus.CompactionSummarySuffix)
	c.dropped, c.keptFrom, c.fresh, c.sumTS = 1, 1, len(msgs), msgs[0].Timestamp
}

// overflowStream wraps the agent's model call: a call the provider refuses
// as too long for the context window, before any content, is compacted
// and sent again, once. Anything else passes through.
//
// The refused call's stream is drained first, so that its wrappers (the
// tenant's hold for its worst case, the rate-limit reservation, the span,
// the HTTP body) settle and let go before the summary call asks for its
// own. A refusal after content was passed on is passed on too: a retry's
// deltas would join the first call's partial message.
func (c *compactor) overflowStream(fn agent.StreamFn) agent.StreamFn {
	if !c.auto {
		return fn
	}
	return func(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			var held *agent.StreamEvent // the start, until the call is known not to be refused
			var refused *agent.StreamEvent
			passed := false // an event after the start was passed on
			for ev := range fn(ctx, model, llm, opts) {
				switch {
				case ev.Type == agent.StreamStart && held == nil && refused == nil:
					e := ev
					held = &e
					continue
				case !passed && refused == nil && ev.Type == agent.StreamError && ev.Message != nil &&
					overflow.Is(ev.Message.ErrorMessage) && ctx.Err() == nil:
					e := ev
					refused = &e
					continue // drained below
				case refused != nil:
					continue
				}
				if held != nil {
					if !yield(*held) {
						return
					}
					held = nil
				}
				passed = true
				if !yield(ev) {
					return
				}
			}
			if refused != nil {
				if msgs, ok := c.afterOverflow(ctx, refused.Message.ErrorMessage); ok {
					retry := llm
					retry.Messages = msgs
					for ev := range fn(ctx, model, retry, opts) {
						if !yield(ev) {
							return
						}
					}
					return
				}
				if held != nil && !yield(*held) {
					return
				}
				yield(*refused)
				return
			}
			if held != nil {
				yield(*held)
			}
		}
	}
}

// afterOverflow compacts the context of the refused call; it returns the
// messages to send again, or false to pass the refusal on.
func (c *compactor) afterOverflow(ctx context.Context, text string) ([]agent.Message, bool) {
	live := c.last
	if live == nil {
		return nil, false
	}
	c.r.log.Warn("the provider refused the context as too long; compacting and retrying once", "err", clipString(text, 300))
	err := c.compact(ctx, live, bus.CompactionOverflow, c.tokens(live), nil, c.set.KeepRecentTokens)
	if err == errNothingToCompact {
		// Everything fits keep, yet not the window: keep less.
		err = c.compact(ctx, live, bus.CompactionOverflow, c.tokens(live), nil, c.set.KeepRecentTokens/4)
	}
	if err != nil {
		return nil, false
	}
	msgs, err := agent.DefaultConvertToLLM(ctx, c.view(live))
	return msgs, err == nil
}

// compactControl takes a compact control message: its text (a JSON
// Control's, or the raw body) focuses the summary. It reports whether it
// was taken; one the run cannot take is rejected (control_rejected).
func (r *run) compactControl(data []byte, seq uint64) bool {
	c := r.comp
	if c == nil {
		r.ctl.reject(bus.KindCompact, seq, fmt.Errorf("compaction is off for this run: model %s has no known context window", r.modelRef))
		return false
	}
	text, err := workerproto.DecodeCompact(data)
	if err != nil {
		r.ctl.reject(bus.KindCompact, seq, err)
		return false
	}
	c.requestManual(text, seq)
	r.log.Info("compaction requested", "controlSeq", seq)
	return true
}

// compactionsIn reads earlier attempts' compaction_end events (the
// Recover fold's: not those of an attempt stored after a newer one's
// run_started, nor duplicates): the last successful one, how many
// scripted responses their calls took (a faux script's position: the
// summary, and an overflow's refused call), the compact control messages
// their successful compactions answered and the summary calls' usage (charged, not in any
// message).
func compactionsIn(ends []*bus.CompactionEnd) (last *bus.CompactionEnd, scripted int, controls []uint64, usage agent.Usage) {
	for _, end := range ends {
		if end.Usage != nil {
			usage.Add(metering.NonNegative(*end.Usage))
		}
		if end.Error != "" {
			continue // not answered (cancelled by a drain or a hand-back): taken again
		}
		if end.ControlSeq != 0 {
			controls = append(controls, end.ControlSeq)
		}
		last = end
		scripted++
		if end.Reason == bus.CompactionOverflow {
			scripted++
		}
	}
	return last, scripted, controls, usage
}

// contextMessages is the run's context as the model is sent it: the
// snapshot holds it, so that a continuation loads the compacted context.
func (r *run) contextMessages() []agent.Message {
	msgs := r.agent.Messages()
	if r.comp != nil {
		msgs = r.comp.view(msgs)
	}
	return msgs
}
