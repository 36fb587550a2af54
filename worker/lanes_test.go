package worker_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// sleepRun is a faux run that sleeps d in a tool: it holds its slot that
// long.
func sleepRun(name string, d time.Duration) *bus.RunRequest {
	return fleettest.FauxRun(name, fleettest.ToolCall("s", "sleep", map[string]any{"seconds": d.Seconds()}), fleettest.Text("done"))
}

// startedAt waits for each run's end and returns when each started.
func startedAt(t *testing.T, f *fleettest.Fleet, ids []string) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	for _, id := range ids {
		if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
			t.Fatalf("run %s ended %s (%s): %s", id, fin.Status, fin.Reason, fin.Error)
		}
		rec, err := f.Client.Status(fleettest.Context(t), id)
		if err != nil {
			t.Fatal(err)
		}
		out[id] = rec.StartedAt
	}
	return out
}

// A high-priority run submitted behind a backlog of normal runs starts at
// the next free slot, not after the backlog (docs/architecture.md,
// Choosing the next run), and its record says its priority.
func TestHighPriorityOvertakesTheNormalBacklog(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 2})
	var normal []string
	for i := range 12 {
		normal = append(normal, f.Submit("", sleepRun(fmt.Sprintf("n%d", i), 150*time.Millisecond)))
	}
	var high []string
	for i := range 2 {
		req := sleepRun(fmt.Sprintf("h%d", i), 10*time.Millisecond)
		req.Priority = bus.PriorityHigh
		high = append(high, f.Submit("", req))
	}
	starts := startedAt(t, f, append(slices.Clone(normal), high...))
	for _, h := range high {
		later := 0
		for _, n := range normal {
			if starts[n].After(starts[h]) {
				later++
			}
		}
		// 12 normal runs on 2 slots: at most the 2 running and the 2 of
		// the next fetch may start before; FIFO starts it after all 12.
		if later < 6 {
			t.Errorf("high run %s started after %d of the 12 normal runs submitted before it; want at most 6", h, 12-later)
		}
		rec, err := f.Client.Status(fleettest.Context(t), h)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Priority != bus.PriorityHigh {
			t.Errorf("record of %s has priority %q", h, rec.Priority)
		}
	}
}

// A low lane with work gets at least one start in ten while a higher lane
// has a backlog (the minimum share): it never starves.
func TestLowPriorityGetsItsMinimumShare(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	var low []string
	for i := range 2 {
		req := sleepRun(fmt.Sprintf("l%d", i), 10*time.Millisecond)
		req.Priority = bus.PriorityLow
		low = append(low, f.Submit("", req))
	}
	var normal []string
	for i := range 40 {
		normal = append(normal, f.Submit("", sleepRun(fmt.Sprintf("n%d", i), 20*time.Millisecond)))
	}
	f.StartWorker(worker.Config{Concurrency: 1})
	starts := startedAt(t, f, append(slices.Clone(normal), low...))
	for _, l := range low {
		before := 0
		for _, n := range normal {
			if starts[n].Before(starts[l]) {
				before++
			}
		}
		if before > 2*9+1 {
			t.Errorf("low run %s started after %d normal runs; its share allows at most %d", l, before, 2*9+1)
		}
	}
}

// A request whose body asks for a priority its subject does not carry is
// a bad request that names the subject to use.
func TestPriorityOffItsLaneIsABadRequest(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	if _, err := f.Client.SubmitRaw(fleettest.Context(t), "", "offlane", []byte(`{"prompt":"hi","priority":"high"}`)); err != nil {
		t.Fatal(err)
	}
	fin := f.WaitFinished("offlane")
	if fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, "agents.lane.default.high._.<run>") {
		t.Fatalf("finished %s: %s; want a bad request naming the lane", fin.Reason, fin.Error)
	}
	_, err := f.Client.Submit(fleettest.Context(t), "", &bus.RunRequest{Prompt: "hi", Priority: "urgent"})
	var bad *bus.RequestError
	if !errors.As(err, &bad) || !strings.Contains(err.Error(), `priority "urgent"`) {
		t.Fatalf("Submit with priority urgent: %v; want a bad request", err)
	}
}
