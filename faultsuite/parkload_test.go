//go:build fault && linux && parkload

package faultsuite

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// TestParkedRunsRSS measures (issue 54) a worker process (PARK_CONCURRENCY
// slots, default 64; PARK_NO_SETTLE=1 skips the settling samples) holding
// PARK_N (default 100,000) parked runs: its RSS against its own idle
// RSS, and the wake latency of PARK_WAKE (default 1,000) of them answered
// at once (answer stored -> the woken attempt's run_started, and ->
// tool_approval_resolved). Not a pass/fail timing test: it logs figures.
//
//	go test -tags 'fault parkload' -run TestParkedRunsRSS -v -timeout 2h ./faultsuite/
func TestParkedRunsRSS(t *testing.T) {
	n := envInt("PARK_N", 100_000)
	wakeN := min(envInt("PARK_WAKE", 1000), n)
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	f.concurrency = envInt("PARK_CONCURRENCY", 64)
	f.extraArgs = []string{"--park-after", "1s", "--max-waiting", "50000"}
	w := f.startWorker("parkload")
	ctx, cancel := f.ctx(2 * time.Hour)
	defer cancel()

	// Idle: after a few runs that finish, as a worker that has worked.
	for i := range 20 {
		req := &bus.RunRequest{ID: fmt.Sprintf("idle-%d", i), Prompt: "hi", Model: &bus.ModelRef{Provider: "faux", ID: "scripted"},
			Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{{Content: []agent.Content{agent.Text("hello")}}}}}
		if _, err := f.c.Submit(ctx, "default", req); err != nil {
			t.Fatal(err)
		}
		if _, err := f.c.LoadTranscript(ctx, req.ID); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Second) // let the idle worker settle before sampling it
	idle := rssKiB(t, w.pid())

	gated := func(id string) *bus.RunRequest {
		return &bus.RunRequest{ID: id, Prompt: "compute", Tools: []string{"calculator"},
			Model:    &bus.ModelRef{Provider: "faux", ID: "scripted"},
			Approval: &bus.Approval{Tools: []string{"calculator"}},
			Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
				toolCall("c1", "calculator", map[string]any{"expression": "6*7"}),
				{Content: []agent.Content{agent.Text("done")}},
			}}}
	}
	start := time.Now()
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				if _, err := f.c.Submit(ctx, "default", gated(fmt.Sprintf("pl-%d", i))); err != nil {
					t.Error(err)
				}
			}
		})
	}
	peak := 0
	for i := range n {
		next <- i
		if i%5000 == 0 {
			peak = max(peak, rssKiB(t, w.pid()))
		}
	}
	close(next)
	wg.Wait()
	submitted := time.Since(start)
	parkedStream, err := f.c.JetStream().Stream(ctx, f.c.Names().ParkedStream())
	if err != nil {
		t.Fatal(err)
	}
	// Every run parked: a kept request and a timer each.
	for {
		info, err := parkedStream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		peak = max(peak, rssKiB(t, w.pid()))
		if info.State.Msgs >= uint64(2*n) {
			break
		}
		time.Sleep(time.Second)
	}
	allParked := time.Since(start)
	rssParked := rssKiB(t, w.pid())
	rssSettled, rssGC := rssParked, rssParked
	if os.Getenv("PARK_NO_SETTLE") != "1" {
		time.Sleep(30 * time.Second) // the worker settles with nothing to run
		rssSettled = rssKiB(t, w.pid())
		// With nothing running a worker allocates too little to start a GC:
		// the runtime forces one every 2 minutes, after which freed memory goes
		// back to the system.
		time.Sleep(2*time.Minute + 10*time.Second)
		rssGC = rssKiB(t, w.pid())
	}
	t.Logf("%d runs parked: submitted in %s, all parked after %s", n, submitted.Round(time.Second), allParked.Round(time.Second))
	t.Logf("worker RSS: idle %d MiB; with %d parked: %d MiB at once, %d MiB 30 s later, %d MiB after the runtime's forced GC (peak while parking %d MiB)",
		idle>>10, n, rssParked>>10, rssSettled>>10, rssGC>>10, peak>>10)

	// Wake wakeN at once: latency from each answer's store to its woken
	// attempt's run_started and its tool_approval_resolved.
	var mu sync.Mutex
	stored := map[string]time.Time{}
	started, resolved := map[string]time.Duration{}, map[string]time.Duration{}
	done := make(chan struct{}, wakeN)
	sub, err := f.c.Conn().Subscribe(f.c.Names().Events("*"), func(m *nats.Msg) {
		now := time.Now()
		var env struct {
			Run     string `json:"run"`
			Attempt int    `json:"attempt"`
			Event   struct {
				Type string `json:"type"`
			} `json:"event"`
		}
		if json.Unmarshal(m.Data, &env) != nil || env.Attempt < 2 {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		at, ok := stored[env.Run]
		if !ok {
			return
		}
		switch env.Event.Type {
		case bus.EventRunStarted:
			if _, seen := started[env.Run]; !seen {
				started[env.Run] = now.Sub(at)
			}
		case bus.EventToolApprovalResolved:
			if _, seen := resolved[env.Run]; !seen {
				resolved[env.Run] = now.Sub(at)
				done <- struct{}{}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = f.c.Conn().Flush()
	pct := func(m map[string]time.Duration) string {
		mu.Lock()
		defer mu.Unlock()
		var ds []time.Duration
		for _, d := range m {
			ds = append(ds, d)
		}
		slices.Sort(ds)
		q := func(p float64) time.Duration {
			return ds[min(len(ds)-1, int(p*float64(len(ds))))].Round(time.Millisecond)
		}
		return fmt.Sprintf("n=%d p50 %s p90 %s p99 %s max %s", len(ds), q(0.5), q(0.9), q(0.99), ds[len(ds)-1].Round(time.Millisecond))
	}
	wakeStart := time.Now()
	if os.Getenv("PARK_WAKE_PACED") == "1" {
		// One at a time: each answer after the last one's run resolved,
		// the wake path's own latency with no bulk to queue behind.
		for i := range wakeN {
			id := fmt.Sprintf("pl-%d", i*(n/wakeN))
			mu.Lock()
			stored[id] = time.Now()
			mu.Unlock()
			if _, err := f.c.Answer(ctx, id, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove, By: "load"}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			case <-time.After(time.Minute):
				t.Fatalf("run %s not resolved", id)
			}
		}
		t.Logf("%d answered one at a time: answer sent -> woken run_started %s; -> tool_approval_resolved %s", wakeN, pct(started), pct(resolved))
		return
	}
	ids := make(chan string)
	for range 16 {
		wg.Go(func() {
			for id := range ids {
				a := bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove, By: "load"}
				mu.Lock()
				stored[id] = time.Now() // refined by the ack below
				mu.Unlock()
				if _, err := f.c.Answer(ctx, id, a); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for i := range wakeN {
		ids <- fmt.Sprintf("pl-%d", i*(n/wakeN))
	}
	close(ids)
	wg.Wait()
	for range wakeN {
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("only %d of %d woken runs resolved", len(resolved), wakeN)
		}
	}
	t.Logf("%d answered at once (in %s): answer sent -> woken run_started %s; -> tool_approval_resolved %s",
		wakeN, time.Since(wakeStart).Round(time.Millisecond), pct(started), pct(resolved))
	t.Logf("worker RSS after the wakes: %d MiB", rssKiB(t, w.pid())>>10)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
