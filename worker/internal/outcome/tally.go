// Package outcome counts what a run did and why it stops, and makes its
// run_finished from that.
package outcome

import (
	"fmt"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/metering"
)

// Tally counts what a run did (turns, usage, its last answer) and why it
// stops (abort, limit, an event too large, a failed publish): together
// they make the run's outcome. The agent's listener, the control owner,
// the publisher and the heartbeat all write to it, hence the lock; it is
// never held across a call out.
type Tally struct {
	mu            sync.Mutex
	turns         int
	usage         agent.Usage
	lastAssistant *agent.Message
	abortReason   *string
	abortCode     string // the reason code of an abort not by a user ("": aborted_by_user)
	limitReason   string
	limitText     string
	tooLarge      error
	budgetReason  string // a per-run bound was crossed (events, controls, transcript)
	budgetText    string
	pubErr        error
}

// Assistant records an assistant message as the last answer so far. Its
// usage is not counted here: the prompt's assistant messages are the
// submitter's, and their usage is whatever the submitter wrote.
func (t *Tally) Assistant(m agent.Message) {
	t.mu.Lock()
	t.lastAssistant = &m
	t.mu.Unlock()
}

// ModelCall counts the usage of one of this run's model calls.
func (t *Tally) ModelCall(u agent.Usage) {
	t.mu.Lock()
	t.usage.Add(metering.NonNegative(u))
	t.mu.Unlock()
}

// Carry counts the usage of model calls earlier attempts were charged for
// and whose messages the run no longer has (cut off): no turns.
func (t *Tally) Carry(u agent.Usage) {
	t.mu.Lock()
	t.usage.Add(metering.NonNegative(u))
	t.mu.Unlock()
}

func (t *Tally) Turn() {
	t.mu.Lock()
	t.turns++
	t.mu.Unlock()
}

// Restore counts the assistant messages a resumed attempt restored; it
// returns the turns so far.
func (t *Tally) Restore(msgs []agent.Message) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range msgs {
		if m := msgs[i]; m.Role == agent.RoleAssistant {
			t.turns++
			t.usage.Add(metering.NonNegative(m.Usage))
			t.lastAssistant = &m
		}
	}
	return t.turns
}

func (t *Tally) Counts() (int, agent.Usage) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.turns, t.usage
}

// Abort records the user's abort; only the first reason counts.
func (t *Tally) Abort(reason string) {
	t.mu.Lock()
	if t.abortReason == nil {
		t.abortReason = &reason
	}
	t.mu.Unlock()
}

// AbortWith aborts the run with a reason code other than aborted_by_user
// (approval_timeout).
func (t *Tally) AbortWith(code, text string) {
	t.mu.Lock()
	if t.abortReason == nil {
		t.abortReason, t.abortCode = &text, code
	}
	t.mu.Unlock()
}

func (t *Tally) Aborted() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.abortReason != nil
}

func (t *Tally) EventTooLarge(err error) {
	t.mu.Lock()
	if t.tooLarge == nil {
		t.tooLarge = err
	}
	t.mu.Unlock()
}

// OverBudget records the first per-run bound the run crossed; it reports
// whether this was the first.
func (t *Tally) OverBudget(reason, text string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.budgetReason != "" {
		return false
	}
	t.budgetReason, t.budgetText = reason, text
	return true
}

func (t *Tally) OverBudgetAlready() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.budgetReason != ""
}

// PublishFailed records the first failed publish: the attempt is handed
// back.
func (t *Tally) PublishFailed(err error) {
	t.mu.Lock()
	if t.pubErr == nil {
		t.pubErr = err
	}
	t.mu.Unlock()
}

func (t *Tally) PublishErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pubErr
}

// Stopping reports whether the run must not go on (abort, limit, failure).
func (t *Tally) Stopping() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.abortReason != nil || t.limitReason != "" || t.tooLarge != nil || t.pubErr != nil ||
		t.budgetReason != ""
}

func (t *Tally) ModelFailed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.lastAssistant
	return m != nil && (m.StopReason == agent.StopReasonError || m.StopReason == agent.StopReasonAborted)
}

// OverLimit checks maxTurns and maxTotalTokens when the agent wants
// another turn, and records the limit it reached.
func (t *Tally) OverLimit(l bus.Limits) bool {
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

// Outcome is the run's run_finished; its Error is the caller's to bound.
func (t *Tally) Outcome(runErr error, timedOut bool, timeout time.Duration, runStart time.Time) bus.RunFinished {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded, Usage: t.usage,
		Cost: t.usage.Cost.Total, Turns: t.turns, DurationMs: time.Since(runStart).Milliseconds()}
	fail := func(reason, text string) { f.Status, f.Reason, f.Error = bus.StatusFailed, reason, text }
	switch {
	case t.abortReason != nil:
		f.Status, f.Reason, f.Error = bus.StatusAborted, bus.ReasonAbortedByUser, *t.abortReason
		if t.abortCode != "" {
			f.Reason = t.abortCode
		}
		if f.Error == "" {
			f.Error = "aborted by user"
		}
	case timedOut:
		fail(bus.ReasonTimeout, fmt.Sprintf("the run exceeded its timeout of %s", timeout))
	case t.tooLarge != nil:
		fail(bus.ReasonEventTooLarge, t.tooLarge.Error())
	case t.budgetReason != "":
		fail(t.budgetReason, t.budgetText)
	case t.limitReason != "":
		fail(t.limitReason, t.limitText)
	case runErr != nil:
		fail(bus.ReasonInternal, runErr.Error())
	case t.lastAssistant != nil && (t.lastAssistant.StopReason == agent.StopReasonError || t.lastAssistant.StopReason == agent.StopReasonAborted):
		fail(bus.ReasonModelError, t.lastAssistant.ErrorMessage)
	}
	return f
}

// Limit records the first limit the run reached; it reports whether it
// is now stopped by one.
func (t *Tally) Limit(reason, text string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.limitReason == "" {
		t.limitReason, t.limitText = reason, text
	}
	return true
}

func (t *Tally) LimitState() (reason, text string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.limitReason, t.limitText
}
