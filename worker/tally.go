package worker

import (
	"fmt"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// tally counts what a run did (turns, usage, its last answer) and why it
// stops (abort, limit, an event too large, a failed publish): together
// they make the run's outcome. The agent's listener, the control owner,
// the publisher and the heartbeat all write to it, hence the lock; it is
// never held across a call out.
type tally struct {
	mu            sync.Mutex
	turns         int
	usage         agent.Usage
	lastAssistant *agent.Message
	abortReason   *string
	limitReason   string
	limitText     string
	tooLarge      error
	pubErr        error
}

// assistant counts an assistant message (its usage, and it is the last
// answer so far).
func (t *tally) assistant(m agent.Message) {
	t.mu.Lock()
	t.usage.Add(m.Usage)
	t.lastAssistant = &m
	t.mu.Unlock()
}

func (t *tally) turn() {
	t.mu.Lock()
	t.turns++
	t.mu.Unlock()
}

// restore counts the assistant messages a resumed attempt restored; it
// returns the turns so far.
func (t *tally) restore(msgs []agent.Message) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range msgs {
		if m := msgs[i]; m.Role == agent.RoleAssistant {
			t.turns++
			t.usage.Add(m.Usage)
			t.lastAssistant = &m
		}
	}
	return t.turns
}

func (t *tally) counts() (int, agent.Usage) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.turns, t.usage
}

// abort records the user's abort; only the first reason counts.
func (t *tally) abort(reason string) {
	t.mu.Lock()
	if t.abortReason == nil {
		t.abortReason = &reason
	}
	t.mu.Unlock()
}

func (t *tally) aborted() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.abortReason != nil
}

func (t *tally) eventTooLarge(err error) {
	t.mu.Lock()
	if t.tooLarge == nil {
		t.tooLarge = err
	}
	t.mu.Unlock()
}

// publishFailed records the first failed publish: the attempt is handed
// back.
func (t *tally) publishFailed(err error) {
	t.mu.Lock()
	if t.pubErr == nil {
		t.pubErr = err
	}
	t.mu.Unlock()
}

func (t *tally) publishErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pubErr
}

// stopping reports whether the run must not go on (abort, limit, failure).
func (t *tally) stopping() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.abortReason != nil || t.limitReason != "" || t.tooLarge != nil || t.pubErr != nil
}

func (t *tally) modelFailed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.lastAssistant
	return m != nil && (m.StopReason == agent.StopReasonError || m.StopReason == agent.StopReasonAborted)
}

// overLimit checks maxTurns and maxTotalTokens when the agent wants
// another turn, and records the limit it reached.
func (t *tally) overLimit(l bus.Limits) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.turns >= l.MaxTurns:
		t.limitReason = bus.ReasonMaxTurns
		t.limitText = fmt.Sprintf("the run reached its limit of %d turns while the model wanted another", l.MaxTurns)
		return true
	case l.MaxTotalTokens > 0 && t.usage.TotalTokens >= l.MaxTotalTokens:
		t.limitReason = bus.ReasonTokenBudget
		t.limitText = fmt.Sprintf("the run used %d tokens, its budget is %d", t.usage.TotalTokens, l.MaxTotalTokens)
		return true
	}
	return false
}

// outcome is the run's run_finished.
func (t *tally) outcome(runErr error, timedOut bool, timeout time.Duration, runStart time.Time) bus.RunFinished {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded, Usage: t.usage,
		Cost: t.usage.Cost.Total, Turns: t.turns, DurationMs: time.Since(runStart).Milliseconds()}
	fail := func(reason, text string) { f.Status, f.Reason, f.Error = bus.StatusFailed, reason, text }
	switch {
	case t.abortReason != nil:
		f.Status, f.Reason, f.Error = bus.StatusAborted, bus.ReasonAbortedByUser, *t.abortReason
		if f.Error == "" {
			f.Error = "aborted by user"
		}
	case timedOut:
		fail(bus.ReasonTimeout, fmt.Sprintf("the run exceeded its timeout of %s", timeout))
	case t.tooLarge != nil:
		fail(bus.ReasonEventTooLarge, t.tooLarge.Error())
	case t.limitReason != "":
		fail(t.limitReason, t.limitText)
	case runErr != nil:
		fail(bus.ReasonInternal, runErr.Error())
	case t.lastAssistant != nil && (t.lastAssistant.StopReason == agent.StopReasonError || t.lastAssistant.StopReason == agent.StopReasonAborted):
		fail(bus.ReasonModelError, t.lastAssistant.ErrorMessage)
	}
	return f
}
