//go:build approvalload

package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// TestApprovalWaitingRunsHoldNoSlot: a worker process with --concurrency 2
// holds 200 runs waiting for approval while new 1-turn faux runs go
// through it with a submit -> run_finished p50 within 1.5x of the same
// worker's with none waiting, measured in this session. Behind the
// approvalload tag (about a minute):
//
//	go test -tags approvalload -run TestApprovalWaitingRunsHoldNoSlot -v ./cmd/submit/
func TestApprovalWaitingRunsHoldNoSlot(t *testing.T) {
	const waiting, samples = 200, 60
	queue := "apprcap"
	stop, _, err := startWorkerProcess(filepath.Join(t.TempDir(), "worker.log"), nil,
		"--nats", fleet.url, "--queue", queue, "--concurrency", "2", "--worker-id", "appr-cap")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	c := testClient(t)

	// p50 of submit -> run_finished of 1-turn runs, one at a time.
	measure := func(phase string) []time.Duration {
		var ds []time.Duration
		for i := range samples {
			req := fleettest.FauxRun("hi", fleettest.Text("hello"))
			req.ID = fmt.Sprintf("cap-%s-%d-%s", phase, i, bus.NewRunID()[:6])
			begin := time.Now()
			if _, err := c.Submit(ctx(t), queue, req); err != nil {
				t.Fatal(err)
			}
			tr, err := c.LoadTranscript(ctx(t), req.ID)
			if err != nil || tr.Finished == nil || tr.Finished.Status != bus.StatusSucceeded {
				t.Fatalf("run %s: %v %+v", req.ID, err, tr.Finished)
			}
			ds = append(ds, time.Since(begin))
		}
		return ds
	}
	p50 := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	countWaiting := func() int {
		recs, err := c.List(ctx(t), bus.ListOptions{State: bus.StateWaiting, Queue: queue})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range recs {
			if r.Waiting != nil && r.Waiting.For == bus.WaitingApproval {
				n++
			}
		}
		return n
	}
	var held []string
	waitCount := func(want int) {
		deadline := time.Now().Add(2 * time.Minute)
		for n := countWaiting(); n != want; n = countWaiting() {
			if time.Now().After(deadline) {
				var sample string
				if len(held) > 0 {
					rec, err := c.Status(ctx(t), held[0])
					sample = fmt.Sprintf("; run %s: %+v %v", held[0], rec, err)
				}
				t.Fatalf("%d runs wait for approval, want %d%s", n, want, sample)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	measure("warmup")
	before := measure("none")

	body := gatedRun(`{"tools":["calculator"]}`, calcCall, textReply("never"))
	begin := time.Now()
	for i := range waiting {
		id := fmt.Sprintf("cap-wait-%d-%s", i, bus.NewRunID()[:6])
		if _, err := c.SubmitRaw(ctx(t), queue, id, []byte(body)); err != nil {
			t.Fatal(err)
		}
		held = append(held, id)
	}
	waitCount(waiting)
	t.Logf("%d runs waiting for approval %s after their submit", waiting, time.Since(begin).Round(time.Millisecond))

	// The approvals listing reads each waiting run's events.
	lbegin := time.Now()
	ps, err := c.PendingApprovals(ctx(t), bus.ApprovalsOptions{Queue: queue})
	if err != nil || len(ps) != waiting {
		t.Fatalf("PendingApprovals: %d calls, %v", len(ps), err)
	}
	t.Logf("PendingApprovals of %d waiting runs: %s", waiting, time.Since(lbegin).Round(time.Millisecond))

	with := measure("waiting")
	if n := countWaiting(); n != waiting {
		t.Errorf("%d runs waiting after the measure, want %d", n, waiting)
	}
	for _, id := range held {
		if _, err := c.Abort(ctx(t), id, "capacity test done"); err != nil {
			t.Fatal(err)
		}
	}
	waitCount(0)
	after := measure("after")

	baseline := p50(append(slices.Clone(before), after...))
	got := p50(with)
	t.Logf("submit -> run_finished p50 over %d runs: none waiting %s (before %s, after %s), %d waiting %s (%.2fx)",
		samples, baseline, p50(before), p50(after), waiting, got, float64(got)/float64(baseline))
	if float64(got) > 1.5*float64(baseline) {
		t.Errorf("with %d runs waiting the p50 is %s, more than 1.5x the %s with none waiting", waiting, got, baseline)
	}
}
