package worker

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/keys"
	"github.com/agentfleet/agentfleet/worker/internal/lease"
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
//     redelivery finds it. A killed worker's places are swept by the next
//     taker once the runs' leases are stale (keys.Env.Alive).

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
// goes on (false: it parked, or was handed back).
func (r *run) takeKey() bool {
	if r.key == "" {
		return true
	}
	w := r.w
	ctx, cancel := context.WithTimeout(w.hardCtx, 10*time.Second)
	defer cancel()
	res, wake, err := w.keys.Take(ctx, scopedKey(r.queue, r.key), r.keyLimit, r.id, false)
	w.wakeKeyed(ctx, wake)
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
	r.parkForKey()
	return false
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

// releaseKey gives up the run's place once its run_finished is stored
// (invariant 1) and wakes the first in line.
func (r *run) releaseKey(ctx context.Context) {
	if !r.heldKey {
		return
	}
	r.heldKey = false
	next, err := r.w.keys.Release(ctx, scopedKey(r.queue, r.key), r.id)
	if err != nil {
		// The place is swept once this run's record is final.
		r.log.Warn("cannot release the run's concurrency key place", "key", r.key, "err", err)
		return
	}
	if next != "" {
		r.w.wakeKeyed(ctx, []string{next})
	}
}

// wakeKeyed wakes runs granted a place (their parked requests come again).
func (w *Worker) wakeKeyed(ctx context.Context, runs []string) {
	for _, id := range runs {
		rec, err := w.getRecord(ctx, id)
		if err == nil && w.parking != nil {
			err = w.parking.Wake(ctx, rec)
		}
		if err != nil {
			// The place's grace runs out and the next taker grants it again.
			w.log.Warn("cannot wake a run granted its concurrency key place", "run", id, "err", err)
		}
	}
}
