package outcome

import (
	"errors"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// A run's outcome: the first reason it stopped wins, in the order an
// abort, its timeout, an event too large, a per-run bound, a limit, an
// internal error, then the model's own error.
func TestOutcomeTakesTheFirstReason(t *testing.T) {
	for _, tc := range []struct {
		name       string
		tally      func(*Tally)
		runErr     error
		timedOut   bool
		status     string
		reason     string
		errorTexts string
	}{
		{"succeeded", func(*Tally) {}, nil, false, bus.StatusSucceeded, "", ""},
		{"aborted before a timeout", func(t *Tally) { t.Abort("stop") }, nil, true, bus.StatusAborted, bus.ReasonAbortedByUser, "stop"},
		{"aborted without a reason", func(t *Tally) { t.Abort("") }, nil, false, bus.StatusAborted, bus.ReasonAbortedByUser, "aborted by user"},
		{"timed out before a limit", func(t *Tally) { t.Limit(bus.ReasonMaxTurns, "turns") }, nil, true, bus.StatusFailed, bus.ReasonTimeout, "the run exceeded its timeout of 1m0s"},
		{"a limit before an internal error", func(t *Tally) { t.Limit(bus.ReasonMaxTurns, "turns") }, errors.New("x"), false, bus.StatusFailed, bus.ReasonMaxTurns, "turns"},
		{"an internal error", func(*Tally) {}, errors.New("broken"), false, bus.StatusFailed, bus.ReasonInternal, "broken"},
		{"the model's error", func(t *Tally) {
			t.Assistant(agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonError, ErrorMessage: "500"})
		}, nil, false, bus.StatusFailed, bus.ReasonModelError, "500"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tl Tally
			tc.tally(&tl)
			f := tl.Outcome(tc.runErr, tc.timedOut, time.Minute, time.Now())
			if f.Status != tc.status || f.Reason != tc.reason || f.Error != tc.errorTexts {
				t.Fatalf("got %s/%s %q, want %s/%s %q", f.Status, f.Reason, f.Error, tc.status, tc.reason, tc.errorTexts)
			}
		})
	}
}
