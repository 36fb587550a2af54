//go:build fault && linux

package faultsuite

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// Scenario 6: thousands of runs in flight in one worker process, all
// waiting in a tool, and the worker killed with kill -9 while they wait.
// A second worker takes every one over: each run resumes (the interrupted
// call gets an error result), finishes exactly once with a gapless newest
// attempt, its record agreeing, and its transcript complete.
func TestThousandsInFlightKill9(t *testing.T) {
	start := time.Now()
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("FAULT_INFLIGHT")); err == nil && v > 0 {
		n = v
	}
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	// A longer AckWait keeps 2,000 leases at 800 renewals a second, not
	// 2,000 (one per AckWait/4 each).
	f.ackWait = max(f.ackWait, 10*time.Second)
	f.concurrency = n + 100
	d := newDriver(t, f)

	// Which runs are in their tool: counted from the events themselves.
	var mu sync.Mutex
	waiting := map[string]bool{}
	finishedFirst := map[string]bool{}
	allWaiting := make(chan struct{})
	d.onHook(func(env *bus.Envelope) {
		if env.Attempt != 1 {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch env.Type {
		case string(agent.EventToolExecutionStart):
			if !waiting[env.Run] {
				waiting[env.Run] = true
				if len(waiting) == n {
					close(allWaiting)
				}
			}
		case bus.EventRunFinished:
			finishedFirst[env.Run] = true
		}
	})

	// Every request is stored before the worker starts, so it picks them
	// up as fast as it can and all of them wait at once.
	plans := make([]*runPlan, n)
	for i := range plans {
		id := fmt.Sprintf("fl-%04d-%s", i, bus.NewRunID()[:6])
		p := &runPlan{id: id, prompt: "prompt of " + id}
		p.req = &bus.RunRequest{Prompt: p.prompt, Tools: []string{"sleep"},
			Model: &bus.ModelRef{Provider: "faux", ID: "inflight"},
			Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
				toolCall("s1", "sleep", map[string]any{"seconds": 60}),
				{Content: []agent.Content{agent.Text("done after the wait")}},
				{Content: []agent.Content{agent.Text("spare answer")}},
			}}}
		plans[i] = p
	}
	ctx, cancel := f.ctx(60 * time.Second)
	err := f.c.EnsureStreams(ctx, bus.StreamsConfig{Queues: []string{"default"}, AckWait: f.ackWait, MaxDeliver: f.maxDeliver})
	cancel()
	if err != nil {
		t.Fatalf("EnsureStreams: %v", err)
	}
	d.submit(plans...)
	t.Logf("submitted %d runs in %s", n, time.Since(start).Round(time.Millisecond))

	a := f.startWorker("fl-a1")
	picked := time.Now()
	select {
	case <-allWaiting:
	case <-time.After(50 * time.Second): // the tool sleeps 60 s: past this some would finish
		mu.Lock()
		got := len(waiting)
		mu.Unlock()
		t.Fatalf("FAIL: after 50 s, %d of %d runs were in their tool\nworker log:\n%s", got, n, a.tail(30))
	}
	rss := vmRSS(a.pid())
	t.Logf("all %d runs waiting in their tool %s after the worker started; worker RSS %s", n,
		time.Since(picked).Round(time.Millisecond), rss)
	a.kill()
	killed := time.Now()
	mu.Lock()
	early := len(finishedFirst)
	mu.Unlock()
	if early > 0 {
		t.Fatalf("FAIL: %d runs finished their first attempt before the kill (the tool sleeps 60 s)", early)
	}

	b := f.startWorker("fl-b1")
	d.waitAll(5 * time.Minute)
	t.Logf("all %d runs finished %s after the kill -9", n, time.Since(killed).Round(time.Millisecond))
	checks := d.report("scenario 6 (thousands in flight, kill -9)", bus.StatusSucceeded,
		fmt.Sprintf("%d runs waiting in one worker, killed", n))
	var notResumed []string
	for _, rc := range checks {
		if rc.finalAttempt < 2 || !rc.resumed || rc.worker != "fl-b1" {
			notResumed = append(notResumed, fmt.Sprintf("%s (attempt %d, resumed %v, finished by %q)",
				rc.id, rc.finalAttempt, rc.resumed, rc.worker))
		}
	}
	if len(notResumed) > 0 {
		if len(notResumed) > 20 {
			notResumed = append(notResumed[:20], fmt.Sprintf("… and %d more", len(notResumed)-20))
		}
		t.Errorf("FAIL: runs killed in their tool were not resumed by the second worker:\n  %s\nworker log:\n%s",
			strings.Join(notResumed, "\n  "), b.tail(30))
	}
	t.Logf("scenario 6 took %s", time.Since(start).Round(time.Second))
}

// vmRSS is a process's resident set size, from /proc.
func vmRSS(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
