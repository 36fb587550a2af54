package worker_test

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/metrics"
	"github.com/agentfleet/agentfleet/worker"
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
