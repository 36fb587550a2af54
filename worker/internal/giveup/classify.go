// Package giveup decides what a give-up does with a request whose
// deliveries ran out (a MAX_DELIVERIES advisory), from the run's record
// alone; the worker (worker/giveup.go) does the I/O.
package giveup

import "github.com/agentfleet/agentfleet/bus"

// Action is what a give-up does with a request whose deliveries ran
// out (the steps in worker/giveup.go).
type Action int

const (
	// Finished: the run finished (only the ack was lost): publish a
	// run_finished the events lack, then remove the request.
	Finished Action = iota + 1
	// Republish: requeued already (this step retried), the copy
	// has not taken the run: publish it again (its message id drops a
	// second one). Never a dead letter: the run lives on in the copy.
	Republish
	// Remove: requeued already and the copy took the run: only the
	// old request goes.
	Remove
	// HeldByAnother: the record is another request's (a reused id),
	// whose run is live: no dead letter for a live run.
	HeldByAnother
	// Requeue: deliveries went to waiting hand-backs: requeue a copy.
	Requeue
	// DeadLetter: dead-letter the request, then fail the run under
	// its lease (unless finished), then remove the request.
	DeadLetter
)

// Decision is Classify's answer.
type Decision struct {
	Action   Action
	Base     int    // the attempts the requests this one replaced used
	CopyOf   uint64 // the request this one is the copy of, which never took the run; 0: none
	Crashes  int    // deliveries that were not waiting hand-backs, over every requeue
	MaxedOut bool   // those reached MaxDeliver, though the run waited
	Attempt  int    // the give-up's own attempt (DeadLetter)
}

// Classify decides a give-up from the run's record (nil: none), the
// request's stream sequence, the request it says it is a requeued copy of
// (0: none), its deliveries and the consumer's MaxDeliver. It does no I/O:
// the worker's giveUp acts on it.
func Classify(rec *bus.RunRecord, reqSeq, requeuedFrom uint64, deliveries, maxDeliver int) Decision {
	var d Decision
	// base: the attempts the requests this one replaced used, as the
	// record's requeue marker says (never the request's headers alone).
	if rec != nil && rec.Requeue != nil {
		switch {
		case rec.RequestSeq == reqSeq:
			d.Base = rec.Requeue.AttemptBase
		case requeuedFrom == rec.Requeue.From && rec.RequestSeq == requeuedFrom:
			d.Base, d.CopyOf = rec.Requeue.AttemptBase, requeuedFrom // the copy never took the run
		}
	}
	switch {
	case rec != nil && rec.Finished() && (rec.RequestSeq == 0 || rec.RequestSeq == reqSeq || d.CopyOf != 0):
		d.Action = Finished
		return d
	case rec != nil && rec.Requeue != nil && rec.Requeue.From == reqSeq:
		d.Action = Remove
		if rec.RequestSeq == reqSeq && !rec.Finished() {
			d.Action = Republish
		}
		return d
	}
	if rec != nil && !rec.Finished() && rec.RequestSeq == reqSeq && rec.WaitingHandBacks > 0 {
		// Only deliveries that did not end in a waiting hand-back count
		// against MaxDeliver, over every requeue of the run.
		d.Crashes = max(deliveries-rec.WaitingHandBacks, 0)
		if rec.Requeue != nil {
			d.Crashes += rec.Requeue.Crashes
		}
		if d.Crashes < maxDeliver {
			d.Action = Requeue
			return d
		}
		d.MaxedOut = true
	}
	if rec != nil && !rec.Finished() && rec.RequestSeq != 0 && rec.RequestSeq != reqSeq && d.CopyOf == 0 {
		d.Action = HeldByAnother
		return d
	}
	// A delivery's attempt is at most base+deliveries, so a record naming
	// base+deliveries+1 was written by a give-up of this request that
	// failed later on (a read, a publish): this one goes on with that
	// attempt, its events so far dropped as copies by their message ids.
	d.Action, d.Attempt = DeadLetter, d.Base+deliveries+1
	if rec != nil && d.Attempt < rec.Attempt {
		d.Attempt = rec.Attempt + 1
	}
	return d
}
