package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
)

// TestMixBenchOnThreeWorkers runs submit bench's mixed-load mode against
// three worker processes of one queue: a keyed group never has more runs
// of its key at once than its limit (from the events) and reaches it,
// and high-priority runs submitted behind a normal backlog start before
// most of it.
func TestMixBenchOnThreeWorkers(t *testing.T) {
	// Not parallel: its workers add a queue to the runs stream, and two
	// workers adding queues at once may lose one's (EnsureStreams
	// updates the subjects without compare-and-set).
	queue := "mixbench"
	for i := range 3 {
		stop, _, err := startWorkerProcess(filepath.Join(t.TempDir(), "worker.log"), nil,
			"--nats", fleet.url, "--queue", queue, "--concurrency", "4", "--worker-id", fmt.Sprintf("mix-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := stop(); err != nil {
				t.Errorf("worker: %v", err)
			}
		})
	}
	out, errOut, code := submit(t, "bench", "--queue", queue, "--json", "--mix-sleep", "0.1",
		"--group", "keyed:24,key=cust-1,limit=2", "--group", "backlog:60", "--group", "urgent:4,priority=high,after=backlog")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	var res mixResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("bench --group: %s", out)
	if got := res.KeyMaxConcurrent["cust-1"]; got != 2 {
		t.Errorf("key cust-1 (limit 2): at most %d runs at once", got)
	}
	for name, g := range res.Groups {
		if g.Started != g.Runs || g.Failed != 0 {
			t.Errorf("group %s: %d of %d started, %d failed", name, g.Started, g.Runs, g.Failed)
		}
	}
	if h, n := res.Priorities["high"], res.Groups["backlog"].StartLatencyMs; h.Max >= n.Max {
		t.Errorf("high runs started at most %.0f ms after submit, the backlog's last %.0f ms", h.Max, n.Max)
	}
}

// The most runs of a key at once counts every attempt's span and runs
// still running at the end, not only finished runs' last attempts
// (review55b #10).
func TestMixKeySpansCountEveryAttempt(t *testing.T) {
	crashed := &mixRun{} // attempt 1 ran 100..200 (its worker died), attempt 2 200..300
	crashed.event(bus.EventRunStarted, 100)
	crashed.event(bus.EventRunStarted, 200)
	crashed.event(bus.EventRunFinished, 300)
	parked := &mixRun{} // ran 120..130, parked (its place given up), ran again 400..500
	parked.event(bus.EventRunStarted, 120)
	parked.event(bus.EventRunParked, 130)
	parked.event(bus.EventRunStarted, 400)
	parked.event(bus.EventRunFinished, 500)
	running := &mixRun{} // still running when the bench ends at 1000
	running.event(bus.EventRunStarted, 110)
	var spans [][2]int64
	for _, r := range []*mixRun{crashed, parked, running} {
		spans = append(spans, r.runSpans(1000)...)
	}
	if n := mostAtOnce(spans); n != 3 {
		t.Fatalf("most at once %d over %v, want 3 (at 120..130)", n, spans)
	}
	if !crashed.done || running.done {
		t.Fatalf("done: crashed %v, running %v", crashed.done, running.done)
	}
}

// TestTenantFairShareOnTwoWorkers runs the mixed-load mode against two
// worker processes: tenant B, submitting at a rate behind tenant A's
// backlog, is not stuck behind it (FIFO makes B's runs wait about as long
// as A's last, the bound below allows a quarter of that), and while two
// tenants both have a backlog their starts follow their weights (wa=2).
func TestTenantFairShareOnTwoWorkers(t *testing.T) {
	// Not parallel: see TestMixBenchOnThreeWorkers.
	queue := "fairbench"
	for i := range 2 {
		stop, _, err := startWorkerProcess(filepath.Join(t.TempDir(), "worker.log"), nil,
			"--nats", fleet.url, "--queue", queue, "--concurrency", "4", "--worker-id", fmt.Sprintf("fair-%d", i),
			"--tenant-weights", "wa=2")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := stop(); err != nil {
				t.Errorf("worker: %v", err)
			}
		})
	}
	bench := func(groups ...string) mixResult {
		t.Helper()
		args := []string{"bench", "--queue", queue, "--json", "--mix-sleep", "0.1"}
		for _, g := range groups {
			args = append(args, "--group", g)
		}
		out, errOut, code := submit(t, args...)
		if code != 0 {
			t.Fatalf("exit %d\n%s", code, errOut)
		}
		var res mixResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		t.Logf("bench --group: %s", out)
		for name, g := range res.Groups {
			if g.Started != g.Runs || g.Failed != 0 {
				t.Errorf("group %s: %d of %d started, %d failed", name, g.Started, g.Runs, g.Failed)
			}
		}
		return res
	}
	res := bench("a:400,tenant=ta", "b:20,tenant=tb,rate=10,after=a")
	if a, b := res.Tenants["ta"], res.Tenants["tb"]; b.Max >= a.Max/4 {
		t.Errorf("tenant tb's runs started up to %.0f ms after submit, behind ta's backlog (its last %.0f ms); want under a quarter", b.Max, a.Max)
	}
	res = bench("a:150,tenant=wa", "b:150,tenant=wb,after=a")
	a, b := res.TenantStartsTogether["wa"], res.TenantStartsTogether["wb"]
	if b < 20 || float64(a)/float64(b) < 1.5 || float64(a)/float64(b) > 2.7 {
		t.Errorf("while both had a backlog wa (weight 2) started %d runs and wb (weight 1) %d; want about 2:1", a, b)
	}
}
