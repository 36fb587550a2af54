package worker_test

import (
	"encoding/json"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/metrics"
	"github.com/agentfleet/agentfleet/worker"
	"github.com/agentfleet/agentfleet/worker/internal/keys"
)

// span is when a run ran, as its events say: its last run_started to its
// run_finished (Unix ms).
type span struct{ start, end int64 }

// runSpan follows a run to its end and returns its span; it fails the
// test unless the run succeeded.
func runSpan(t *testing.T, f *fleettest.Fleet, id string) span {
	t.Helper()
	var s span
	for _, env := range f.Follow(id) {
		ev := fleettest.Decode(t, env)
		switch ev.Type {
		case bus.EventRunStarted:
			s.start = env.TS
		case bus.EventRunFinished:
			if ev.RunFinished.Status != bus.StatusSucceeded {
				t.Fatalf("run %s ended %s (%s): %s", id, ev.RunFinished.Status, ev.RunFinished.Reason, ev.RunFinished.Error)
			}
			s.end = env.TS
		}
	}
	return s
}

// maxOverlap is the most spans running at one instant.
func maxOverlap(spans []span) int {
	type edge struct {
		at   int64
		step int
	}
	var edges []edge
	for _, s := range spans {
		edges = append(edges, edge{s.start, 1}, edge{s.end, -1})
	}
	// An end before a start at the same millisecond: the next run's
	// start follows its predecessor's stored run_finished.
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].step < edges[j].step
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.step
		most = max(most, n)
	}
	return most
}

// Across three workers with free slots, never more runs of a key run at
// once than its limit, as the events show; the runs that waited were
// parked (no slot held) and woken when a place came free, and finish.
func TestConcurrencyKeyLimitAcrossWorkers(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	reg := prometheus.NewRegistry()
	obs := worker.MetricsObserver(metrics.New(reg, metrics.Config{}))
	for range 3 {
		f.StartWorker(worker.Config{Concurrency: 4, KeyLimits: []worker.KeyLimit{{Pattern: "tenant-*", Limit: 1}}, Observer: obs})
	}
	var keyed, capped []string
	for i := range 10 {
		req := sleepRun(fmt.Sprintf("k%d", i), 150*time.Millisecond)
		req.Concurrency = &bus.Concurrency{Key: "customer-42", Limit: 2}
		keyed = append(keyed, f.Submit("", req))
	}
	for i := range 4 {
		// The operator's default (1) caps the request's 3.
		req := sleepRun(fmt.Sprintf("t%d", i), 100*time.Millisecond)
		req.Concurrency = &bus.Concurrency{Key: "tenant-a", Limit: 3}
		capped = append(capped, f.Submit("", req))
	}
	for _, c := range []struct {
		runs  []string
		limit int
	}{{keyed, 2}, {capped, 1}} {
		var spans []span
		for _, id := range c.runs {
			spans = append(spans, runSpan(t, f, id))
		}
		if got := maxOverlap(spans); got != c.limit {
			t.Errorf("at most %d runs of a key ran at once; its limit is %d (%v)", got, c.limit, spans)
		}
	}
	woken := 0
	for _, id := range keyed {
		rec, err := f.Client.Status(fleettest.Context(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Attempt > 1 {
			woken++
		}
	}
	if woken == 0 {
		t.Error("no run of the key was parked and woken")
	}
	// Each woken run's wait is observed.
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	observed := uint64(0)
	for _, fam := range families {
		if fam.GetName() == "agentfleet_key_wait_seconds" {
			for _, m := range fam.GetMetric() {
				observed += m.GetHistogram().GetSampleCount()
			}
		}
	}
	if observed < uint64(woken) {
		t.Errorf("agentfleet_key_wait_seconds observed %d waits; %d runs of customer-42 alone were woken", observed, woken)
	}
}

// A key without a limit and without an operator default is a bad request
// that says so.
func TestConcurrencyKeyWithoutALimitIsABadRequest(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	req := fleettest.FauxRun("x", fleettest.Text("y"))
	req.Concurrency = &bus.Concurrency{Key: "nobody"}
	fin := f.WaitFinished(f.Submit("", req))
	if fin.Reason != bus.ReasonBadRequest {
		t.Fatalf("finished %s (%s): %s", fin.Status, fin.Reason, fin.Error)
	}
}

// watchRecord waits until the run's record satisfies ok.
func watchRecord(t *testing.T, f *fleettest.Fleet, run string, what string, ok func(*bus.RunRecord) bool) {
	t.Helper()
	ctx := fleettest.Context(t)
	kv, err := f.Client.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	var last *bus.RunRecord
	for {
		select {
		case e := <-w.Updates():
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			if rec, err := bus.DecodeRecord(e); err == nil {
				if last = rec; ok(rec) {
					return
				}
			}
		case <-ctx.Done():
			t.Fatalf("record of %s never %s; last %+v", run, what, last)
		}
	}
}

// keyed is req with concurrency key K, limit 1.
func keyed(req *bus.RunRequest) *bus.RunRequest {
	req.Concurrency = &bus.Concurrency{Key: "K", Limit: 1}
	return req
}

// holdKey submits a run that holds K for d and waits until it runs.
func holdKey(t *testing.T, f *fleettest.Fleet, d time.Duration) string {
	t.Helper()
	req := keyed(sleepRun("holder", d))
	req.Tools = []string{"sleep"}
	h := f.Submit("", req)
	watchRecord(t, f, h, "running", func(rec *bus.RunRecord) bool { return rec.State == bus.StateRunning && rec.Parked == nil })
	return h
}

// parkedForKey waits until run is parked in line for its key.
func parkedForKey(t *testing.T, f *fleettest.Fleet, run string) {
	t.Helper()
	watchRecord(t, f, run, "parked for its key", func(rec *bus.RunRecord) bool {
		return rec.Parked != nil && rec.Waiting != nil && rec.Waiting.For == bus.WaitingKey
	})
}

// A line behind a dead place (here the place a worker killed after
// run_finished leaves) moves with no later run of the key: the workers'
// key sweep grants it (review55b #1).
func TestKeyLineMovesWithoutALaterTaker(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default"}, AckWait: 2 * time.Second}})
	f.StartWorker(worker.Config{AckWait: 2 * time.Second}) // grace 4 s
	ctx := fleettest.Context(t)
	kv, err := f.Client.JetStream().KeyValue(ctx, f.Client.Names().KeysBucket())
	if err != nil {
		t.Fatal(err)
	}
	ent := keys.Entry{Key: "default/K", Limit: 1, Holds: []keys.Place{{Run: "ghost", At: time.Now()}}}
	b, _ := json.Marshal(ent)
	if _, err := kv.Create(ctx, keys.Name("default/K"), b); err != nil {
		t.Fatal(err)
	}
	id := f.Submit("", keyed(sleepRun("b", 10*time.Millisecond)))
	parkedForKey(t, f, id)
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("run %s ended %s (%s): %s", id, fin.Status, fin.Reason, fin.Error)
	}
}

// A holder parked for its approval gives its place up (keys.go,
// invariant 4): the run in line behind it runs without waiting for the
// answer (review55b #1).
func TestKeyHolderParkedForApprovalGivesUpItsPlace(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	// The default AckWait: the key sweep's grace (2 min) is past the test.
	f.StartWorker(worker.Config{Concurrency: 4, ParkAfter: 500 * time.Millisecond})
	holder := keyed(sleepRun("holder", 10*time.Millisecond))
	holder.Tools = []string{"sleep"}
	holder.Approval = &bus.Approval{Tools: []string{"sleep"}}
	h := f.Submit("", holder)
	watchRecord(t, f, h, "running", func(rec *bus.RunRecord) bool { return rec.State == bus.StateRunning && rec.Parked == nil })
	b := f.Submit("", keyed(fleettest.FauxRun("b", fleettest.Text("done"))))
	watchRecord(t, f, h, "parked", func(rec *bus.RunRecord) bool { return rec.Parked != nil })
	if fin := f.WaitFinished(b); fin.Status != bus.StatusSucceeded {
		t.Fatalf("run %s ended %s (%s): %s", b, fin.Status, fin.Reason, fin.Error)
	}
}

// The time a run waits in line for its key does not count against its
// timeout (review55b #2).
func TestKeyWaitIsNotCountedAgainstTheTimeout(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4})
	holdKey(t, f, 5*time.Second)
	req := keyed(fleettest.FauxRun("b", fleettest.Text("done")))
	req.Limits = &bus.Limits{TimeoutSeconds: 3}
	b := f.Submit("", req)
	parkedForKey(t, f, b)
	if fin := f.WaitFinished(b); fin.Status != bus.StatusSucceeded {
		t.Fatalf("run %s (3 s timeout, ~5 s in line) ended %s (%s): %s", b, fin.Status, fin.Reason, fin.Error)
	}
	rec, err := f.Client.Status(fleettest.Context(t), b)
	if err != nil || rec.WaitedMs < 1000 {
		t.Fatalf("record %+v, %v: want the key wait in waitedMs", rec, err)
	}
}

// A run granted its place after its kept copy aged out of AGENTS_PARKED
// ends failed gave_up, and the key goes on to the next run
// (review55b #3).
func TestKeyWaiterWhoseCopyAgedOutEndsAndFreesTheKey(t *testing.T) {
	t.Parallel()
	streams := bus.StreamsConfig{Queues: []string{"default"}, AckWait: 2 * time.Second, RequestsMaxAge: 3 * time.Second}
	f := fleettest.Start(t, fleettest.Options{Streams: streams})
	f.StartWorker(worker.Config{Concurrency: 4, AckWait: 2 * time.Second, Streams: streams})
	holdKey(t, f, 6*time.Second)
	b := f.Submit("", keyed(fleettest.FauxRun("b", fleettest.Text("done"))))
	parkedForKey(t, f, b)
	if fin := f.WaitFinished(b); fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonGaveUp {
		t.Fatalf("run %s (copy aged out) ended %s (%s): %s", b, fin.Status, fin.Reason, fin.Error)
	}
	c := f.Submit("", keyed(fleettest.FauxRun("c", fleettest.Text("done"))))
	if fin := f.WaitFinished(c); fin.Status != bus.StatusSucceeded {
		t.Fatalf("run %s after it ended %s (%s): %s", c, fin.Status, fin.Reason, fin.Error)
	}
}

// An abort ends a run in line for its key at once, not once the key
// frees, and takes it out of the line (review55b #5).
func TestAbortOfARunInLineForItsKeyEndsIt(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4})
	ctx := fleettest.Context(t)
	holdKey(t, f, 30*time.Second)
	b := f.Submit("", keyed(sleepRun("b", 10*time.Millisecond)))
	parkedForKey(t, f, b)
	if _, err := f.Client.Abort(ctx, b, "not needed"); err != nil {
		t.Fatal(err)
	}
	if fin := f.WaitFinished(b); fin.Status != bus.StatusAborted {
		t.Fatalf("run %s ended %s (%s): %s", b, fin.Status, fin.Reason, fin.Error)
	}
	kv, err := f.Client.JetStream().KeyValue(ctx, f.Client.Names().KeysBucket())
	if err != nil {
		t.Fatal(err)
	}
	// The line is left after run_finished is stored: watch for it.
	watch, err := kv.Watch(ctx, keys.Name("default/K"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watch.Stop() }()
	var last []byte
	for {
		select {
		case e := <-watch.Updates():
			if e == nil {
				continue
			}
			var ent keys.Entry
			if last = e.Value(); json.Unmarshal(last, &ent) == nil && len(ent.Waiting) == 0 && len(ent.Holds) == 1 {
				return
			}
		case <-ctx.Done():
			t.Fatalf("key entry %s: want the holder only", last)
		}
	}
}

// A run in line for its key is in the listing of waiting runs (the
// waiting-run index), not only in one asking for key waits (review55b #7).
func TestRunInLineForItsKeyIsListedAsWaiting(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4})
	ctx := fleettest.Context(t)
	holdKey(t, f, 20*time.Second)
	b := f.Submit("", keyed(sleepRun("b", 10*time.Millisecond)))
	parkedForKey(t, f, b)
	// The index entry follows the record: wait for it.
	cons, err := f.Client.JetStream().OrderedConsumer(ctx, f.Client.Names().WaitingStream(),
		jetstream.OrderedConsumerConfig{FilterSubjects: []string{f.Client.Names().WaitingEntry("default", b)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second)); err != nil {
		t.Fatalf("no waiting-index entry for %s: %v", b, err)
	}
	page, err := f.Client.ListPage(ctx, bus.ListOptions{State: bus.StateWaiting})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range page.Records {
		if r.ID == b && r.Waiting != nil && r.Waiting.For == bus.WaitingKey {
			return
		}
	}
	t.Fatalf("run %s, in line for its key, not in the listing of waiting runs (%d listed)", b, len(page.Records))
}

// A holder parked for its approval and answered while its key is full
// waits in line, then runs its approved call (keys.go, invariant 4).
func TestKeyHolderAnsweredWhileItsKeyIsFullRunsWhenGranted(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4, ParkAfter: 500 * time.Millisecond})
	ctx := fleettest.Context(t)
	holder := keyed(sleepRun("holder", 10*time.Millisecond))
	holder.Tools = []string{"sleep"}
	holder.Approval = &bus.Approval{Tools: []string{"sleep"}}
	h := f.Submit("", holder)
	watchRecord(t, f, h, "parked", func(rec *bus.RunRecord) bool { return rec.Parked != nil })
	b := keyed(sleepRun("b", 5*time.Second))
	b.Tools = []string{"sleep"}
	bid := f.Submit("", b)
	watchRecord(t, f, bid, "running", func(rec *bus.RunRecord) bool { return rec.State == bus.StateRunning && rec.Parked == nil })
	if _, err := f.Client.Answer(ctx, h, bus.ApprovalAnswer{ToolCallID: "s", Decision: bus.DecisionApprove, By: "alice"}); err != nil {
		t.Fatal(err)
	}
	parkedForKey(t, f, h)
	if fin := f.WaitFinished(h); fin.Status != bus.StatusSucceeded {
		t.Fatalf("holder %s ended %s (%s): %s", h, fin.Status, fin.Reason, fin.Error)
	}
	if fin := f.WaitFinished(bid); fin.Status != bus.StatusSucceeded {
		t.Fatalf("b %s ended %s (%s): %s", bid, fin.Status, fin.Reason, fin.Error)
	}
}

// An approve sent to a run in line for its key does not wake it (it would
// only park again, a new attempt each time); its abort does, once
// (review55b #5).
func TestApproveOfARunInLineForItsKeyDoesNotWakeIt(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4})
	ctx := fleettest.Context(t)
	holdKey(t, f, 30*time.Second)
	b := f.Submit("", keyed(sleepRun("b", 10*time.Millisecond)))
	parkedForKey(t, f, b)
	for range 3 {
		if _, err := f.Client.Answer(ctx, b, bus.ApprovalAnswer{ToolCallID: "x", Decision: bus.DecisionApprove}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.Client.Abort(ctx, b, "not needed"); err != nil {
		t.Fatal(err)
	}
	if fin := f.WaitFinished(b); fin.Status != bus.StatusAborted {
		t.Fatalf("run %s ended %s (%s): %s", b, fin.Status, fin.Reason, fin.Error)
	}
	rec, err := f.Client.Status(ctx, b)
	if err != nil || rec.Attempt != 2 {
		t.Fatalf("final record attempt %d (%v): want 2, the abort's wake only", rec.Attempt, err)
	}
}
