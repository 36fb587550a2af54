package main

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// recordWatch follows the writes of the run records from the console's
// start on (never the bucket's history: pages read that with bus.ListPage).
// It keeps two small things: a version that changes with every write
// (the runs page long-polls on it) and, per queue, the runs that finished
// since the sampler last took the counts (samples.go).
type recordWatch struct {
	client *bus.Client
	log    *slog.Logger
	// retry is the wait before watching again (no bucket yet, watch lost).
	retry time.Duration

	mu      sync.Mutex
	version uint64
	changed chan struct{} // closed on the next change
	// lastRev is the highest revision seen: a new watch resumes after it.
	lastRev uint64
	ready   bool // watching
	// runs are the runs written lately: whether their last write was a
	// final one (a final record written again is not counted twice).
	runs   map[string]watchedRun
	counts map[string]*queueCounts
	// countingSince is when the first watch began (a later one resumes
	// where it stopped); lastTake the end of the slot last taken. The
	// counts cover the time since the later of the two.
	countingSince, lastTake time.Time
}

type watchedRun struct {
	final bool
	seen  time.Time
}

// queueCounts are the runs of a queue that finished in a sample's slot.
type queueCounts struct {
	Finished int `json:"finished"`
	Failed   int `json:"failed,omitempty"`
	Aborted  int `json:"aborted,omitempty"`
}

// forgetAfter is how long a run no write mentions stays in runs.
const forgetAfter = 10 * time.Minute

func newRecordWatch(c *bus.Client, log *slog.Logger) *recordWatch {
	return &recordWatch{client: c, log: log, retry: 2 * time.Second, changed: make(chan struct{}),
		runs: map[string]watchedRun{}, counts: map[string]*queueCounts{}}
}

// run keeps watching until ctx is done.
func (s *recordWatch) run(ctx context.Context) {
	for {
		err := s.watch(ctx)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("watching the run records", "err", err, "retry", s.retry)
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.retry):
		}
	}
}

func (s *recordWatch) watch(ctx context.Context) error {
	kv, err := s.client.Records(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	last := s.lastRev
	s.mu.Unlock()
	// New writes only; after a lost watch, from where it stopped.
	opt := jetstream.UpdatesOnly()
	if last > 0 {
		opt = jetstream.ResumeFromRevision(last + 1)
	}
	w, err := kv.WatchAll(ctx, opt)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	s.mu.Lock()
	s.ready = true
	if s.countingSince.IsZero() {
		s.countingSince = time.Now()
	}
	s.bump()
	s.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the watch ended")
			}
			if e != nil {
				s.apply(e, time.Now())
			}
		}
	}
}

// apply takes one write.
func (s *recordWatch) apply(e jetstream.KeyValueEntry, now time.Time) {
	var r *bus.RunRecord
	if e.Operation() == jetstream.KeyValuePut {
		var err error
		if r, err = bus.DecodeRecord(e); err != nil {
			s.log.Debug("undecodable run record", "key", e.Key(), "err", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastRev = max(s.lastRev, e.Revision())
	s.bump()
	if r == nil {
		return
	}
	was := s.runs[r.ID]
	final := r.Finished()
	s.runs[r.ID] = watchedRun{final: final, seen: now}
	if !final || was.final {
		return
	}
	c := s.counts[r.Queue]
	if c == nil {
		c = &queueCounts{}
		s.counts[r.Queue] = c
	}
	c.Finished++
	switch r.State {
	case bus.StatusFailed:
		c.Failed++
	case bus.StatusAborted:
		c.Aborted++
	}
}

func (s *recordWatch) bump() {
	s.version++
	close(s.changed)
	s.changed = make(chan struct{})
}

// take returns the counts since the last take, for the slot that ends at
// end, and starts new ones; since is when they began to be counted (zero:
// they were not). Runs no write mentioned for forgetAfter are forgotten.
func (s *recordWatch) take(end time.Time) (counts map[string]queueCounts, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := end
	since = s.lastTake
	if since.IsZero() {
		since = s.countingSince
	}
	if !s.countingSince.IsZero() {
		s.lastTake = end
	}
	out := make(map[string]queueCounts, len(s.counts))
	for q, c := range s.counts {
		out[q] = *c
	}
	clear(s.counts)
	for id, r := range s.runs {
		if now.Sub(r.seen) > forgetAfter {
			delete(s.runs, id)
		}
	}
	return out, since
}

// watchVersion returns the version and a channel closed on the next
// change.
func (s *recordWatch) watchVersion() (uint64, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version, s.changed
}

// isReady reports whether the watch is on.
func (s *recordWatch) isReady() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}
