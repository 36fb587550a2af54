package eventpub

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
)

// Events in fast batches (batch.go), on a real stream: what the batch
// answers is applied to every run in it, and what it did not store is
// re-sent, once, in order.

// holdBatches keeps the worker's batches open until a publisher syncs or
// flushes: the test decides what goes in one batch.
func holdBatches(t *testing.T, w *testWorker) {
	t.Helper()
	if w.batch == nil {
		t.Fatal("the worker publishes no batches")
	}
	w.batch.mu.Lock()
	w.batch.every = time.Hour
	w.batch.mu.Unlock()
}

// commitNow ends the open batch, whoever's events it holds.
func (b *Batch) commitNow() {
	b.mu.Lock()
	ob := b.cur
	b.mu.Unlock()
	if ob != nil {
		b.commit(ob)
	}
}

// replies records the reply subject of each message published on subject.
func replies(t *testing.T, c *bus.Client, subject string) func(n int) []string {
	t.Helper()
	var mu sync.Mutex
	var got []string
	more := make(chan struct{}, 1)
	sub, err := c.Conn().Subscribe(subject, func(m *nats.Msg) {
		mu.Lock()
		got = append(got, m.Reply)
		mu.Unlock()
		select {
		case more <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	// Stored is not seen: the subscription's copies may still be on
	// their way, so wait for n of them (10s at most).
	return func(n int) []string {
		deadline := time.After(10 * time.Second)
		for {
			mu.Lock()
			have := slices.Clone(got)
			mu.Unlock()
			if len(have) >= n {
				return have
			}
			select {
			case <-more:
			case <-deadline:
				return have
			}
		}
	}
}

func TestEventsGoInOneBatchWithFewAnswers(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{}, nil)
	holdBatches(t, w)
	var answers atomic.Int64
	sub, err := c.Conn().Subscribe(w.batch.prefix+">", func(*nats.Msg) { answers.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	runs := []string{bus.NewRunID(), bus.NewRunID()}
	var sent []func(n int) []string
	var pubs []*Publisher
	for _, run := range runs {
		sent = append(sent, replies(t, c, w.names.Events(run)))
		p := newPublisher(w, run, 1, nil)
		pubs = append(pubs, p)
		started(t, p)
	}
	for i := 2; i <= 50; i++ {
		for _, p := range pubs {
			if _, err := p.Event("x", fmt.Appendf(nil, `{"type":"x","i":%d}`, i), Options{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, p := range pubs {
		if err := flushWithin(t, p); err != nil {
			t.Fatal(err)
		}
	}
	want := fmt.Sprint(seqsTo(50))
	for i, run := range runs {
		if got := fmt.Sprint(storedSeqs(t, c, run)); got != want {
			t.Fatalf("run %d stored %s, want %s", i, got, want)
		}
		r := sent[i](50)
		if len(r) != 50 {
			t.Fatalf("run %d: %d messages seen, want 50", i, len(r))
		}
		if strings.HasSuffix(r[0], ".$FI") {
			t.Errorf("run %d: run_started went in a batch (%s): it carries a message id", i, r[0])
		}
		for j, reply := range r[1:] {
			if !strings.HasSuffix(reply, ".$FI") || !strings.HasPrefix(reply, w.batch.prefix) {
				t.Fatalf("run %d: event %d sent with reply %q, not in a batch", i, j+2, reply)
			}
		}
	}
	// 98 events in one batch: its first flow ack and its commit ack (and a
	// flow ack at 256 messages, not reached), where plain publishing has 98.
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	if n := answers.Load(); n > 3 {
		t.Errorf("%d batch answers for 98 events in one batch, want at most 3", n)
	}
}

// started publishes run_started and waits for its ack: until then the
// run's events go singly (see TestNoBatchBehindAnUnacknowledgedSingleEvent).
func started(t *testing.T, p *Publisher) {
	t.Helper()
	publishN(t, p, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

// ensureStreams creates the streams as a worker does.
func ensureStreams(t *testing.T, c *bus.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
}

// updateEventsStream changes the events stream's configuration, as an
// operator may.
func updateEventsStream(t *testing.T, c *bus.Client, change func(*jetstream.StreamConfig)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := c.JetStream().Stream(ctx, c.Names().EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	change(&cfg)
	if _, err := c.JetStream().UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// storeTen publishes run_started, waits for its ack, publishes events 2
// to 10 and checks that the run's subject holds 1 to 10, once each.
func storeTen(t *testing.T, c *bus.Client, p *Publisher) {
	t.Helper()
	started(t, p)
	for i := 2; i <= 10; i++ {
		if _, err := p.Event("x", fmt.Appendf(nil, `{"type":"x","i":%d}`, i), Options{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := flushWithin(t, p); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(storedSeqs(t, c, p.run)), fmt.Sprint(seqsTo(10)); got != want {
		t.Fatalf("stored %s, want %s", got, want)
	}
}

func seqsTo(n uint64) []uint64 {
	s := make([]uint64, n)
	for i := range s {
		s[i] = uint64(i) + 1
	}
	return s
}

// A message the stream refuses ends the batch for every run in it: the
// runs behind it re-send their events, each stored once and in order,
// and the run whose event is refused fails.
func TestRefusedEventInABatchIsReSentForTheOthers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		before int // events of the other run in the batch before the refused one
	}{
		{"first in its batch", 0},
		{"in the middle", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, c := startInternal(t, testConfig{}, nil)
			holdBatches(t, w)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			// An operator's message size limit below the worker's.
			updateEventsStream(t, c, func(cfg *jetstream.StreamConfig) { cfg.MaxMsgSize = 2000 })
			failed := make(chan error, 1)
			big := newPublisher(w, bus.NewRunID(), 1, func(err error) { failed <- err })
			other := newPublisher(w, bus.NewRunID(), 1, nil)
			publishN(t, big, 1)
			publishN(t, other, 1)
			if err := big.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if err := other.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			n := 2
			for ; n < 2+tc.before; n++ {
				if _, err := other.Event("x", fmt.Appendf(nil, `{"type":"x","i":%d}`, n), Options{}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := big.Event("x", []byte(`{"type":"x","pad":"`+strings.Repeat("p", 3000)+`"}`), Options{}); err != nil {
				t.Fatal(err)
			}
			for ; n <= 12; n++ {
				if _, err := other.Event("x", fmt.Appendf(nil, `{"type":"x","i":%d}`, n), Options{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := flushWithin(t, other); err != nil {
				t.Fatalf("the other run: %v", err)
			}
			if got, want := fmt.Sprint(storedSeqs(t, c, other.run)), fmt.Sprint(seqsTo(12)); got != want {
				t.Fatalf("the other run stored %s, want %s", got, want)
			}
			err := flushWithin(t, big)
			if err == nil || !strings.Contains(err.Error(), "maximum") {
				t.Fatalf("the run with the refused event: flush %v, want the size refusal", err)
			}
			select {
			case <-failed:
			case <-ctx.Done():
				t.Fatal("the run with the refused event did not fail")
			}
			if got := fmt.Sprint(storedSeqs(t, c, big.run)); got != "[1]" {
				t.Fatalf("the refused run stored %s, want [1]", got)
			}
			waitNoHolds(t, w)
		})
	}
}

// answerTap stands in for the event batch's answer subscription: the
// answers keep says so are held back in kept, the others routed as they
// come; release routes held ones later, from the subscription's
// goroutine (the batch's answers are handled one at a time).
type answerTap struct {
	t      *testing.T
	w      *testWorker
	kept   chan *nats.Msg
	routed chan struct{}
}

const tapRelease = "Test-Release"

func tapAnswers(t *testing.T, w *testWorker, keep func(*nats.Msg) bool) *answerTap {
	t.Helper()
	if err := w.batch.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	a := &answerTap{t: t, w: w, kept: make(chan *nats.Msg, 8), routed: make(chan struct{}, 8)}
	sub, err := w.c.Conn().Subscribe(w.batch.prefix+">", func(m *nats.Msg) {
		switch {
		case m.Header.Get(tapRelease) != "":
			w.batch.route(m)
			a.routed <- struct{}{}
		case keep(m):
			a.kept <- m
		default:
			w.batch.route(m)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	w.batch.sub = sub
	return a
}

// release routes the held answers ms, in order, and waits until each is.
func (a *answerTap) release(ms ...*nats.Msg) {
	a.t.Helper()
	for _, m := range ms {
		m.Header = nats.Header{tapRelease: []string{"1"}}
		if err := a.w.c.Conn().PublishMsg(m); err != nil {
			a.t.Fatal(err)
		}
		within(a.t, a.routed, 20*time.Second, "a held answer routed")
	}
}

// refusalPair makes the stream refuse events over 2,000 bytes and returns
// two publishers whose first events are stored: big, which a test has
// send a refused event, and run, whose events share its batch.
func refusalPair(t *testing.T, ctx context.Context, w *testWorker) (big, run *Publisher) {
	t.Helper()
	updateEventsStream(t, w.c, func(cfg *jetstream.StreamConfig) { cfg.MaxMsgSize = 2000 })
	big = newPublisher(w, bus.NewRunID(), 1, func(error) {})
	run = newPublisher(w, bus.NewRunID(), 1, nil)
	publishN(t, big, 1)
	publishN(t, run, 1)
	for _, p := range []*Publisher{big, run} {
		if err := p.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return big, run
}

// keptRefusalPair is refusalPair on a worker whose batches are held open
// and whose batch answers are kept back while keeping is set (set here).
func keptRefusalPair(t *testing.T, ctx context.Context, w *testWorker) (tap *answerTap, keeping *atomic.Bool, big, run *Publisher) {
	t.Helper()
	holdBatches(t, w)
	keeping = new(atomic.Bool)
	keeping.Store(true)
	tap = tapAnswers(t, w, func(*nats.Msg) bool { return keeping.Load() })
	big, run = refusalPair(t, ctx, w)
	return tap, keeping, big, run
}

// refusalPairEnds flushes refusalPair's runs: run's subject holds want,
// big's flush fails with the size refusal, and no publisher is held.
func refusalPairEnds(t *testing.T, w *testWorker, run, big *Publisher, want string) {
	t.Helper()
	if err := flushWithin(t, run); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if got := fmt.Sprint(storedSeqs(t, w.c, run.run)); got != want {
		t.Fatalf("stored %s, want %s", got, want)
	}
	if err := flushWithin(t, big); err == nil || !strings.Contains(err.Error(), "maximum") {
		t.Fatalf("the run with the refused event: flush %v, want the size refusal", err)
	}
	waitNoHolds(t, w)
}

// A server that drops messages (its streams' ingest queues full, 429, as
// when it is overloaded) ends batches in the middle while later ones come:
// every run should still store its events once each, in order. Each run's
// first event carries a message id and goes singly; the others follow at
// once. Before events waited for a single send's answer (turnLocked),
// 3-6 of the 100 runs failed as stored out of order: a run's first event
// and the next ones, sent singly one behind the other, were dropped and
// stored respectively. Paused batches (too many open on the stream) send
// every event singly.
func TestRunsSurviveAServerDroppingMessages(t *testing.T) {
	t.Parallel()
	for _, paused := range []bool{false, true} {
		t.Run(fmt.Sprintf("paused=%v", paused), func(t *testing.T) {
			c, _ := startTestServerWith(t, natsembed.Options{StreamMaxBufferedMsgs: 64})
			var resent atomic.Int64
			w, _ := startInternalOn(t, c, testConfig{PublishAckTimeout: 5 * time.Second}, func(w *testWorker) {
				w.wire.onResend(func(uint64) { resent.Add(1) })
			})
			if paused {
				w.batch.pauseUntil.Store(time.Now().Add(time.Hour).UnixNano())
			}
			const runs, events = 100, 40
			pubs := make([]*Publisher, runs)
			var wg sync.WaitGroup
			errs := make(chan error, runs)
			for i := range pubs {
				pubs[i] = newPublisher(w, bus.NewRunID(), 1, nil)
				wg.Go(func() {
					p := pubs[i]
					for j := 1; j <= events; j++ {
						if _, err := p.Event("x", fmt.Appendf(nil, `{"type":"x","i":%d}`, j), Options{}); err != nil {
							errs <- fmt.Errorf("run %d event %d: %w", i, j, err)
							p.Abandon()
							return
						}
					}
					if err := flushWithin(t, p); err != nil {
						errs <- fmt.Errorf("run %d: %w", i, err)
					}
				})
			}
			wg.Wait()
			close(errs)
			var failed []string
			for err := range errs {
				failed = append(failed, err.Error())
			}
			if len(failed) > 0 {
				t.Fatalf("%d of %d runs failed, first: %s", len(failed), runs, failed[0])
			}
			w.batch.mu.Lock()
			answered := !w.batch.answered.IsZero()
			w.batch.mu.Unlock()
			if answered == paused {
				t.Fatalf("batches paused %v, a batch answered %v", paused, answered)
			}
			// The premise: the server dropped messages (thousands of
			// re-sends with batches; a few dozen paused, where events go
			// one at a time and the queue fills less).
			t.Logf("%d events re-sent", resent.Load())
			if !paused && resent.Load() == 0 {
				t.Fatal("nothing was re-sent: the server dropped nothing, and the test tested nothing")
			}
			want := fmt.Sprint(seqsTo(events))
			for i, p := range pubs {
				if got := fmt.Sprint(storedSeqs(t, c, p.run)); got != want {
					t.Fatalf("run %d stored %s", i, got)
				}
			}
		})
	}
}
