package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// The run record is the run's lease. An attempt takes it with a KV
// compare-and-set (Create, or Update on the revision it read) before it
// publishes anything, renews it with a compare-and-set at every heartbeat,
// and writes the final record with one last compare-and-set before
// run_finished. Any other attempt taking it makes the holder's next
// compare-and-set fail: the holder then stops at once and publishes
// nothing more. A lower attempt never takes it from a higher one.

type leaseOutcome int

const (
	leaseTaken    leaseOutcome = iota
	leaseFinished              // the run has finished (the record is final)
	leaseNewer                 // a newer attempt owns the run
	leaseReused                // the record belongs to another request with this id
)

func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// classify says whether this attempt may take a run whose record is cur.
func (r *run) classify(cur *bus.RunRecord) leaseOutcome {
	switch {
	case cur.Finished():
		return leaseFinished
	case cur.RequestSeq != 0 && cur.RequestSeq != r.reqSeq:
		return leaseReused
	case cur.Attempt > r.attempt:
		return leaseNewer
	}
	return leaseTaken
}

// takeLease writes rec over prev (nil: no record) with compare-and-set,
// re-reading and retrying while other attempts race. On leaseTaken the
// run holds the lease at r.leaseRev; otherwise the current record is
// returned.
func (r *run) takeLease(ctx context.Context, prev, rec *bus.RunRecord) (leaseOutcome, *bus.RunRecord, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, nil, err
	}
	for range 8 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var rev uint64
		if prev == nil {
			rev, err = r.w.kv.Create(cctx, r.id, data)
		} else {
			rev, err = r.w.kv.Update(cctx, r.id, data, prev.Revision)
		}
		cancel()
		if err == nil {
			r.leaseMu.Lock()
			r.leaseRev = rev
			r.leaseMu.Unlock()
			return leaseTaken, nil, nil
		}
		if !isConflict(err) {
			return 0, nil, fmt.Errorf("run record: %w", err)
		}
		cur, err := r.w.getRecord(ctx, r.id)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			prev = nil
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		if o := r.classify(cur); o != leaseTaken {
			return o, cur, nil
		}
		prev = cur
	}
	return 0, nil, errors.New("run record: too many concurrent writers")
}

// ownWrite reports whether cur is a record this attempt wrote (a write
// whose ack was lost, e.g. across a reconnect).
func (r *run) ownWrite(cur *bus.RunRecord) bool {
	return cur.Attempt == r.attempt && cur.Worker == r.w.id && cur.RequestSeq == r.reqSeq
}

// writeLeased writes rec if the run still holds the lease. It returns
// errLeaseLost when another attempt took it. final marks the last write:
// heartbeats write nothing after it.
func (r *run) writeLeased(ctx context.Context, rec *bus.RunRecord, final bool) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	if r.leaseDone {
		return nil
	}
	if r.leaseIsLost() {
		return errLeaseLost
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rev, err := r.w.kv.Update(cctx, r.id, data, r.leaseRev)
		cancel()
		if err == nil {
			r.leaseRev = rev
			r.leaseDone = final
			return nil
		}
		if !isConflict(err) {
			if !final || ctx.Err() != nil {
				return fmt.Errorf("run record: %w", err)
			}
			// The final record must be written: retry while ctx allows.
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return fmt.Errorf("run record: %w", err)
			}
			continue
		}
		cur, gerr := r.w.getRecord(ctx, r.id)
		if gerr != nil && !errors.Is(gerr, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("run record: %w", gerr)
		}
		if cur != nil && r.ownWrite(cur) && !cur.Finished() {
			r.leaseRev = cur.Revision // our own write, its ack lost: retry
			continue
		}
		if cur != nil && r.ownWrite(cur) && final {
			r.leaseDone = true
			return nil
		}
		return errLeaseLost
	}
}

// renew is the heartbeat's lease renewal.
func (r *run) renew() {
	ctx, cancel := context.WithTimeout(r.w.hardCtx, max(r.w.cfg.HeartbeatInterval, time.Second))
	defer cancel()
	err := r.writeLeased(ctx, r.record(bus.StateRunning), false)
	switch {
	case errors.Is(err, errLeaseLost):
		r.loseLease()
	case err != nil:
		r.log.Warn("lease renewal failed; retrying at the next heartbeat", "err", err)
	}
}

// loseLease stops the run at once: another attempt owns it. Nothing more
// is published, the request is neither acked nor naked.
func (r *run) loseLease() {
	r.mu.Lock()
	first := !r.lost
	r.lost = true
	r.mu.Unlock()
	if !first {
		return
	}
	r.log.Warn("lease lost: another attempt owns this run; stopping it without publishing more")
	if r.pub != nil {
		r.pub.fence()
	}
	if r.cancel != nil {
		r.cancel()
	}
	if r.agent != nil {
		r.agent.Abort()
	}
}

func (r *run) leaseIsLost() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}

// heartbeatLoop keeps the request owned (InProgress resets its AckWait),
// renews the lease and reads control messages whose live copy was lost,
// every HeartbeatInterval, until stop is closed.
func (r *run) heartbeatLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(r.w.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if r.leaseIsLost() {
				return
			}
			if err := r.msg.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
				r.log.Warn("heartbeat failed", "err", err)
			}
			r.renew()
			r.ctl.refresh(r.w.hardCtx)
		case <-stop:
			return
		}
	}
}
