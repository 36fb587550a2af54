package main

import (
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestApprovalsBenchSmall runs submit bench --approvals against a worker
// process of its own queue: every run waits, is approved and finishes;
// the wake latency and the worker's RSS (from its /metrics) are reported.
func TestApprovalsBenchSmall(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metrics := l.Addr().String()
	l.Close()
	queue := "apprbench"
	stop, _, err := startWorkerProcess(filepath.Join(t.TempDir(), "worker.log"), nil,
		"--nats", fleet.url, "--queue", queue, "--concurrency", "2", "--worker-id", "appr-bench", "--metrics-addr", metrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	url := "http://" + metrics + "/metrics"
	out, errOut, code := submit(t, "bench", "--approvals", "--runs", "20", "--queue", queue, "--worker-metrics", url, "--json")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	var res approvalsBenchResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Runs != 20 || res.Waiting != 20 || res.Refused != 0 || res.Finished != 20 || res.Failed != 0 {
		t.Errorf("runs %d, waiting %d, refused %d, finished %d, failed %d; want 20 of each but refused and failed", res.Runs, res.Waiting, res.Refused, res.Finished, res.Failed)
	}
	if w := res.WakeLatencyMs; w.P50 <= 0 || w.Max < w.P99 || w.P99 < w.P50 {
		t.Errorf("wake latency %+v", w)
	}
	if res.RSSIdle <= 0 || res.RSSWaitingLast <= 0 || res.RSSWaitingMax < res.RSSWaitingLast || res.RSSSamples < 2 {
		t.Errorf("RSS idle %d, waiting last %d max %d, %d samples", res.RSSIdle, res.RSSWaitingLast, res.RSSWaitingMax, res.RSSSamples)
	}
	t.Logf("bench --approvals: %s", out)
	// --parked: a worker parking after 1 s; answers go once all parked,
	// and the woken attempts resolve them.
	parkQueue := "apprbenchpark"
	stopPark, _, err := startWorkerProcess(filepath.Join(t.TempDir(), "worker-park.log"), nil,
		"--nats", fleet.url, "--queue", parkQueue, "--concurrency", "2", "--worker-id", "appr-bench-park", "--park-after", "1s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stopPark(); err != nil {
			t.Errorf("parking worker: %v", err)
		}
	})
	out, errOut, code = submit(t, "bench", "--approvals", "--parked", "--runs", "5", "--queue", parkQueue, "--json")
	if code != 0 {
		t.Fatalf("--parked: exit %d\n%s", code, errOut)
	}
	res = approvalsBenchResult{}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Waiting != 5 || res.Finished != 5 || res.Failed != 0 || res.ParkSeconds < 1 || res.WakeLatencyMs.P50 <= 0 {
		t.Errorf("--parked: %s", out)
	}
	table, errOut, code := submit(t, "bench", "--approvals", "--runs", "3", "--queue", queue)
	if code != 0 {
		t.Fatalf("table: exit %d\n%s", code, errOut)
	}
	for _, want := range []string{"3 waited", "answer stored->resolved", "p99", "not read (--worker-metrics)"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if _, errOut, code := submit(t, "bench", "--approvals", "--runs", "1", "--queue", queue, "--worker-metrics", "http://127.0.0.1:1/metrics"); code == 0 || !strings.Contains(errOut, "--worker-metrics") {
		t.Errorf("unreachable metrics: exit %d\n%s", code, errOut)
	}
}
