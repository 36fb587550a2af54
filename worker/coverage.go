package worker

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The control coverage (intake.ControlCoverage) tells which first
// attempts skip the control read at pickup; the worker keeps it under
// Worker.mu, renews it and audits it here.

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
		w.cover.Lose() // the keeper tries again
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
		case <-w.cover.RenewDue():
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
	epoch := w.cover.Epoch()
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
		w.cover.Disable()
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
	w.cover.Renewed(epoch, reconnects, dropped, ci.State.LastSeq, ri.State.LastSeq)
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
	w.cover.Audited(ok, prev)
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
		off := w.cover.Off()
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
	return !w.cover.Covers(r.id, r.reqSeq, reconnects, dropped)
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
