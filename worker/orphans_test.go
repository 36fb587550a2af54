package worker_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/worker"
)

// publishJunk stores n requests on subjects with literal wildcard tokens
// (agents.submit.<queue>.> and .*, in turn) and returns how many the
// stream took.
func publishJunk(ctx context.Context, t *testing.T, c *bus.Client, queue string, n int) int {
	t.Helper()
	js := c.JetStream()
	var futures []jetstream.PubAckFuture
	for i := range n {
		subj := c.Names().Submit(queue, ">")
		if i%2 == 1 {
			subj = c.Names().Submit(queue, "*")
		}
		f, err := js.PublishAsync(subj, []byte(`{"prompt":"junk"}`))
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	stored := 0
	for _, f := range futures {
		select {
		case <-f.Ok():
			stored++
		case err := <-f.Err():
			t.Fatalf("junk request: %v", err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	return stored
}

// waitRunsStreamEmpty waits, up to d, until AGENTS_RUNS holds nothing and
// the queue's consumer has nothing pending or unacknowledged.
func waitRunsStreamEmpty(t *testing.T, c *bus.Client, queue string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second) // d may exceed fleettest.Context's
	defer cancel()
	n := c.Names()
	s, err := c.JetStream().Stream(ctx, n.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	cons, err := c.JetStream().Consumer(ctx, n.RunsStream(), n.Consumer(queue))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(d); ; {
		si, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if si.State.Msgs == 0 && ci.NumPending == 0 && ci.NumAckPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s AGENTS_RUNS keeps %d requests; the consumer has %d pending, %d unacknowledged",
				d, si.State.Msgs, ci.NumPending, ci.NumAckPending)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Requests published on literal wildcard tokens are delivered and
// terminated with a logged reason, without a log line each (the first of
// an interval, then a count); a real run among them runs.
func TestRequestsOnLiteralWildcardTokensAreRemoved(t *testing.T) {
	// Not parallel: its bound (2000 requests in 5 s) is a rate.
	f := fleettest.Start(t, fleettest.Options{})
	logs := &logbuf.Buffer{}
	w := f.StartWorker(worker.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	ctx := fleettest.Context(t)
	stored := publishJunk(ctx, t, f.Client, bus.DefaultQueue, 1000)
	id := f.Submit("", fleettest.FauxRun("hi", fleettest.Text("hello")))
	stored += publishJunk(ctx, t, f.Client, bus.DefaultQueue, 1000)
	if stored != 2000 {
		t.Fatalf("the stream took %d of 2000 junk requests", stored)
	}
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("the run among the junk: %s/%s", fin.Status, fin.Reason)
	}
	// Well within the worker's first sweep (orphans.go), 10 s after its start.
	waitRunsStreamEmpty(t, f.Client, bus.DefaultQueue, 5*time.Second)
	w.Stop() // the count of the interval in progress is logged
	lines, logged := 0, 0
	for _, line := range strings.Split(logs.String(), "\n") {
		switch {
		case strings.Contains(line, "msg=\"request with an invalid subject terminated\""):
			lines++
			logged++
		case strings.Contains(line, "msg=\"more requests with an invalid subject terminated\""):
			_, count, _ := strings.Cut(line, " count=")
			k, err := strconv.Atoi(strings.Fields(count)[0])
			if err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			lines++
			logged += k
		}
	}
	// An interval is 10 s: the test takes a few.
	if logged != stored || lines > 6 {
		t.Fatalf("the worker logged %d terminations in %d lines for %d junk requests", logged, lines, stored)
	}
}

// Requests a 1.7 queue consumer (filter agents.submit.<queue>.*) passed
// over are behind it for good; 1.8 workers remove them at their start,
// with a logged reason, each once however many sweep at the same time,
// and leave the queue's real requests alone.
func TestPassedOverRequestsAreSwept(t *testing.T) {
	// Not parallel: 900 deletes are a burst of their own.
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	js, n := c.JetStream(), c.Names()
	cons, err := js.CreateOrUpdateConsumer(ctx, n.RunsStream(), jetstream.ConsumerConfig{
		Durable: n.Consumer(bus.DefaultQueue), FilterSubject: n.SubmitFilter(bus.DefaultQueue),
		AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5, AckWait: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	const junkEach = 300
	for i := range 4 {
		if i > 0 {
			for range junkEach {
				if _, err := js.Publish(ctx, n.Submit(bus.DefaultQueue, ">"), []byte(`{}`)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := c.SubmitRaw(ctx, bus.DefaultQueue, "before"+string(rune('a'+i)), []byte(`{"prompt":"x"}`)); err != nil {
			t.Fatal(err)
		}
	}
	// A 1.7 worker takes the real requests: its consumer moves past the
	// junk between them.
	taken := 0
	for taken < 4 {
		b, err := cons.Fetch(10, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range b.Messages() {
			got++
			if strings.HasSuffix(m.Subject(), ">") {
				t.Fatalf("the 1.7 filter delivered %s", m.Subject())
			}
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
			taken++
		}
		if got == 0 {
			t.Fatalf("the 1.7 consumer delivered %d of the 4 requests", taken)
		}
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ci.NumPending != 0 || ci.NumAckPending != 0 {
		t.Fatalf("the 1.7 consumer has %d pending, %d unacknowledged", ci.NumPending, ci.NumAckPending)
	}
	logs := &logbuf.Buffer{}
	for range 2 {
		f.StartWorker(worker.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	}
	id := f.Submit("", fleettest.FauxRun("hi", fleettest.Text("hello")))
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("a run after the sweep: %s/%s", fin.Status, fin.Reason)
	}
	// The two workers' sweeps read and delete 900 requests one round trip
	// each: on a loaded machine under -race that takes well over 5 s (9 s
	// and 12 s seen). The bounds only guard against a sweep that never
	// comes; what is asserted is the outcome: every passed-over request
	// removed, each counted once.
	waitRunsStreamEmpty(t, c, bus.DefaultQueue, 2*time.Minute)
	// A sweep logs what it removed as it ends, just after its last delete.
	for deadline := time.Now().Add(time.Minute); ; {
		removed := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "requests with an invalid subject removed") {
				_, count, _ := strings.Cut(line, " removed=")
				k, err := strconv.Atoi(strings.Fields(count)[0])
				if err != nil {
					t.Fatalf("log line %q: %v", line, err)
				}
				removed += k
			}
		}
		if strings.Contains(logs.String(), "delete failed") || removed > 3*junkEach {
			t.Fatalf("the workers logged %d removals for %d requests:\n%s", removed, 3*junkEach, logs.String())
		}
		if removed == 3*junkEach {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the workers logged %d removals for %d requests:\n%s", removed, 3*junkEach, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A runs stream that takes every queue (an older version's
// agents.submit.*.*) stores what no queue's consumer will deliver: the
// worker says so at start.
func TestWildcardRunsStreamIsWarnedAbout(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{NoStreams: true})
	ctx, n := fleettest.Context(t), f.Client.Names()
	if _, err := f.Client.JetStream().CreateStream(ctx, jetstream.StreamConfig{
		Name: n.RunsStream(), Subjects: []string{n.SubmitAll()}, Retention: jetstream.WorkQueuePolicy,
	}); err != nil {
		t.Fatal(err)
	}
	logs := &logbuf.Buffer{}
	f.StartWorker(worker.Config{Queues: []string{bus.DefaultQueue}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if !strings.Contains(logs.String(), "AGENTS_RUNS takes requests for every queue") {
		t.Fatalf("no warning for a stream with %s:\n%s", n.SubmitAll(), logs.String())
	}
}

// A worker that does not ensure the streams (SkipEnsureStreams) says at
// start which settings keep messages from their runs: a control stream
// that refuses past its per-subject cap, a queue filter that passes
// requests over.
func TestOldStreamSettingsAreWarnedAbout(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	n := c.Names()
	s, err := c.JetStream().Stream(ctx, n.ControlStream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.DiscardNewPerSubject = true
	if _, err := c.JetStream().UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	cons, err := c.JetStream().Consumer(ctx, n.RunsStream(), n.Consumer(bus.DefaultQueue))
	if err != nil {
		t.Fatal(err)
	}
	cc := cons.CachedInfo().Config
	cc.FilterSubject = n.SubmitFilter(bus.DefaultQueue)
	if _, err := c.JetStream().UpdateConsumer(ctx, n.RunsStream(), cc); err != nil {
		t.Fatal(err)
	}
	logs := &logbuf.Buffer{}
	f.StartWorker(worker.Config{SkipEnsureStreams: true, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	for _, want := range []string{"AGENTS_CONTROL refuses a run's control messages", "a queue consumer's filter passes some requests over"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no warning %q:\n%s", want, logs.String())
		}
	}
}
