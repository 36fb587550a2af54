package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// backlog is how many record revisions before the console's start it
// reads: it never reads the whole bucket.
const backlog = 1000

// maxRuns bounds the runs kept in memory; the oldest finished go first.
const maxRuns = 20000

// recordStore is the console's view of the run records: those written
// since it started plus the last backlog revisions before, kept current by
// a KV watch from that revision.
type recordStore struct {
	client  *bus.Client
	log     *slog.Logger
	started time.Time
	// retry is the wait before watching again (no bucket yet, watch lost).
	retry time.Duration

	mu      sync.Mutex
	runs    map[string]*bus.RunRecord
	version uint64
	changed chan struct{} // closed on the next change
	// lastRev is the highest revision seen: a new watch resumes after it.
	lastRev uint64
	ready   bool // the backlog has been read
}

func newRecordStore(c *bus.Client, log *slog.Logger) *recordStore {
	return &recordStore{client: c, log: log, started: time.Now(), retry: 2 * time.Second,
		runs: map[string]*bus.RunRecord{}, changed: make(chan struct{})}
}

// run keeps the store current until ctx is done.
func (s *recordStore) run(ctx context.Context) {
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

// startRevision is where a watch starts: after what was seen, else the
// last backlog revisions of the bucket's stream.
func (s *recordStore) startRevision(ctx context.Context, kv jetstream.KeyValue) (uint64, error) {
	s.mu.Lock()
	last := s.lastRev
	s.mu.Unlock()
	if last > 0 {
		return last + 1, nil
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return 0, err
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return 1, nil
	}
	lastSeq := bs.StreamInfo().State.LastSeq
	if lastSeq <= backlog {
		return 1, nil
	}
	return lastSeq - backlog + 1, nil
}

func (s *recordStore) watch(ctx context.Context) error {
	kv, err := s.client.Records(ctx)
	if err != nil {
		return err
	}
	from, err := s.startRevision(ctx, kv)
	if err != nil {
		return err
	}
	w, err := kv.WatchAll(ctx, jetstream.ResumeFromRevision(from))
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the watch ended")
			}
			s.apply(e)
		}
	}
}

// apply takes one watch update; nil marks the end of the backlog.
func (s *recordStore) apply(e jetstream.KeyValueEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e == nil {
		s.ready = true
		s.bump()
		return
	}
	s.lastRev = max(s.lastRev, e.Revision())
	switch e.Operation() {
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		delete(s.runs, e.Key())
		s.bump()
		return
	}
	r, err := bus.DecodeRecord(e)
	if err != nil {
		s.log.Debug("undecodable run record", "key", e.Key(), "err", err)
		return
	}
	if old := s.runs[r.ID]; old != nil && old.Revision > r.Revision {
		return
	}
	s.runs[r.ID] = r
	if len(s.runs) > maxRuns {
		s.evict()
	}
	s.bump()
}

// queued adds a run the console submitted, until its record comes.
func (s *recordStore) queued(id, queue string, seq uint64, model string, meta map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.runs[id]; ok {
		return
	}
	s.runs[id] = &bus.RunRecord{ID: id, Queue: queue, State: bus.StateQueued, RequestSeq: seq,
		SubmittedAt: time.Now(), Model: model, Metadata: meta}
	s.bump()
}

func (s *recordStore) bump() {
	s.version++
	close(s.changed)
	s.changed = make(chan struct{})
}

// evict drops the oldest finished runs down to 90% of maxRuns.
func (s *recordStore) evict() {
	var done []*bus.RunRecord
	for _, r := range s.runs {
		if r.Finished() {
			done = append(done, r)
		}
	}
	sort.Slice(done, func(i, j int) bool { return done[i].Revision < done[j].Revision })
	for _, r := range done {
		if len(s.runs) <= maxRuns*9/10 {
			break
		}
		delete(s.runs, r.ID)
	}
}

// version returns the store's version and a channel closed on the next
// change.
func (s *recordStore) watchVersion() (uint64, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version, s.changed
}

// runFilter selects runs for the list.
type runFilter struct {
	State string
	Queue string
	Query string // substring of the id
	Limit int
}

// list returns matching runs, newest first, with Stale set.
func (s *recordStore) list(f runFilter, now time.Time) []bus.RunRecord {
	s.mu.Lock()
	out := make([]bus.RunRecord, 0, min(len(s.runs), 1024))
	for _, r := range s.runs {
		c := *r
		markStale(&c, now)
		if f.State != "" && c.State != f.State && !(f.State == bus.StateStale && c.Stale) &&
			!(f.State == bus.StateWaiting && c.State == bus.StateRunning && c.Waiting != nil) {
			continue
		}
		if f.Queue != "" && c.Queue != f.Queue {
			continue
		}
		if f.Query != "" && !strings.Contains(strings.ToLower(c.ID), strings.ToLower(f.Query)) {
			continue
		}
		out = append(out, c)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := sortTime(&out[i]), sortTime(&out[j])
		if !a.Equal(b) {
			return a.After(b)
		}
		return out[i].ID < out[j].ID
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out
}

func sortTime(r *bus.RunRecord) time.Time {
	if !r.SubmittedAt.IsZero() {
		return r.SubmittedAt
	}
	return r.StartedAt
}

// get returns one run, with Stale set.
func (s *recordStore) get(id string, now time.Time) (bus.RunRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.runs[id]
	if !ok {
		return bus.RunRecord{}, false
	}
	c := *r
	markStale(&c, now)
	return c, true
}

// markStale is bus's rule: a running record whose heartbeat is older than
// bus.DefaultStaleAfter has lost its worker.
func markStale(r *bus.RunRecord, now time.Time) {
	if r.State != bus.StateRunning {
		return
	}
	hb := r.HeartbeatAt
	if hb.IsZero() {
		hb = r.StartedAt
	}
	r.Stale = !hb.IsZero() && now.Sub(hb) > bus.DefaultStaleAfter
}

// rates are the fleet's throughput as the console saw it.
type rates struct {
	WatchingSince     time.Time      `json:"watchingSince"`
	Runs              int            `json:"runs"` // runs the console knows
	States            map[string]int `json:"states"`
	StartedLastMinute int            `json:"startedLastMinute"`
	// FinishedLastMinute is the fleet's runs per minute.
	FinishedLastMinute int `json:"finishedLastMinute"`
	// Failures since the console started: failed runs, and aborted ones.
	FailedSinceStart  int  `json:"failedSinceStart"`
	AbortedSinceStart int  `json:"abortedSinceStart"`
	Ready             bool `json:"ready"`
}

func (s *recordStore) rates(now time.Time) rates {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := rates{WatchingSince: s.started, Runs: len(s.runs), States: map[string]int{}, Ready: s.ready}
	minute := now.Add(-time.Minute)
	for _, rec := range s.runs {
		state := rec.State
		c := *rec
		markStale(&c, now)
		if c.Stale {
			state = bus.StateStale
		}
		r.States[state]++
		if rec.StartedAt.After(minute) {
			r.StartedLastMinute++
		}
		if rec.Finished() && rec.FinishedAt.After(minute) {
			r.FinishedLastMinute++
		}
		if rec.Finished() && !rec.FinishedAt.Before(s.started) {
			switch rec.State {
			case bus.StatusFailed:
				r.FailedSinceStart++
			case bus.StatusAborted:
				r.AbortedSinceStart++
			}
		}
	}
	return r
}

// marshalRuns encodes records with the fields the page shows.
func marshalRuns(runs []bus.RunRecord) ([]byte, error) {
	if runs == nil {
		runs = []bus.RunRecord{}
	}
	return json.Marshal(runs)
}
