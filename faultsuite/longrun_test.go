//go:build fault && linux

package faultsuite

import (
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// A run that lasts longer than 30 s and longer than twice AckWait (a tool
// sleeping 35 s) finishes on its first attempt with the real worker
// binary: one run_started, no run_resumed, no hand-back, no redelivery.
func TestLongRunFinishesOnFirstAttempt(t *testing.T) {
	start := time.Now()
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	const sleep = 35 * time.Second
	if sleep <= 2*f.ackWait {
		t.Skipf("FAULT_ACK_WAIT %s: the run must last longer than twice AckWait", f.ackWait)
	}
	w := f.startWorker("long1")
	ctx, cancel := f.ctx(3 * time.Minute)
	defer cancel()
	res, err := f.c.Submit(ctx, "default", &bus.RunRequest{Prompt: "wait", Tools: []string{"sleep"},
		Model: &bus.ModelRef{Provider: "faux", ID: "scripted"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			toolCall("s1", "sleep", map[string]any{"seconds": sleep.Seconds()}),
			{Content: []agent.Content{agent.Text("done")}},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	var envs []*bus.Envelope
	for env, err := range f.c.Follow(ctx, res.ID) {
		if err != nil {
			t.Fatalf("follow: %v\nworker log:\n%s", err, w.tail(40))
		}
		envs = append(envs, env)
	}
	// Every stored envelope, stale attempts included.
	raw, err := rawEvents(ctx, f.c, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	started, resumed := 0, 0
	for _, e := range raw {
		switch e.Type {
		case bus.EventRunStarted:
			started++
		case bus.EventRunResumed:
			resumed++
		}
	}
	fin := envs[len(envs)-1]
	ev, err := fin.Decode()
	if err != nil {
		t.Fatal(err)
	}
	if started != 1 || resumed != 0 || fin.Attempt != 1 || ev.RunFinished == nil || ev.RunFinished.Status != bus.StatusSucceeded {
		t.Fatalf("run_started %d, run_resumed %d, run_finished attempt %d %+v\nworker log:\n%s",
			started, resumed, fin.Attempt, ev.RunFinished, w.tail(40))
	}
	rec, err := f.c.Status(ctx, res.ID)
	if err != nil || rec.Attempt != 1 || rec.State != bus.StatusSucceeded {
		t.Fatalf("record %+v %v", rec, err)
	}
	for _, l := range w.output() {
		if strings.Contains(l, "handed back") || strings.Contains(l, "handing the run back") || strings.Contains(l, "redelivered") {
			t.Fatalf("worker log: %s", l)
		}
	}
	t.Logf("long run: %s on attempt 1 after %s (AckWait %s), one run_started, no run_resumed, no hand-back",
		ev.RunFinished.Status, time.Duration(ev.RunFinished.DurationMs)*time.Millisecond, f.ackWait)
	t.Logf("scenario took %s", time.Since(start).Round(time.Second))
}
