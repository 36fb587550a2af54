// Package lease holds an attempt's lease on its run: the run record,
// written with compare-and-set (see below).
package lease

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/natserr"
)

// The run record is the run's lease. An attempt takes it with a KV
// compare-and-set (Create, or Update on the revision it read) before it
// publishes anything, renews it with a compare-and-set at every heartbeat,
// and writes the final record with one last compare-and-set before
// run_finished. Any other attempt taking it makes the holder's next
// compare-and-set fail: the holder then stops at once and publishes
// nothing more. A lower attempt never takes it from a higher one: take
// refuses to write over a record whose attempt is higher than its own,
// whoever calls it (a pickup, a refusal, a give-up), so the attempt a
// record names never falls and readers, which drop envelopes of a lower
// attempt, see the run's end.
//
// A request takes over a record of another request only when it is that
// request's requeued copy: the record carries the give-up's requeue
// marker naming the request the copy replaces (giveup.go). A request
// whose own seq the marker names has been replaced and takes nothing.
//
// A request takes over a parked record only when it is a wake of that
// park: a copy of the parked request naming the record's parked.seq
// (worker/internal/park). The take clears parked, so one wake runs.
//
// A first delivery of a plain request (attempt 1, no requeue headers)
// does not read the record at pickup: almost always there is none, and
// the read is a round trip on every run's critical path. It takes the
// lease with Create. If a record exists, Create fails and take reads it:
// one the attempt may not take (finished, another request's, a newer
// attempt's) is refused with the outcome a read at pickup would have
// given, only later: after the request was planned and its tenant
// checked, so such a refusal may carry the request's model and tools. One
// it may take (a consumer recreated, so delivery counts began again) is
// handed back (Unread), and the redelivery, attempt 2, reads it at
// pickup as every later attempt does, so nothing the pickup takes from a
// record (the first start, the time waited, a wait in progress) is lost.
// The hand-back costs a delivery (the give-up counts it as a crash), so
// a queue whose consumer allows fewer than 3 deliveries always reads. The
// worker reads the consumer's setting at its start and every 10 s after
// (worker/pickupread.go).
//
// One goroutine writes at a time, so no lock is held over a KV call: the
// run's goroutine takes the lease, then the heartbeat renews it, then the
// heartbeat stops renewing (it goes on sending InProgress) and the run's
// goroutine writes the final record. The final write retries transient
// errors within the finish's deadline; a permanent one (a record too
// large for the bucket) fails at once.

// Outcome is what a take found.
type Outcome int

const (
	Taken    Outcome = iota
	Finished         // the run has finished (the record is final)
	Newer            // a newer attempt owns the run
	Reused           // the record belongs to another request with this id
	Unread           // a record the pickup did not read: hand the request back
)

// ErrLost: another attempt owns the run (the lease's compare-and-set
// failed); the attempt publishes nothing more.
var ErrLost = errors.New("the run's lease was lost: another attempt owns it")

// Env is what a hold needs of its worker.
type Env struct {
	KV     jetstream.KeyValue // the run records
	Worker string             // this worker's id: its own writes carry it
	// Read reads a run's record with its revision (jetstream.ErrKeyNotFound:
	// none).
	Read func(ctx context.Context, id string) (*bus.RunRecord, error)
	// Index is the waiting-run index (bus/waiting_index.go); nil: none.
	Index Index
}

// Index writes the waiting-run index; *bus.Client is one.
type Index interface {
	PutWaiting(ctx context.Context, rec *bus.RunRecord, ifAbsent bool) error
	DropWaiting(ctx context.Context, queue, run string) error
}

// Hold is one attempt's hold on its run record.
type Hold struct {
	env     *Env
	id      string
	attempt int
	reqSeq  uint64
	onLost  func() // called once, when another attempt takes the lease

	// RequeuedFrom is the request this one replaced (a requeue of a
	// waiting run, worker/giveup.go): its record is this run's. Set
	// before the first take.
	RequeuedFrom uint64
	// WokenFrom is the park (the record's parked.seq) this request wakes
	// (worker/internal/park): the parked record is this run's. Set
	// before the first take.
	WokenFrom uint64
	// Unread: the pickup did not read the record (see the top); cleared
	// by the first take.
	Unread bool

	rev  uint64 // the revision this attempt wrote last; see the ordering above
	done bool   // the final record is written
	lost atomic.Bool

	// idxFor is what the waiting index holds for the run ("": no entry)
	// as far as this hold knows; idxKnown is false while unsure (a take
	// of a waiting run's record, a failed index write).
	idxFor   string
	idxKnown bool
}

// New is attempt's hold on run id's record, for the request at stream
// sequence reqSeq; onLost (may be nil) is called once if another attempt
// takes it.
func New(env *Env, id string, attempt int, reqSeq uint64, onLost func()) *Hold {
	return &Hold{env: env, id: id, attempt: attempt, reqSeq: reqSeq, onLost: onLost}
}

// Lost reports whether another attempt took the lease.
func (l *Hold) Lost() bool { return l.lost.Load() }

// Written reports whether this attempt wrote the record (took the lease).
func (l *Hold) Written() bool { return l.rev != 0 }

// IsConflict tells a compare-and-set that lost to another write.
func IsConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// Classify says whether this attempt may take a run whose record is cur.
func (l *Hold) Classify(cur *bus.RunRecord) Outcome {
	switch {
	case cur.Finished():
		return Finished
	case cur.RequestSeq != 0 && cur.RequestSeq != l.reqSeq && !l.replaces(cur):
		return Reused
	case cur.Attempt > l.attempt:
		return Newer
	case cur.Requeue != nil && cur.Requeue.From == l.reqSeq:
		return Newer // this request was replaced by its requeued copy
	}
	return Taken
}

// replaces reports whether this attempt's request is the requeued copy of
// the request cur belongs to, as cur's requeue marker says.
func (l *Hold) replaces(cur *bus.RunRecord) bool {
	if l.WokenFrom != 0 && cur.Parked != nil && cur.Parked.Seq == l.WokenFrom {
		return true
	}
	return l.RequeuedFrom != 0 && cur.RequestSeq == l.RequeuedFrom && cur.Requeue != nil && cur.Requeue.From == l.RequeuedFrom
}

// Take writes rec over prev (nil: no record) with compare-and-set,
// re-reading and retrying while other attempts race. On Taken the
// attempt holds the lease; otherwise the current record is returned.
func (l *Hold) Take(ctx context.Context, prev, rec *bus.RunRecord) (Outcome, *bus.RunRecord, error) {
	data, err := agent.MarshalJSON(rec)
	if err != nil {
		return 0, nil, err
	}
	if prev != nil {
		if o := l.Classify(prev); o != Taken {
			return o, prev, nil
		}
	}
	unread := l.Unread && prev == nil
	l.Unread = false
	for range 8 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var rev uint64
		if prev == nil {
			rev, err = l.env.KV.Create(cctx, l.id, data)
		} else {
			rev, err = l.env.KV.Update(cctx, l.id, data, prev.Revision)
		}
		cancel()
		if err == nil {
			l.rev = rev
			l.done = rec.Finished()
			// A record that did not wait had no entry (one left by a crash
			// is stale, and readers drop it); one that waited may have it
			// or not (a crash between its write and the put).
			l.idxFor, l.idxKnown = "", true
			if prev != nil && prev.Waiting != nil {
				l.idxFor, l.idxKnown = prev.Waiting.For, false
			}
			l.syncIndex(ctx, rec)
			return Taken, nil, nil
		}
		if !IsConflict(err) {
			return 0, nil, fmt.Errorf("run record: %w", err)
		}
		cur, err := l.env.Read(ctx, l.id)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			prev = nil
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		if o := l.Classify(cur); o != Taken {
			return o, cur, nil
		}
		if unread {
			return Unread, cur, nil
		}
		prev = cur
	}
	return 0, nil, errors.New("run record: too many concurrent writers")
}

// ownWrite reports whether cur is a record this attempt wrote (a write
// whose ack was lost, e.g. across a reconnect). A record the give-up
// marked requeued keeps this attempt's fields but is not its write.
func (l *Hold) ownWrite(cur *bus.RunRecord) bool {
	return cur.Attempt == l.attempt && cur.Worker == l.env.Worker && cur.RequestSeq == l.reqSeq &&
		(cur.Requeue == nil || cur.Requeue.From != l.reqSeq)
}

// Renew is a heartbeat's write: a failure is retried at the next one.
func (l *Hold) Renew(ctx context.Context, rec *bus.RunRecord) error {
	return l.write(ctx, rec, false)
}

// WriteFinal is the last compare-and-set. It returns ErrLost when
// another attempt took the lease.
func (l *Hold) WriteFinal(ctx context.Context, rec *bus.RunRecord) error {
	return l.write(ctx, rec, true)
}

func (l *Hold) write(ctx context.Context, rec *bus.RunRecord, final bool) error {
	if l.done {
		return nil
	}
	if l.lost.Load() {
		return ErrLost
	}
	data, err := agent.MarshalJSON(rec)
	if err != nil {
		return err
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rev, err := l.env.KV.Update(cctx, l.id, data, l.rev)
		cancel()
		if err == nil {
			l.rev, l.done = rev, final
			l.syncIndex(ctx, rec)
			return nil
		}
		if !IsConflict(err) {
			if !final || ctx.Err() != nil || !transientKV(err) {
				return fmt.Errorf("run record: %w", err)
			}
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return fmt.Errorf("run record: %w", err)
			}
			continue
		}
		cur, gerr := l.env.Read(ctx, l.id)
		if gerr != nil && !errors.Is(gerr, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("run record: %w", gerr)
		}
		switch {
		case cur != nil && l.ownWrite(cur) && !cur.Finished():
			l.rev = cur.Revision // our own write, its ack lost: retry
			continue
		case cur != nil && l.ownWrite(cur) && final:
			l.done = true
			return nil
		}
		l.lose()
		return ErrLost
	}
}

// syncIndex makes the waiting index agree with rec, just written: an
// entry while the record says the run waits for what the index lists
// (bus.Indexed), none after. Invariants: the index is written only after
// the record (a reader checks the record, so an entry ahead of it would
// list a run that does not wait yet); it is written only when what it
// should hold changes (idxFor), not at every heartbeat; a failed write
// leaves idxKnown false, so the next record write (the next heartbeat)
// writes it again, and the final record's drop, after which no write
// comes, is retried within ctx (the finish's deadline; what is left the
// sweep removes, bus.Client.SweepWaiting). An entry already there is kept
// where it is (ifAbsent): its place is when the wait began.
func (l *Hold) syncIndex(ctx context.Context, rec *bus.RunRecord) {
	if l.env.Index == nil {
		return
	}
	want := ""
	if rec.State == bus.StateRunning && rec.Waiting != nil && bus.Indexed(rec.Waiting.For) {
		want = rec.Waiting.For
	}
	if l.idxKnown && l.idxFor == want {
		return
	}
	var err error
	for try := 0; ; try++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if want == "" {
			err = l.env.Index.DropWaiting(cctx, rec.Queue, rec.ID)
		} else {
			err = l.env.Index.PutWaiting(cctx, rec, !l.idxKnown && l.idxFor == want)
		}
		cancel()
		if err == nil || !l.done || try == finalDropTries-1 {
			break
		}
		select {
		case <-time.After(finalDropPause << try):
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	l.idxFor, l.idxKnown = want, err == nil
}

// The final record's index drop is tried finalDropTries times, pausing
// finalDropPause, then twice as long, between them.
const (
	finalDropTries = 4
	finalDropPause = 100 * time.Millisecond
)

// transientKV tells KV write errors that a retry may cure (NATS away, a
// timeout, no stream leader yet) from permanent ones (a record too large).
func transientKV(err error) bool {
	return natserr.Transient(err) || errors.Is(err, context.DeadlineExceeded)
}

// lose marks the lease lost and stops the run, once.
func (l *Hold) lose() {
	if l.lost.CompareAndSwap(false, true) && l.onLost != nil {
		l.onLost()
	}
}
