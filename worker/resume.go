package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
	"github.com/agentfleet/agentfleet/worker/internal/eventpub"
	"github.com/agentfleet/agentfleet/worker/internal/metering"
)

var errAlreadyFinished = errors.New("the run already has its run_finished")

// resume restores what earlier attempts put into the run's transcript:
// the events stored before this attempt's run_started, folded by the
// readers' reducer (workerproto.Recover), without the tail a stopping worker cut
// off, plus an error result for every tool call left without one. It
// publishes run_resumed (and the synthetic tool results) and reports
// whether a transcript was restored; if not (nothing stored, or the prompt
// itself incomplete) the run starts over with its prompt.
//
// Accounting: turns and usage start from the restored assistant messages
// (those after the prompt), so maxTurns and maxTotalTokens bound the whole
// run; the usage also counts the calls earlier attempts were charged for
// whose messages were cut off (run_resumed's cutOffUsage: their charge,
// settle.go), not their turns. The timeout counts from the first attempt's
// start (r.runStart).
func (r *run) resume(ctx context.Context) (bool, error) {
	envs, err := r.earlierEvents(ctx)
	if err != nil {
		return false, err
	}
	r.traceEarlierAttempts(envs)
	// The event budget spans attempts: a redelivery does not renew it.
	r.pub.Charge(envs)
	rc := workerproto.Recover(envs, time.Now().UnixMilli())
	// New calls get none of these keys, also when nothing is restored
	// (internal/callkey, invariant 1).
	r.earlier.usedCallKeys = rc.UsedKeys
	if rc.Finished != nil {
		return false, errAlreadyFinished
	}
	msgs := rc.Messages
	// A continuation's prior messages are not in the events (1.9), unless
	// an earlier attempt of an older worker published them (continuation.go).
	var base []agent.Message
	promptLen := len(r.prompt)
	if p := r.prior; p != nil {
		if restoredByReference(envs) || len(msgs) == 0 {
			base = p.msgs
		} else {
			p.inEvents = true
			promptLen += len(p.msgs)
		}
	}
	if len(msgs) < promptLen {
		msgs = nil // the prompt itself was cut short: start over
	}
	cut := cutOffUsage(rc, promptLen)
	resumed := bus.RunResumed{Type: bus.EventRunResumed, Attempt: r.attempt, MessagesRestored: len(msgs)}
	if cut != (agent.Usage{}) {
		resumed.CutOffUsage = &cut
	}
	if _, err := r.pub.Fleet(bus.EventRunResumed, resumed); err != nil {
		return false, err
	}
	// Calls cut off by earlier attempts were charged, and so were their
	// summary calls (compaction_end's usage, in no message): the run's
	// usage and cost count them, whether or not the transcript is restored.
	lastCompaction, scripted, compacts, summaries := compactionsIn(rc.Compactions)
	r.tally.Carry(cut)
	r.tally.Carry(summaries)
	if len(msgs) == 0 {
		r.log.Info("resume: nothing to restore; starting over", "eventsRead", len(envs))
		return false, nil
	}
	all := append(append(make([]agent.Message, 0, len(base)+len(msgs)+len(rc.Synthetic)), base...), msgs...)
	synthetic := r.takeChildCalls(rc.Synthetic, msgs) // worker/children.go
	for i := range synthetic {
		m := synthetic[i]
		for _, typ := range []agent.EventType{agent.EventMessageStart, agent.EventMessageEnd} {
			data, err := agent.MarshalJSON(bus.AgentEvent{Type: string(typ), Message: &m})
			if err != nil {
				return false, err
			}
			if _, err := r.pub.Event(string(typ), data, eventpub.Options{}); err != nil {
				return false, err
			}
		}
		all = append(all, m)
	}
	// A compacted run goes on from its compacted context (compaction.go).
	if r.comp != nil {
		all = r.comp.restore(lastCompaction, all)
	} else {
		// Without a window here (no compactor), still not the full
		// transcript: the model was past its window with it.
		all = bus.CompactedContext(all, lastCompaction)
	}
	r.agent.SetMessages(all)
	r.ctl.skip(compacts)
	if r.comp != nil {
		for _, seq := range compacts {
			r.comp.answered(seq)
		}
	}
	r.ctl.skip(rc.ControlSeqs)
	r.ctl.skip(rc.AnsweredSeqs)
	r.takeOverPending(rc.Pending, rc.Deferred) // worker/approval.go
	r.gate.calls.restoreResolved(rc.Resolved)
	turns := r.tally.Restore(msgs[promptLen:])
	if r.fauxSkip != nil {
		r.fauxSkip(turns + scripted)
	}
	r.log.Info("resumed", "fromAttempt", rc.Attempt, "messagesRestored", len(msgs), "dropped", rc.Dropped,
		"partialDropped", rc.Partial, "syntheticToolResults", len(rc.Synthetic), "controlsDelivered", len(rc.ControlSeqs),
		"approvalsPending", len(rc.Pending), "deferredCalls", len(rc.Deferred),
		"turns", turns)
	return true, nil
}

// cutOffUsage is what earlier attempts were charged for model calls that
// the restored transcript leaves out: the usage the view's run_resumed
// carried, plus that of the assistant messages this resume drops that are
// the run's (after its prompt: usage written into submitted messages is
// not the run's).
func cutOffUsage(rc *workerproto.Recovery, promptLen int) agent.Usage {
	u := metering.NonNegative(rc.CutOffUsage)
	kept := len(rc.Messages)
	for i, m := range rc.DroppedMessages {
		if kept+i >= promptLen && m.Role == agent.RoleAssistant {
			u.Add(metering.NonNegative(m.Usage))
		}
	}
	return u
}

// earlierEvents are the run's events before this attempt's: its wake's
// parked state (parkstate.go), else those stored before its run_started.
func (r *run) earlierEvents(ctx context.Context) ([]*bus.Envelope, error) {
	if r.stateEnvs != nil {
		return stateEvents(r.stateEnvs), nil
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	startSeq, err := r.pub.StartedAt(rctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("run_started not stored: %w", err)
	}
	// Not within rctx: the read may wait behind others (internal/eventread).
	return r.w.reads.Read(ctx, r.id, startSeq)
}
