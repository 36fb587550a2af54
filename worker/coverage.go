package worker

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A run's first attempt reads the control stream at pickup only when a
// control message may be stored for it that the worker's live
// subscription did not hand to it. That read was the costliest step of a
// short run (a JetStream API request, most often answered "not found");
// the worker's own view of the control stream answers the question for
// most runs instead.
//
// Invariants, kept under Worker.mu (onControl, register and the pickup
// check all take it, so a control message either finds the run
// registered or is noted before the run looks):
//
//  1. Within an epoch, the sequences onControl saw are contiguous from
//     first to last: every republished message in between reached it.
//     A gap, a sequence going back (the stream was recreated), a
//     reconnect or a dropped message (the subscription's counts differ
//     from the epoch's) ends the epoch; so does, once valid with nothing
//     seen, a first message past ctlBase+1.
//  2. unclaimed holds the run of every message of the epoch that found no
//     run of this worker registered.
//  3. valid: a renew read the control stream's last sequence ctlBase (its
//     configuration republishing every message) and then the runs
//     stream's last sequence runsBase within this epoch, and first <=
//     ctlBase+1 (or nothing was seen): every control message stored after
//     ctlBase was seen in the epoch.
//
// A control message counts only when stored after its run's request
// (controls.take). A request above runsBase was stored after the runs
// stream's read, so such a message was stored after ctlBase, and (1, 2)
// it was handed to the run or noted in unclaimed. So a first attempt
// whose request is above runsBase and whose run is not in unclaimed has
// nothing stored to read at pickup. A message lost between servers
// (nothing later arrives to show the gap) is read at the run's next
// heartbeat, as for a running run; and an audit every coverageAudit ends
// the epoch when what the stream held at the audit before has not come
// (or the stream stopped republishing everything), so such a loss, or a
// dead subscription, leaves first attempts unread for two intervals at
// most (the audit after the loss reads it, the next one misses it).
type controlCoverage struct {
	epoch      uint64
	first      uint64 // first sequence seen in the epoch; 0: none yet
	last       uint64
	valid      bool
	ctlBase    uint64
	runsBase   uint64
	reconnects uint64 // the connection's reconnects when the epoch's renew began
	dropped    int    // the subscription's dropped messages then
	unclaimed  map[string]struct{}
	renew      chan struct{} // 1-buffered: a renew is due
	// off: the last look at the control stream found it not republishing
	// every message; an audit that finds it back renews.
	off bool
}

// maxUnclaimed bounds the runs noted (a fleet's other runs, a flood of
// control messages to made-up runs): past it the epoch ends.
const maxUnclaimed = 4096

func newControlCoverage() controlCoverage {
	return controlCoverage{unclaimed: map[string]struct{}{}, renew: make(chan struct{}, 1)}
}

// saw notes a republished control message; claimed tells whether a run of
// this worker took it. Worker.mu is held.
func (cv *controlCoverage) saw(seq uint64, run string, claimed bool) {
	if seq == 0 {
		return
	}
	if seq == cv.last {
		// The same sequence again: a copy, or the real message after one
		// that claimed its number (a spoofed header, a recreated stream).
		// Its run is noted all the same.
		cv.note(run, claimed)
		return
	}
	switch {
	case cv.last != 0 && seq != cv.last+1:
		cv.lose() // a gap, or the stream started again
	case cv.last == 0 && cv.valid && seq > cv.ctlBase+1:
		cv.lose() // what came after ctlBase before seq was lost
	}
	if cv.first == 0 {
		cv.first = seq
	}
	cv.last = seq
	cv.note(run, claimed)
}

// note records the run of a message no run took (invariant 2).
func (cv *controlCoverage) note(run string, claimed bool) {
	if claimed {
		return
	}
	cv.unclaimed[run] = struct{}{}
	if len(cv.unclaimed) > maxUnclaimed {
		cv.lose()
	}
}

// lose ends the epoch and asks for a renew. Worker.mu is held.
func (cv *controlCoverage) lose() {
	cv.epoch++
	cv.first, cv.last, cv.valid = 0, 0, false
	clear(cv.unclaimed)
	select {
	case cv.renew <- struct{}{}:
	default:
	}
}

// covers tells whether a first attempt of run, whose request has stream
// sequence reqSeq, may skip the pickup read (see invariant 3). It forgets
// the run: the read it gets instead takes what was noted. Worker.mu is
// held.
func (cv *controlCoverage) covers(run string, reqSeq, reconnects uint64, dropped int) bool {
	if cv.valid && (reconnects != cv.reconnects || dropped != cv.dropped) {
		cv.lose()
	}
	_, noted := cv.unclaimed[run]
	delete(cv.unclaimed, run)
	return cv.valid && reqSeq > cv.runsBase && !noted
}

// renewed ends a renew that began in epoch with these counts and bases.
// Worker.mu is held.
func (cv *controlCoverage) renewed(epoch, reconnects uint64, dropped int, ctlBase, runsBase uint64) {
	if epoch != cv.epoch {
		return // lost meanwhile: the renew due does it again
	}
	if cv.first > ctlBase+1 {
		cv.lose() // messages after ctlBase were not seen
		return
	}
	cv.valid, cv.reconnects, cv.dropped, cv.ctlBase, cv.runsBase = true, reconnects, dropped, ctlBase, runsBase
}

// disable ends the epoch without a renew: the stream does not republish
// every message. Worker.mu is held.
func (cv *controlCoverage) disable() {
	cv.lose()
	select {
	case <-cv.renew:
	default:
	}
	cv.off = true
}

// audited applies an audit's look at the control stream: whether it
// republishes every message, and the last sequence the audit before read
// (prev). What was stored then has had an audit interval to come: if it
// has not, it was lost with nothing after it to show the gap (or the
// subscription is dead). Worker.mu is held.
func (cv *controlCoverage) audited(republishes bool, prev uint64) {
	switch {
	case !republishes:
		cv.disable()
	case cv.off:
		cv.off = false
		cv.lose() // back: renew
	case cv.valid && max(cv.last, cv.ctlBase) < prev:
		cv.lose()
	}
}

// subscriptionCounts are what may have lost republished messages.
func (w *Worker) subscriptionCounts() (uint64, int) {
	dropped, _ := w.ctlSub.Dropped()
	return w.c.Conn().Stats().Reconnects, dropped
}

// startCoverage makes the coverage valid, so runs submitted from now on
// are covered, and renews it whenever an epoch ends, until stop. Only a
// control stream that republishes every message it stores (as
// EnsureStreams makes it) can be covered. The live subscription must be
// known to the server (flushed) first.
func (w *Worker) startCoverage(ctx context.Context) (stop func()) {
	if !w.republishesAll(w.controlStream.CachedInfo().Config) {
		w.log.Info("the control stream does not republish every message to the workers: each run reads it at pickup")
		return func() {}
	}
	if err := w.renewCoverage(ctx); err != nil {
		w.mu.Lock()
		w.cover.lose() // the keeper tries again
		w.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(w.hardCtx)
	var wg sync.WaitGroup
	wg.Go(func() { w.keepCoverage(ctx) })
	return func() { cancel(); wg.Wait() }
}

func (w *Worker) keepCoverage(ctx context.Context) {
	audit := time.NewTicker(w.coverageAudit)
	defer audit.Stop()
	var prev uint64 // the control stream's last sequence at the last audit
	for {
		select {
		case <-ctx.Done():
			return
		case <-audit.C:
			prev = w.auditCoverage(ctx, prev)
			continue
		case <-w.cover.renew:
		}
		for w.renewCoverage(ctx) != nil {
			if !pause(ctx, time.Second) {
				return
			}
		}
	}
}

func (w *Worker) renewCoverage(ctx context.Context) error {
	w.mu.Lock()
	epoch := w.cover.epoch
	w.mu.Unlock()
	reconnects, dropped := w.subscriptionCounts()
	ci, ok, err := w.lookAtControlStream(ctx)
	if err != nil {
		return err
	}
	if !ok {
		// Changed by hand since the start: no coverage until an audit
		// finds it back.
		w.mu.Lock()
		w.cover.disable()
		w.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ri, err := w.runsStream.Info(ctx)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.cover.renewed(epoch, reconnects, dropped, ci.State.LastSeq, ri.State.LastSeq)
	w.mu.Unlock()
	return nil
}

// auditCoverage looks at the control stream once (see audited) and
// returns its last sequence; on a failed read, prev.
func (w *Worker) auditCoverage(ctx context.Context, prev uint64) uint64 {
	ci, ok, err := w.lookAtControlStream(ctx)
	if err != nil {
		return prev
	}
	w.mu.Lock()
	w.cover.audited(ok, prev)
	w.mu.Unlock()
	return ci.State.LastSeq
}

// lookAtControlStream reads the control stream's state and tells whether
// it republishes every message; it warns when it stopped. Only the
// coverage keeper (and the start, before it) calls it.
func (w *Worker) lookAtControlStream(ctx context.Context) (*jetstream.StreamInfo, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ci, err := w.controlStream.Info(ctx)
	if err != nil {
		return nil, false, err
	}
	ok := w.republishesAll(ci.Config)
	if !ok {
		w.mu.Lock()
		off := w.cover.off
		w.mu.Unlock()
		if !off {
			w.log.Warn("the control stream no longer republishes every message to the workers: each run reads it at pickup")
		}
	}
	return ci, ok, nil
}

// republishesAll tells whether the control stream republishes every
// message it stores, whole, to the subjects the worker subscribes to.
func (w *Worker) republishesAll(cfg jetstream.StreamConfig) bool {
	rp := cfg.RePublish
	return rp != nil && !rp.HeadersOnly && rp.Source == w.names.Prefix()+".run.>" &&
		rp.Destination == w.names.Prefix()+".ctl.>"
}

// pickupRead tells whether a run's control owner reads the stream at
// pickup. Call it once the run is registered.
func (w *Worker) pickupRead(r *run) bool {
	if r.attempt != 1 || r.reqSeq == 0 || w.ctlSub == nil || !w.c.Conn().IsConnected() {
		return true // a reconnect under way counts once it is done
	}
	reconnects, dropped := w.subscriptionCounts()
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.cover.covers(r.id, r.reqSeq, reconnects, dropped)
}

// controlSeq is a republished message's stream sequence; 0 if it has
// none.
func controlSeq(m *nats.Msg) uint64 {
	seq, _ := strconv.ParseUint(serverHeader(m.Header, "Nats-Sequence"), 10, 64)
	return seq
}

// serverHeader is the value the server set: it appends its republish
// headers after the publisher's, who may have sent the same names.
func serverHeader(h nats.Header, key string) string {
	v := h.Values(key)
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}
