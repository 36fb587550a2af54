package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/eventpub"
	"github.com/agentfleet/agentfleet/worker/internal/intake"
	"github.com/agentfleet/agentfleet/worker/internal/lease"
)

// errLeaseLost: another attempt owns the run (the lease's last
// compare-and-set failed); the attempt publishes nothing more.
var errLeaseLost = lease.ErrLost

// leaseGone reports whether err says another attempt owns the run: the
// lease's compare-and-set failed, or the publisher was fenced for it (one
// error before the two parts had one each).
func leaseGone(err error) bool {
	return errors.Is(err, lease.ErrLost) || errors.Is(err, eventpub.ErrFenced)
}

// errWorkerStopping: the hard stop cut a wait or a read short (a
// re-send's, a turn's, a resume's); the run is handed back as any run at a
// hard stop is. It is the publishers' own: one hard stop, whoever saw it.
var errWorkerStopping = eventpub.ErrStopped

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

// startHeartbeat starts the run's heartbeat. kept is when the request's
// AckWait last began (pickupBeat.stop): the first beat comes no later than
// an interval after it. Started a whole firstBeat after the hand-over, a
// request went up to two intervals without an InProgress.
func (r *run) startHeartbeat(kept time.Time) *heartbeat {
	h := &heartbeat{r: r, renewing: true}
	h.idle.L = &h.mu
	first := firstBeat(r.w.cfg.HeartbeatInterval)
	if !kept.IsZero() {
		first = min(first, max(r.w.cfg.HeartbeatInterval-time.Since(kept), 0))
	}
	h.mu.Lock()
	h.timer = time.AfterFunc(first, h.beat)
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
	if r.lease.Lost() {
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
		err := r.lease.Renew(ctx, r.record(bus.StateRunning))
		cancel()
		if err != nil && !leaseGone(err) {
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

// pickupBeat keeps a request owned from its read until its run's
// heartbeat starts: InProgress every interval. A pickup's reads (a
// requeued copy's wait for its binding, the record, a continued run's
// events, the tenant's budget) and its lease take (up to AckWait) are
// each bounded, together not by AckWait: a slow pickup had its request
// redelivered, a second attempt of a run never started.
//
// stop waits for a beat under way, so once it returns no InProgress of
// the pickup's goes out: a settle after it is not followed by one (the
// acknowledgements order the two as well: intake.requestAck), and a
// stale copy (lease.Newer) stops extending the newer delivery's AckWait.
type pickupBeat struct {
	acks  intake.RequestAcks
	every time.Duration

	mu      sync.Mutex
	idle    sync.Cond // signalled when a beat ends
	timer   *time.Timer
	beating bool      // a beat's InProgress is under way
	stopped bool      // no beat starts any more
	waited  bool      // a stop waited for a beat under way
	last    time.Time // the request's AckWait last began: its read, or the last InProgress sent
}

func startPickupBeat(acks intake.RequestAcks, every time.Duration) *pickupBeat {
	p := &pickupBeat{acks: acks, every: every, last: time.Now()}
	p.idle.L = &p.mu
	p.mu.Lock()
	p.timer = time.AfterFunc(every, p.beat)
	p.mu.Unlock()
	return p
}

func (p *pickupBeat) beat() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.beating = true
	p.mu.Unlock()
	// Settled meanwhile: the acknowledgements refuse it (ErrMsgAlreadyAckd).
	err := p.acks.InProgress()
	p.mu.Lock()
	p.beating = false
	if err == nil {
		p.last = time.Now()
	}
	if !p.stopped {
		p.timer.Reset(p.every)
	}
	p.idle.Broadcast()
	p.mu.Unlock()
}

// stop ends the beats and waits for a beat under way; it returns when the
// request's AckWait last began (its read or the last InProgress). It may
// be called more than once, and on nil (a give-up's run: zero time).
func (p *pickupBeat) stop() time.Time {
	if p == nil {
		return time.Time{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	p.timer.Stop()
	for p.beating {
		p.waited = true
		p.idle.Wait()
	}
	return p.last
}
