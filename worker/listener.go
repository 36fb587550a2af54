package worker

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
	"github.com/agentfleet/agentfleet/worker/internal/eventpub"
)

// listener turns the agent's events into the run's wire envelopes. The
// agent calls it one event at a time, so its own state needs no lock. A
// full publish window blocks it, and so the agent (back-pressure).
type listener struct {
	r *run
	// seqs of the events this agent run and this turn published, for the
	// agent_end and turn_end references.
	msgSeqs          []uint64
	toolSeqs         []uint64
	lastAssistantSeq uint64
	// transcriptBytes is the size of the messages this attempt put into
	// the transcript (their message_end events), and those it continues.
	transcriptBytes int
}

// scratchMax bounds the buffers scratchPool keeps.
const scratchMax = 4 << 10

// scratchPool lends the buffers events are encoded into. The publisher
// copies an event into its envelope, so a buffer goes back at once and no
// run keeps one while it waits (one kept per run was part of a waiting
// run's heap: docs/benchmarks/2026-12.md, 2026-12-02 afternoon).
type scratchPool struct{ p sync.Pool }

func (s *scratchPool) get() *[]byte {
	if b, ok := s.p.Get().(*[]byte); ok {
		return b
	}
	return new([]byte)
}

func (s *scratchPool) put(b *[]byte) {
	if cap(*b) <= scratchMax {
		*b = (*b)[:0]
		s.p.Put(b)
	}
}

var errOverBudget = errors.New("the run is over one of its bounds")

func (l *listener) onEvent(_ context.Context, ev agent.Event) error {
	r := l.r
	switch ev.Type {
	case agent.EventToolExecutionStart:
		r.toolBusy(1) // waiting.go: a waiting run leaves its slot only when no call runs
	case agent.EventToolExecutionEnd:
		defer r.toolBusy(-1)
	}
	switch ev.Type {
	case agent.EventAgentStart:
		l.msgSeqs = l.msgSeqs[:0]
	case agent.EventTurnStart:
		l.toolSeqs = l.toolSeqs[:0]
	}
	var refs workerproto.Refs
	var ctlSeq uint64
	interrupted := false
	switch ev.Type {
	case agent.EventMessageStart:
		ctlSeq = r.ctl.seqOf(ev.Message, false)
	case agent.EventMessageEnd:
		ctlSeq = r.ctl.seqOf(ev.Message, true)
		interrupted = r.cutOff(ev.Message)
		if u := r.strayCharge.Swap(nil); u != nil && ev.Message != nil && ev.Message.Role == agent.RoleAssistant && ev.Message.Usage == (agent.Usage{}) {
			// The agent's message for a call it stopped reading: the
			// call's charge (observeStream).
			m := *ev.Message
			m.Usage = *u
			ev.Message = &m
		}
	case agent.EventToolExecutionEnd:
		// Recovery takes a call's result from here when its toolResult
		// message was not stored: not a result the stop cut off.
		interrupted = r.cutOff(&agent.Message{Role: agent.RoleToolResult, IsError: ev.IsError})
	case agent.EventTurnEnd:
		refs.MessageSeq = l.lastAssistantSeq
		refs.ToolResultSeqs = lastN(l.toolSeqs, len(ev.ToolResults))
	case agent.EventAgentEnd:
		refs.MessageSeqs = lastN(l.msgSeqs, len(ev.Messages))
	}
	buf := r.w.scratch.get()
	defer r.w.scratch.put(buf)
	data, err := workerproto.AppendAgentEvent((*buf)[:0], &ev, refs)
	*buf = data
	if err != nil {
		return err
	}
	if err := l.checkBounds(ev.Type, len(data)); err != nil {
		return err
	}
	seq, err := r.pub.Event(string(ev.Type), data, eventpub.Options{ControlSeq: ctlSeq, Interrupted: interrupted})
	if err != nil {
		var tl *eventpub.EventTooLargeError
		if errors.As(err, &tl) {
			r.tally.EventTooLarge(err)
			r.log.Error("event too large for NATS; failing the run", "err", err)
		}
		return err
	}
	switch ev.Type {
	case agent.EventMessageEnd:
		l.msgSeqs = append(l.msgSeqs, seq)
		switch ev.Message.Role {
		case agent.RoleToolResult:
			l.toolSeqs = append(l.toolSeqs, seq)
		case agent.RoleAssistant:
			l.lastAssistantSeq = seq
			r.tally.Assistant(*ev.Message)
		}
	case agent.EventTurnEnd:
		r.tally.Turn()
		r.w.obs.Turn(r.info())
	}
	return nil
}

// checkBounds enforces the run's event budget and transcript bound before
// an agent event is published. Past either, nothing more of the agent is
// published and the run stops; its finish events are not counted.
func (l *listener) checkBounds(typ agent.EventType, size int) error {
	r := l.r
	cfg := &r.w.cfg
	if r.tally.OverBudgetAlready() {
		return errOverBudget
	}
	n, b := r.pub.Spent()
	switch {
	case n >= cfg.MaxRunEvents:
		r.overBudget(bus.ReasonEventBudget, fmt.Sprintf("the run published %d events, the budget is %d (--max-run-events)", n, cfg.MaxRunEvents))
		return errOverBudget
	case b+int64(size) > cfg.MaxRunEventBytes:
		r.overBudget(bus.ReasonEventBudget, fmt.Sprintf("the run's events would exceed %d bytes, the budget (--max-run-event-bytes)", cfg.MaxRunEventBytes))
		return errOverBudget
	}
	if typ == agent.EventMessageEnd {
		l.transcriptBytes += size
		if l.transcriptBytes > cfg.MaxTranscriptBytes {
			r.overBudget(bus.ReasonTranscriptTooLarge, fmt.Sprintf("the run's transcript exceeds %d bytes (--max-transcript-bytes)", cfg.MaxTranscriptBytes))
			return errOverBudget
		}
	}
	return nil
}

// cutOff reports whether a message ends because the worker is stopping
// (drain timeout, lost lease, events not stored) rather than by the user's
// abort or a limit: an aborted assistant message, or a tool result that
// failed. Its message_end is marked interrupted, so recovery drops it and
// the next attempt regenerates it.
func (r *run) cutOff(m *agent.Message) bool {
	if m == nil {
		return false
	}
	switch {
	case m.Role == agent.RoleAssistant && m.StopReason == agent.StopReasonAborted:
	case m.Role == agent.RoleToolResult && m.IsError:
	default:
		return false
	}
	if r.tally.Aborted() {
		return false
	}
	return r.w.hardCtx.Err() != nil || r.lease.Lost() || r.tally.PublishErr() != nil
}

func lastN(s []uint64, n int) []uint64 {
	n = min(n, len(s))
	if n <= 0 {
		return nil
	}
	return append([]uint64(nil), s[len(s)-n:]...)
}

// observeStream reports each model call to the observer and counts its
// charge (settle.go) in the run's usage: the call's meter starts here, the
// outermost wrapper, and is read once the call is over, final event or
// not.
func (r *run) observeStream(fn agent.StreamFn, name string) agent.StreamFn {
	return func(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			start := time.Now()
			var first time.Duration
			var final *agent.Message
			ctx, _ := r.withCallMeter(ctx)
			r.strayCharge.Store(nil)
			defer func() {
				s := chargeOf(ctx, final)
				if final == nil && s.Source == "" {
					return // nothing was asked of a model
				}
				if final == nil {
					// The agent stopped reading before the final event:
					// the message it makes instead carries the charge.
					u := s.Usage
					r.strayCharge.Store(&u)
				}
				// Only this run's model calls count toward its usage.
				r.tally.ModelCall(s.Usage)
				mr := ModelRequest{Model: name, Duration: time.Since(start), TimeToFirstEvent: first,
					Usage: s.Usage, UsageSource: s.Source, ExcessInput: s.ExcessInput, ExcessOutput: s.ExcessOutput}
				if final != nil {
					mr.StopReason = final.StopReason
				} else {
					mr.StopReason = agent.StopReasonAborted
				}
				r.w.obs.ModelRequest(r.info(), mr)
			}()
			for ev := range fn(ctx, model, llm, opts) {
				if first == 0 {
					first = time.Since(start)
				}
				if ev.Type == agent.StreamError && ev.Message != nil && len(ev.Message.ErrorMessage) > bus.MaxErrorBytes {
					// A model's error text is bounded before it reaches
					// the transcript, the events and the record.
					m := *ev.Message
					m.ErrorMessage = clipString(m.ErrorMessage, bus.MaxErrorBytes)
					ev.Message = &m
				}
				if (ev.Type == agent.StreamDone || ev.Type == agent.StreamError) && ev.Message != nil {
					final = ev.Message
				}
				if !yield(ev) {
					return
				}
			}
		}
	}
}
