package giveup

import (
	"testing"

	"github.com/agentfleet/agentfleet/bus"
)

// The give-up's decision, from the record alone (worker/giveup.go's steps).
func TestClassifyGiveUp(t *testing.T) {
	running := func(reqSeq uint64, attempt int) *bus.RunRecord {
		return &bus.RunRecord{State: bus.StateRunning, RequestSeq: reqSeq, Attempt: attempt}
	}
	finished := &bus.RunRecord{State: bus.StatusSucceeded, RequestSeq: 7, Attempt: 2}
	requeued := running(7, 3)
	requeued.Requeue = &bus.Requeue{From: 7, AttemptBase: 2}
	copyTook := running(9, 3)
	copyTook.Requeue = &bus.Requeue{From: 7, AttemptBase: 2}
	waiting := running(7, 2)
	waiting.WaitingHandBacks = 4
	crashed := running(7, 2)
	crashed.WaitingHandBacks = 1
	copyNeverTook := running(7, 1)
	copyNeverTook.Requeue = &bus.Requeue{From: 7, AttemptBase: 3}
	for _, tc := range []struct {
		name         string
		rec          *bus.RunRecord
		reqSeq, from uint64
		want         Decision
	}{
		{"no record", nil, 7, 0, Decision{Action: DeadLetter, Attempt: 6}},
		{"finished, its ack lost", finished, 7, 0, Decision{Action: Finished}},
		{"finished by another request", finished, 8, 0, Decision{Action: DeadLetter, Attempt: 6}},
		{"requeued, the copy not bound yet", requeued, 7, 0, Decision{Action: Republish, Base: 2}},
		{"requeued, the copy took the run", copyTook, 7, 0, Decision{Action: Remove}},
		{"waiting hand-backs", waiting, 7, 0, Decision{Action: Requeue, Crashes: 1}},
		{"crashes reached MaxDeliver", crashed, 7, 0, Decision{Action: DeadLetter, Crashes: 4, MaxedOut: true, Attempt: 6}},
		{"held by another request", running(9, 1), 7, 0, Decision{Action: HeldByAnother}},
		{"a copy that never took the run", copyNeverTook, 8, 7, Decision{Action: DeadLetter, Base: 3, CopyOf: 7, Attempt: 9}},
		{"a give-up retried after its lease", running(7, 9), 7, 0, Decision{Action: DeadLetter, Attempt: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Classify(tc.rec, tc.reqSeq, tc.from, 5, 3); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
