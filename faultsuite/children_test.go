//go:build fault && linux

package faultsuite

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// Issue 56: kill -9 the worker process of a parent whose 10 children run
// on another worker process. The parent resumes on the other worker,
// finds its children by their ids (none submitted or run again: each has
// one attempt and one run_started) and finishes with all 10 answers.
func TestChildRunsSurviveParentWorkerKill9(t *testing.T) {
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	// One slot kept while waiting: the parent holds it, its children run
	// on the second worker.
	f.concurrency, f.extraArgs = 1, []string{"--max-waiting", "-1"}
	a := f.startWorker("parent0")
	ctx, cancel := f.ctx(5 * time.Minute)
	defer cancel()
	var calls []agent.Content
	for i := range 10 {
		slow := bus.FauxScript{Responses: []agent.ScriptedResponse{{Content: []agent.Content{agent.Text(fmt.Sprintf("answer %d", i))}}}, TokensPerSecond: 2}
		calls = append(calls, agent.ToolCall(fmt.Sprintf("k%d", i), bus.ToolRunAgent, map[string]any{"prompt": fmt.Sprintf("task %d", i), "request": map[string]any{"faux": slow}}))
	}
	id := "tree-k9"
	req := &bus.RunRequest{ID: id, Prompt: "plan", Tools: []string{bus.ToolRunAgent}, Model: &bus.ModelRef{Provider: "faux", ID: "scripted"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{{Content: calls, StopReason: agent.StopReasonToolUse}, {Content: []agent.Content{agent.Text("merged")}}}}}
	if _, err := f.c.Submit(ctx, "default", req); err != nil {
		t.Fatal(err)
	}
	state := func(run, what string, ok func(*bus.RunRecord) bool) {
		t.Helper()
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) { // polls another process's record
			r, err := f.c.Status(ctx, run)
			if err == nil && ok(r) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never %s: %v %+v", run, what, err, r)
			}
		}
	}
	running := func(r *bus.RunRecord) bool { return r.State == bus.StateRunning }
	state(id, "running", running)
	f.concurrency, f.extraArgs = 12, nil
	f.startWorker("children0")
	for i := range 10 {
		state(childID(t, f.c, id, fmt.Sprintf("k%d", i)), "running", running)
	}
	a.kill()
	state(id, "finished", (*bus.RunRecord).Finished)
	tr, err := f.c.LoadTranscript(ctx, id)
	if err != nil || tr.Finished == nil || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("parent: %v %+v", err, tr.Finished)
	}
	var answers []string
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult {
			answers = append(answers, m.TextOf())
		}
	}
	slices.Sort(answers)
	var want []string
	for i := range 10 {
		want = append(want, fmt.Sprintf("answer %d", i))
	}
	slices.Sort(want)
	if !slices.Equal(answers, want) {
		t.Fatalf("answers %q, want %q", answers, want)
	}
	for i := range 10 {
		child := childID(t, f.c, id, fmt.Sprintf("k%d", i))
		raw, err := rawEvents(ctx, f.c, child)
		if err != nil {
			t.Fatal(err)
		}
		starts := 0
		for _, e := range raw {
			if e.Type == bus.EventRunStarted {
				starts++
			}
		}
		rec, err := f.c.Status(ctx, child)
		if err != nil || rec.Attempt != 1 || starts != 1 {
			t.Fatalf("child %s: %d run_started, attempt %d: %v", child, starts, rec.Attempt, err)
		}
	}
	t.Logf("parent finished on attempt %d with all 10 answers", tr.Attempt)
}

// childID is the run id of call key's child of parent, computed with the
// fleet's child key.
func childID(t *testing.T, c *bus.Client, parent, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k, err := c.ChildKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return k.RunID(parent, key)
}
