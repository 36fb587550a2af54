package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/natserr"
	"github.com/agentfleet/agentfleet/worker/internal/eventpub"
)

// errLeaseLost: another attempt owns the run (the lease's last
// compare-and-set failed); the attempt publishes nothing more.
var errLeaseLost = errors.New("the run's lease was lost: another attempt owns it")

// errWorkerStopping: the hard stop cut a wait or a read short (a
// re-send's, a turn's, a resume's); the run is handed back as any run at a
// hard stop is. It is the publishers' own: one hard stop, whoever saw it.
var errWorkerStopping = eventpub.ErrStopped

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
// A first delivery of a plain request (attempt 1, no requeue headers)
// does not read the record at pickup: almost always there is none, and
// the read is a round trip on every run's critical path. It takes the
// lease with Create. If a record exists, Create fails and take reads it:
// one the attempt may not take (finished, another request's, a newer
// attempt's) is refused with the outcome a read at pickup would have
// given, only later: after the request was planned and its tenant
// checked, so such a refusal may carry the request's model and tools. One
// it may take (a consumer recreated, so delivery counts began again) is
// handed back (leaseUnread), and the redelivery, attempt 2, reads it at
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

type leaseOutcome int

const (
	leaseTaken    leaseOutcome = iota
	leaseFinished              // the run has finished (the record is final)
	leaseNewer                 // a newer attempt owns the run
	leaseReused                // the record belongs to another request with this id
	leaseUnread                // a record the pickup did not read: hand the request back
)

// lease is one attempt's hold on its run record.
type lease struct {
	w       *Worker
	id      string
	attempt int
	reqSeq  uint64
	// requeuedFrom is the request this one replaced (a requeue of a
	// waiting run, giveup.go): its record is this run's.
	requeuedFrom uint64
	onLost       func() // called once, when another attempt takes the lease
	// unread: the pickup did not read the record (see the top); cleared
	// by the first take.
	unread bool

	rev  uint64 // the revision this attempt wrote last; see the ordering above
	done bool   // the final record is written
	lost atomic.Bool
}

func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// classify says whether this attempt may take a run whose record is cur.
func (l *lease) classify(cur *bus.RunRecord) leaseOutcome {
	switch {
	case cur.Finished():
		return leaseFinished
	case cur.RequestSeq != 0 && cur.RequestSeq != l.reqSeq && !l.replaces(cur):
		return leaseReused
	case cur.Attempt > l.attempt:
		return leaseNewer
	case cur.Requeue != nil && cur.Requeue.From == l.reqSeq:
		return leaseNewer // this request was replaced by its requeued copy
	}
	return leaseTaken
}

// replaces reports whether this attempt's request is the requeued copy of
// the request cur belongs to, as cur's requeue marker says.
func (l *lease) replaces(cur *bus.RunRecord) bool {
	return l.requeuedFrom != 0 && cur.RequestSeq == l.requeuedFrom && cur.Requeue != nil && cur.Requeue.From == l.requeuedFrom
}

// take writes rec over prev (nil: no record) with compare-and-set,
// re-reading and retrying while other attempts race. On leaseTaken the
// attempt holds the lease; otherwise the current record is returned.
func (l *lease) take(ctx context.Context, prev, rec *bus.RunRecord) (leaseOutcome, *bus.RunRecord, error) {
	data, err := agent.MarshalJSON(rec)
	if err != nil {
		return 0, nil, err
	}
	if prev != nil {
		if o := l.classify(prev); o != leaseTaken {
			return o, prev, nil
		}
	}
	unread := l.unread && prev == nil
	l.unread = false
	for range 8 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var rev uint64
		if prev == nil {
			rev, err = l.w.kv.Create(cctx, l.id, data)
		} else {
			rev, err = l.w.kv.Update(cctx, l.id, data, prev.Revision)
		}
		cancel()
		if err == nil {
			l.rev = rev
			l.done = rec.Finished()
			return leaseTaken, nil, nil
		}
		if !isConflict(err) {
			return 0, nil, fmt.Errorf("run record: %w", err)
		}
		cur, err := l.w.getRecord(ctx, l.id)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			prev = nil
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		if o := l.classify(cur); o != leaseTaken {
			return o, cur, nil
		}
		if unread {
			return leaseUnread, cur, nil
		}
		prev = cur
	}
	return 0, nil, errors.New("run record: too many concurrent writers")
}

// ownWrite reports whether cur is a record this attempt wrote (a write
// whose ack was lost, e.g. across a reconnect). A record the give-up
// marked requeued keeps this attempt's fields but is not its write.
func (l *lease) ownWrite(cur *bus.RunRecord) bool {
	return cur.Attempt == l.attempt && cur.Worker == l.w.id && cur.RequestSeq == l.reqSeq &&
		(cur.Requeue == nil || cur.Requeue.From != l.reqSeq)
}

// renew is a heartbeat's write: a failure is retried at the next one.
func (l *lease) renew(ctx context.Context, rec *bus.RunRecord) error {
	return l.write(ctx, rec, false)
}

// writeFinal is the last compare-and-set. It returns errLeaseLost when
// another attempt took the lease.
func (l *lease) writeFinal(ctx context.Context, rec *bus.RunRecord) error {
	return l.write(ctx, rec, true)
}

func (l *lease) write(ctx context.Context, rec *bus.RunRecord, final bool) error {
	if l.done {
		return nil
	}
	if l.lost.Load() {
		return errLeaseLost
	}
	data, err := agent.MarshalJSON(rec)
	if err != nil {
		return err
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rev, err := l.w.kv.Update(cctx, l.id, data, l.rev)
		cancel()
		if err == nil {
			l.rev, l.done = rev, final
			return nil
		}
		if !isConflict(err) {
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
		cur, gerr := l.w.getRecord(ctx, l.id)
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
		return errLeaseLost
	}
}

// transientKV tells KV write errors that a retry may cure (NATS away, a
// timeout, no stream leader yet) from permanent ones (a record too large).
func transientKV(err error) bool {
	return natserr.Transient(err) || errors.Is(err, context.DeadlineExceeded)
}

// lose marks the lease lost and stops the run, once.
func (l *lease) lose() {
	if l.lost.CompareAndSwap(false, true) && l.onLost != nil {
		l.onLost()
	}
}

// heartbeat keeps a running attempt's request owned (InProgress resets its
// AckWait), renews the lease and asks the control owner to read what the
// live path may have lost, every HeartbeatInterval. Once the finish
// starts it stops renewing (the final write is the finish's) and only
// sends InProgress.
//
// It is a timer, not a goroutine: a live run that waits (in a tool, for
// its model) holds no stack for its heartbeat. Each beat runs on the
// timer's goroutine and schedules the next one when it is done.
type heartbeat struct {
	r     *run
	timer *time.Timer

	mu       sync.Mutex
	idle     sync.Cond // signalled when a beat ends
	beating  bool      // a beat runs
	renewing bool
	ended    bool // no beat starts any more
	poked    bool // a beat is wanted at once: the record changed (a wait)
}

// now asks for a beat at once (it never blocks): a wait started or ended,
// and the record should say so before the next tick. A beat in flight is
// followed by another.
func (h *heartbeat) now() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended || !h.renewing {
		return
	}
	h.poked = true
	if !h.beating {
		h.timer.Reset(0)
	}
}

func (r *run) startHeartbeat() *heartbeat {
	h := &heartbeat{r: r, renewing: true}
	h.idle.L = &h.mu
	h.mu.Lock()
	h.timer = time.AfterFunc(firstBeat(r.w.cfg.HeartbeatInterval), h.beat)
	h.mu.Unlock()
	return h
}

func (h *heartbeat) beat() {
	r := h.r
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return
	}
	if r.lease.lost.Load() {
		h.ended = true
		h.mu.Unlock()
		return
	}
	if h.beating {
		// A poke's timer fired while a beat ran: that beat goes again.
		h.poked = true
		h.mu.Unlock()
		return
	}
	h.beating = true
	renewing := h.renewing
	poked := h.poked
	h.poked = false
	h.mu.Unlock()

	if err := r.msg.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		r.log.Warn("heartbeat failed", "err", err)
	}
	if renewing {
		ctx, cancel := context.WithTimeout(r.w.hardCtx, max(r.w.cfg.HeartbeatInterval, time.Second))
		err := r.lease.renew(ctx, r.record(bus.StateRunning))
		cancel()
		if err != nil && !errors.Is(err, errLeaseLost) {
			r.log.Warn("lease renewal failed; retrying at the next heartbeat", "err", err)
		}
		if !poked {
			r.ctl.refresh()
		}
	}

	h.mu.Lock()
	h.beating = false
	if !h.ended {
		next := r.w.cfg.HeartbeatInterval
		if h.poked && h.renewing {
			next = 0
		}
		h.timer.Reset(next)
	}
	h.idle.Broadcast()
	h.mu.Unlock()
}

// firstBeat is when a run's first heartbeat comes: at a random point of
// the interval's second half, never later than a whole interval. Runs
// started together would beat together ever after: 10,000 runs started
// in 4 s sent 10,000 renewals and reads every 15 s, with 7,900 beats in
// flight and 60 MB more heap for a moment; spread, they stay flat
// (docs/benchmarks/2026-12.md, 2026-12-02 afternoon).
func firstBeat(interval time.Duration) time.Duration {
	return interval - rand.N(interval/2+1)
}

// stopRenewing returns once no renewal is in flight or will start.
func (h *heartbeat) stopRenewing() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.renewing = false
	for h.beating {
		h.idle.Wait()
	}
}

// end stops the heartbeat and waits for a beat in flight.
func (h *heartbeat) end() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended = true
	h.timer.Stop()
	for h.beating {
		h.idle.Wait()
	}
}
