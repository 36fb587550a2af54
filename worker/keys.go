package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/keys"
	"github.com/agentfleet/agentfleet/worker/internal/lease"
	"github.com/agentfleet/agentfleet/worker/internal/park"
)

// Concurrency keys (since 1.10; docs/architecture.md, Choosing the next
// run). A run with a key takes a place in it after its pickup and before
// its lease (worker/internal/keys keeps the places). A run whose key is
// full is parked at once (park.go's machinery: its request's copy kept in
// AGENTS_PARKED, its record parked and waiting for "key", its request
// acknowledged), so it holds no slot, goroutine or --max-waiting place and
// its request is never redelivered toward a give-up. The run that gives up
// a place, once its run_finished is stored, hands it to the first in line
// and wakes it; the woken request finds its place held.
//
// Invariants:
//  1. The place is taken before the lease and released only after
//     run_finished is stored: two runs of a key never run at once beyond
//     its limit, as the events show them.
//  2. A run in line has a parked record before it can be granted a place
//     by anyone who reads it: it writes the record, then looks again
//     (Take), and wakes itself if a place came meanwhile.
//  3. A run handed back (a drain, a lost connection) keeps its place: its
//     redelivery finds it. A killed worker's places are swept once the
//     runs' leases are stale (keys.Env.Alive): by the next taker that
//     finds the key full, and by every worker's key sweep (startKeySweep),
//     so a line never waits for a later run of its key.
//  4. A parked run holds no place: one parked for an approval or its
//     children gives its place up once its record says parked (parkWaiting)
//     and takes one again at its wake's pickup, in line like any other.
//  5. A run in line ends without a place when it cannot run: aborted (an
//     abort stored for it, looked for before it parks or parks again), or
//     failed gave_up when its request's kept copy is gone (AGENTS_PARKED's
//     max age) as its place is granted; its place goes to the next in line.

// KeyLimit is an operator's default limit for concurrency keys matching
// Pattern (path.Match: '*' any run of characters but '/').
type KeyLimit struct {
	Pattern string
	Limit   int
}

// openKeys sets up the concurrency keys' env; without the bucket, a
// request with a key is a bad request.
func (w *Worker) openKeys(setup context.Context) {
	kv, err := w.js.KeyValue(setup, w.names.KeysBucket())
	if err != nil {
		w.log.Warn("concurrency keys off: no agents_keys bucket (create the streams with EnsureStreams)", "err", err)
		return
	}
	stale := 2 * w.cfg.AckWait
	w.keys = &keys.Env{KV: kv, Grace: stale, Now: time.Now,
		Alive: func(ctx context.Context, run string) (bool, error) {
			rec, err := w.getRecord(ctx, run)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return false, nil // past the grace with no record: never started
			}
			if err != nil {
				return false, err
			}
			return !rec.Finished() && rec.Parked == nil && time.Since(rec.HeartbeatAt) < stale, nil
		}}
}

// keyLimit is the limit in force for the request's key, or a problem.
func (w *Worker) keyLimit(c *bus.Concurrency) (int, string) {
	op := 0
	for _, kl := range w.cfg.KeyLimits {
		if ok, _ := path.Match(kl.Pattern, c.Key); ok {
			op = kl.Limit
			break
		}
	}
	switch {
	case w.keys == nil:
		return 0, "concurrency keys need the agents_keys bucket (this fleet's streams were made before 1.10: start a 1.10 worker that ensures the streams)"
	case c.Limit > 0 && op > 0:
		return min(c.Limit, op), ""
	case c.Limit > 0:
		return c.Limit, ""
	case op > 0:
		return op, ""
	}
	return 0, fmt.Sprintf("concurrency.limit is missing and no --concurrency-key-limit pattern matches key %q", clipString(c.Key, 64))
}

// scopedKey is the key's place name: a key belongs to its queue, the
// unit of permission (docs/security.md), so a submitter of one queue
// cannot fill the places, or the line, of another queue's key.
func scopedKey(queue, key string) string { return queue + "/" + key }

// takeKey takes the run's place in its key; it reports whether the run
// goes on (false: it parked, ended, or was handed back).
func (r *run) takeKey() bool {
	if r.key == "" {
		return true
	}
	w := r.w
	ctx, cancel := context.WithTimeout(w.hardCtx, 10*time.Second)
	defer cancel()
	res, wake, err := w.keys.Take(ctx, scopedKey(r.queue, r.key), r.keyLimit, r.id, false)
	w.wakeKeyed(ctx, wake)
	if errors.Is(err, keys.ErrLineFull) {
		// Refused, not handed back: each delivery would find it full.
		r.endInLine(bus.StatusFailed, bus.ReasonBadRequest, clipString(err.Error()+": key "+r.key, bus.MaxErrorBytes),
			r.termRequest("bad_request: concurrency key line full"))
		return false
	}
	if err != nil {
		r.log.Warn("cannot take the run's concurrency key place; handing it back", "key", r.key, "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return false
	}
	if res != keys.Waits {
		r.heldKey = true
		if p := r.prev; p != nil && p.Waiting != nil && p.Waiting.For == bus.WaitingKey && !p.Waiting.Since.IsZero() {
			w.obs.KeyWaited(r.info(), time.Since(p.Waiting.Since))
		}
		return true
	}
	// Invariant 5: an abort ends a run in line at once, not once its key
	// frees (a wake for the abort would only park it again).
	aborted, err := r.abortStored(ctx)
	if err != nil {
		r.log.Warn("cannot look for an abort of the run; handing it back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return false
	}
	if aborted {
		r.heldKey = true // finish leaves the line (Release)
		r.endInLine(bus.StatusAborted, bus.ReasonAbortedByUser, "aborted while waiting for its concurrency key", r.ackRequest())
		return false
	}
	r.parkForKey()
	return false
}

// abortStored reports whether an abort of the run is stored.
func (r *run) abortStored(ctx context.Context) (bool, error) {
	_, err := r.w.controlStream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(r.w.names.Control(r.id, bus.KindAbort)))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	}
	return false, err
}

// endInLine ends a run that never got its key place (invariant 5): its
// final record under the lease, run_started and run_finished, then s.
func (r *run) endInLine(status, reason, text string, s settlement) {
	ctx, cancel := r.finishContext()
	defer cancel()
	rec := r.record(status)
	rec.Reason, rec.Error, rec.FinishedAt = reason, text, time.Now()
	if p := r.prev; r.req == nil && p != nil { // no request read: the record tells
		rec.Model, rec.Metadata, rec.Title, rec.Tenant, rec.Priority, rec.Child = p.Model, p.Metadata, p.Title, p.Tenant, p.Priority, p.Child
	}
	switch o, cur, err := r.lease.Take(ctx, r.prev, rec); {
	case err != nil:
		r.log.Warn("run in line for its key: final record not written", "err", err)
		if s.retry != nil {
			s.retry()
		}
		return
	case o != lease.Taken:
		r.heldKey = false // the attempt that owns the run has its place
		if r.msg != nil {
			r.refuse(o, cur)
		}
		return
	}
	started := r.runStarted()
	fin := r.badRequestFinished(text)
	fin.Status, fin.Reason = status, reason
	if r.finish(ending{started: &started, fin: fin, settle: s}) == nil {
		r.log.Info("run ended in line for its concurrency key", "status", status, "reason", reason, "key", r.key)
	}
}

// parkForKey parks a run whose key is full (invariant 2).
func (r *run) parkForKey() {
	w := r.w
	env := w.parking
	if env == nil {
		// No parking: the request comes again after a while (each time a
		// delivery), which is all a worker without AGENTS_PARKED can do.
		r.log.Warn("concurrency key full and parking is off; handing the run back", "key", r.key)
		_ = r.msg.NakWithDelay(5 * time.Second)
		return
	}
	ctx, cancel := r.finishContext()
	defer cancel()
	req, err := w.runsStream.GetMsg(ctx, r.reqSeq)
	var seq uint64
	var digest string
	if err == nil {
		seq, digest, err = env.Keep(ctx, r.queue, r.id, r.attempt, req)
	}
	if err != nil {
		r.log.Warn("cannot park the run for its key; handing it back", "key", r.key, "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return
	}
	if p := r.prev; p != nil && p.Parked != nil && p.Waiting != nil && parkableWait(p.Waiting.For) && !p.Waiting.Since.IsZero() {
		// Woken from an approval's or children's park: that wait, not
		// counted against the timeout, ends here and the key's begins.
		r.earlier.waited += time.Since(p.Waiting.Since)
	}
	rec := r.record(bus.StateRunning)
	now := time.Now()
	rec.Waiting = &bus.Waiting{For: bus.WaitingKey, Since: now, Key: r.key}
	rec.Parked = &bus.Parked{At: now, Seq: seq, Attempt: r.attempt, Digest: digest}
	o, cur, err := r.lease.Take(ctx, r.prev, rec)
	switch {
	case err != nil:
		r.log.Warn("cannot write the run's record while parking it for its key; handing it back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return
	case o != lease.Taken:
		r.refuse(o, cur)
		return
	}
	// In line only now that the record is parked: whoever grants the
	// place finds a run to wake.
	res, wake, err := w.keys.Take(ctx, scopedKey(r.queue, r.key), r.keyLimit, r.id, true)
	w.wakeKeyed(ctx, wake)
	if err == nil && res != keys.Waits {
		err = env.Wake(ctx, rec) // a place came meanwhile
	}
	if err != nil {
		// Not acknowledged: the request comes again and resumes the run.
		r.log.Warn("cannot queue the run for its key; handing it back", "key", r.key, "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return
	}
	if err := r.msg.DoubleAck(ctx); err != nil {
		r.log.Warn("key-parked run's request not acknowledged; it comes again", "err", err)
	}
	r.log.Info("run parked: its concurrency key is full", "key", r.key, "limit", r.keyLimit, "parkedSeq", seq)
}

// releaseKey gives up the run's place (or its place in line) once its
// run_finished is stored (invariant 1), or its record is parked
// (invariant 4), and wakes those granted one.
func (r *run) releaseKey(ctx context.Context) {
	if !r.heldKey {
		return
	}
	r.heldKey = false
	next, err := r.w.keys.Release(ctx, scopedKey(r.queue, r.key), r.id)
	if err != nil {
		// The key sweep drops the place once this run's record is final.
		r.log.Warn("cannot release the run's concurrency key place", "key", r.key, "err", err)
		return
	}
	r.w.wakeKeyed(ctx, next)
}

// wakeKeyed wakes runs granted a place (their parked requests come again).
// A run whose kept copy is gone cannot come again: it ends failed and its
// place goes on (invariant 5).
func (w *Worker) wakeKeyed(ctx context.Context, runs []string) {
	for _, id := range runs {
		rec, err := w.getRecord(ctx, id)
		if err == nil && w.parking != nil {
			err = w.parking.WakeKept(ctx, rec)
		}
		if errors.Is(err, park.ErrCopyGone) && rec.Waiting != nil && rec.Waiting.For == bus.WaitingKey && !rec.Finished() {
			w.endLostKeyWaiter(ctx, rec)
			continue
		}
		if err != nil && !errors.Is(err, park.ErrCopyGone) {
			// The place's grace runs out and the key sweep grants it again.
			w.log.Warn("cannot wake a run granted its concurrency key place", "run", id, "err", err)
		}
	}
}

// endLostKeyWaiter fails a run granted its place whose kept copy is gone
// (its wait outlived AGENTS_PARKED's max age), with an attempt of its
// own, and hands the place on.
func (w *Worker) endLostKeyWaiter(ctx context.Context, rec *bus.RunRecord) {
	r := w.newRun(rec.ID, rec.Queue, rec.Attempt+1, rec.RequestSeq, rec.SubmittedAt)
	r.prev, r.key, r.heldKey = rec, rec.Waiting.Key, true
	if !rec.StartedAt.IsZero() {
		r.runStart = rec.StartedAt
	}
	r.earlier.waited = time.Duration(rec.WaitedMs)*time.Millisecond + time.Since(rec.Waiting.Since)
	r.log.Warn("run granted its concurrency key place, but its parked request copy is gone (its wait outlived the parked-requests stream's max age): failing it")
	r.endInLine(bus.StatusFailed, bus.ReasonGaveUp,
		"gave up: the run waited for its concurrency key longer than the parked-requests stream keeps a request (AGENTS_PARKED max age); submit it again",
		settlement{done: func(context.Context) error { return nil }})
}

// startKeySweep sweeps every concurrency key with a line, every grace
// (spread, so the fleet's workers do not sweep together): invariant 3.
// Every worker does, so none is a single point of failure; two sweeping
// one key at once are safe (compare-and-set).
func (w *Worker) startKeySweep(context.Context) (func(), error) {
	if w.keys == nil {
		return func() {}, nil
	}
	every := w.keys.Grace
	ctx, cancel := context.WithCancel(w.hardCtx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(every + rand.N(every/4+1))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			w.sweepKeys(ctx)
			t.Reset(every + rand.N(every/4+1))
		}
	}()
	return func() { cancel(); <-done }, nil
}

// sweepKeys is one pass of the key sweep; a failure is logged, and the
// next pass tries again.
func (w *Worker) sweepKeys(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(w.keys.Grace, 10*time.Second))
	defer cancel()
	names, err := w.keys.Names(ctx)
	if err != nil {
		w.log.Debug("key sweep", "err", err)
		return
	}
	for _, name := range names {
		wake, err := w.keys.Sweep(ctx, name)
		if err != nil {
			w.log.Debug("key sweep", "key", name, "err", err)
			continue
		}
		if len(wake) > 0 {
			w.log.Info("key sweep granted places", "key", name, "runs", len(wake))
		}
		w.wakeKeyed(ctx, wake)
	}
}
