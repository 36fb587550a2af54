package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// The fleet page's history. Every sampleEvery the console samples each
// queue (its depth and runs in flight from its consumer, the runs that
// finished from the record watch) into a small stream of its own,
// AGENTS_CONSOLE (subject agents.console.samples, one hour of samples), so
// a restarted console shows the last hour, and consoles of one fleet share
// it: a slot's sample is stored once (its Nats-Msg-Id is the slot).

const (
	defaultSampleEvery = 10 * time.Second
	sampleKeep         = time.Hour
)

// fleetSample is one slot of the history.
type fleetSample struct {
	// T is the end of the slot, Unix ms; Every its length in ms.
	T     int64 `json:"t"`
	Every int64 `json:"every"`
	// Span is the time in ms the finished counts cover: Every, more after
	// a missed slot. Partial: they cover only part of the slot (the
	// console started in it), so they make no rate.
	Span    int64         `json:"span,omitempty"`
	Partial bool          `json:"partial,omitempty"`
	Queues  []queueSample `json:"queues"`
}

// queueSample is a queue at the end of a slot, with the runs that finished
// in it.
type queueSample struct {
	Queue    string `json:"queue"`
	Depth    uint64 `json:"depth"`
	InFlight int    `json:"inFlight"`
	queueCounts
}

// samplesStream and samplesSubject name the history's stream for the
// client's prefix: AGENTS_CONSOLE and agents.console.samples.
func samplesStream(n bus.Names) string {
	return strings.TrimSuffix(n.EventsStream(), "_EVENTS") + "_CONSOLE"
}

func samplesSubject(n bus.Names) string { return n.Prefix() + ".console.samples" }

type sampler struct {
	client *bus.Client
	log    *slog.Logger
	every  time.Duration
	queues func(context.Context) ([]queueInfo, error)
	counts func(end time.Time) (map[string]queueCounts, time.Time)

	mu      sync.Mutex
	samples []fleetSample // oldest first
	// problem says why samples are not stored (kept in memory only).
	problem string
}

// history returns the samples of the last hour, oldest first.
func (s *sampler) history() (samples []fleetSample, problem string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.samples), s.problem
}

// run samples until ctx is done, at the end of each slot of wall-clock
// time (so that two consoles sample the same slots).
func (s *sampler) run(ctx context.Context) {
	st, err := s.ensureStream(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("the fleet history is not stored (kept in memory)", "stream", samplesStream(s.client.Names()), "err", err)
		s.mu.Lock()
		s.problem = "the history is not stored: " + err.Error()
		s.mu.Unlock()
	} else if err := s.load(ctx, st); err != nil && ctx.Err() == nil {
		s.log.Warn("reading the fleet history", "err", err)
	}
	for {
		next := time.Now().Truncate(s.every).Add(s.every)
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		s.sample(ctx, next, st != nil)
	}
}

// ensureStream creates the history's stream, or finds it.
func (s *sampler) ensureStream(ctx context.Context) (jetstream.Stream, error) {
	names := s.client.Names()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	js := s.client.JetStream()
	st, err := js.CreateStream(cctx, jetstream.StreamConfig{
		Name:        samplesStream(names),
		Description: "agentfleet console: queue depths and finished runs every 10 s, for the fleet page",
		Subjects:    []string{samplesSubject(names)},
		Storage:     jetstream.FileStorage,
		MaxAge:      sampleKeep,
		MaxMsgs:     2 * int64(sampleKeep/time.Second),
		MaxBytes:    16 << 20,
		Discard:     jetstream.DiscardOld,
		Duplicates:  2 * time.Minute,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Made by another console (or with other limits): used as it is.
		return js.Stream(cctx, samplesStream(names))
	}
	return st, err
}

// load reads the stored samples of the last hour.
func (s *sampler) load(ctx context.Context, st jetstream.Stream) error {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err := st.Info(lctx)
	if err != nil {
		return err
	}
	var got []fleetSample
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(lctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		var fs fleetSample
		if json.Unmarshal(m.Data, &fs) == nil && fs.T > 0 {
			got = append(got, fs)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = keepRecent(append(got, s.samples...), time.Now())
	return nil
}

// sample takes one slot's sample and stores it.
func (s *sampler) sample(ctx context.Context, end time.Time, store bool) {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	qs, err := s.queues(sctx)
	if err != nil && ctx.Err() == nil {
		s.log.Debug("sampling the queues", "err", err)
	}
	counts, since := s.counts(end)
	fs := fleetSample{T: end.UnixMilli(), Every: s.every.Milliseconds(), Queues: []queueSample{}}
	// Partial: counting began inside this slot, or off a slot boundary
	// (the console's first slot, when its sampler's first timer came
	// after the boundary: counts of more than a slot, no whole span).
	if since.IsZero() || since.After(end.Add(-s.every)) || !since.Equal(since.Truncate(s.every)) {
		fs.Partial = true
	} else {
		fs.Span = end.Sub(since).Milliseconds()
	}
	for _, q := range qs {
		fs.Queues = append(fs.Queues, queueSample{Queue: q.Queue, Depth: q.Depth, InFlight: q.InFlight, queueCounts: counts[q.Queue]})
		delete(counts, q.Queue)
	}
	for q, c := range counts { // a queue whose consumer is gone
		fs.Queues = append(fs.Queues, queueSample{Queue: q, queueCounts: c})
	}
	slices.SortFunc(fs.Queues, func(a, b queueSample) int { return strings.Compare(a.Queue, b.Queue) })
	if store {
		data, _ := json.Marshal(fs)
		_, err := s.client.JetStream().Publish(sctx, samplesSubject(s.client.Names()), data,
			jetstream.WithMsgID("slot-"+strconv.FormatInt(fs.T, 10)))
		if err != nil && ctx.Err() == nil {
			s.log.Warn("storing the fleet history", "err", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.samples); n == 0 || s.samples[n-1].T < fs.T {
		s.samples = keepRecent(append(s.samples, fs), end)
	}
}

// keepRecent sorts samples by time, drops those older than sampleKeep and
// keeps one per slot.
func keepRecent(samples []fleetSample, now time.Time) []fleetSample {
	slices.SortStableFunc(samples, func(a, b fleetSample) int { return cmp.Compare(a.T, b.T) })
	samples = slices.CompactFunc(samples, func(a, b fleetSample) bool { return a.T == b.T })
	cut := now.Add(-sampleKeep).UnixMilli()
	i := 0
	for i < len(samples) && samples[i].T <= cut {
		i++
	}
	return slices.Clone(samples[i:])
}
