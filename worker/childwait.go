package worker

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// Waiting for child runs (worker/children.go; docs/protocol.md §17).
//
// A run_agent call waits for its child's final record. The worker keeps
// one subscription for all of them, not a KV watch (a server consumer)
// per waiting call: a worker with thousands of parents waiting costs the
// server one subscription. Invariants:
//
//  1. The child's worker publishes a notice on
//     <prefix>.childdone.<parent>.<child> (core NATS, not stored) after
//     its final record is written; the waiting call registers (notices)
//     before it reads the child's record, so a notice published after
//     the read finds it registered: one of the two sees the other.
//  2. A notice is a hint, never trusted: the call reads the child's
//     record, which decides. A forged notice costs one read.
//  3. Core NATS may lose a notice (a reconnect): each call reads the
//     record again every Config.childRecheck (30 s) as well, and a parent
//     that waits past --park-after parks, after which the child's wake
//     (durable: invariant 6 of children.go) is what ends the wait.
//  4. A child whose record is deleted or purged (the bucket's last
//     message for it is a delete marker) ends the call with an error: it
//     will never finish. A child that never gets a record (its request
//     lost) is bounded by the parent's timeout, which a wait for
//     children does not pause (waiting.go), parked too (park.go,
//     parkDue).
//  5. The subscription's callback only looks the child up and signals
//     without blocking (a buffered channel of one).

// childRecheckDefault is how often a waiting call reads its child's
// record without a notice (invariant 3).
const childRecheckDefault = 30 * time.Second

// childNotices are the worker's run_agent calls waiting for their
// children, by child id.
type childNotices struct {
	mu      sync.Mutex
	waiting map[string]map[chan struct{}]struct{}
}

// add registers a call waiting for child id; remove unregisters it.
func (n *childNotices) add(id string) (ch chan struct{}, remove func()) {
	ch = make(chan struct{}, 1)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.waiting == nil {
		n.waiting = map[string]map[chan struct{}]struct{}{}
	}
	set := n.waiting[id]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		n.waiting[id] = set
	}
	set[ch] = struct{}{}
	return ch, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if delete(set, ch); len(set) == 0 {
			delete(n.waiting, id)
		}
	}
}

// notify signals every call waiting for child id (invariant 5).
func (n *childNotices) notify(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch := range n.waiting[id] {
		select {
		case ch <- struct{}{}:
		default: // already signalled
		}
	}
}

// calls is how many calls wait now.
func (n *childNotices) calls() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, set := range n.waiting {
		c += len(set)
	}
	return c
}

// subscribeChildDone subscribes to the notices of finished children.
func (w *Worker) subscribeChildDone(context.Context) (func(), error) {
	prefix := w.names.Prefix() + ".childdone."
	sub, err := w.c.Conn().Subscribe(w.names.ChildDoneAll(), func(m *nats.Msg) {
		rest, ok := strings.CutPrefix(m.Subject, prefix)
		if !ok {
			return
		}
		if _, child, ok := strings.Cut(rest, "."); ok {
			w.childWaits.notify(child)
		}
	})
	if err != nil {
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// noticeChildDone publishes the notice that child, whose final record is
// written, finished (invariant 1). A lost one is covered (invariant 3):
// it is only logged.
func (w *Worker) noticeChildDone(parent, child string) {
	if w.cfg.loseNotices {
		return
	}
	if err := w.c.Conn().Publish(w.names.ChildDone(parent, child), nil); err != nil {
		w.log.Debug("cannot publish a child's finished notice; its parent reads the record later", "child", child, "err", err)
	}
}

// awaitChild waits until child id's record says finished (invariants 1
// to 4).
func (r *run) awaitChild(ctx context.Context, id string) (*bus.RunRecord, error) {
	w := r.w
	notice, remove := w.childWaits.add(id)
	defer remove()
	recheck := w.cfg.childRecheck
	if recheck <= 0 {
		recheck = childRecheckDefault
	}
	t := time.NewTimer(0) // the first read at once, after registering
	defer t.Stop()
	for {
		select {
		case <-notice:
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		rec, err := w.getRecord(ctx, id)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if gone, gerr := w.recordDeleted(ctx, id); gerr == nil && gone {
				return nil, errors.New("its record was deleted: it will not finish")
			}
		case err != nil:
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			r.log.Warn("cannot read a child run's record; reading it again later", "child", id, "err", err)
		case rec.Finished():
			return rec, nil
		}
		t.Reset(recheck)
	}
}

// recordDeleted reports whether run id's record was deleted or purged:
// the last message of its subject in the bucket's stream is a delete
// marker (a run that never had a record has none).
func (w *Worker) recordDeleted(ctx context.Context, id string) (bool, error) {
	s := w.recordsStream.Load()
	if s == nil {
		got, err := w.js.Stream(ctx, "KV_"+w.names.RecordsBucket())
		if err != nil {
			return false, err
		}
		w.recordsStream.Store(&got)
		s = &got
	}
	m, err := (*s).GetLastMsgForSubject(ctx, w.names.Record(id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	op := m.Header.Get("KV-Operation")
	return op == "DEL" || op == "PURGE", nil
}
