package worker_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// fanOut is a parent's faux script: one turn calling run_agent n times in
// parallel, child i scripted to answer "answer i" (its reply delayed by
// pace tokens per second, 0: at once), then the merged answer.
func fanOut(n int, pace float64, childResponses func(i int) []agent.ScriptedResponse) *bus.RunRequest {
	var calls []agent.Content
	for i := range n {
		responses := []agent.ScriptedResponse{fleettest.Text(fmt.Sprintf("answer %d", i))}
		if childResponses != nil {
			responses = childResponses(i)
		}
		calls = append(calls, agent.ToolCall(fmt.Sprintf("k%d", i), bus.ToolRunAgent, map[string]any{
			"prompt":  fmt.Sprintf("task %d", i),
			"request": map[string]any{"faux": bus.FauxScript{Responses: responses, TokensPerSecond: pace}},
		}))
	}
	req := fleettest.FauxRun("plan",
		agent.ScriptedResponse{Content: calls, StopReason: agent.StopReasonToolUse},
		fleettest.Text("merged"))
	req.Tools = []string{bus.ToolRunAgent}
	return req
}

// childAnswers are the texts of the parent's run_agent results, sorted.
func childAnswers(t *testing.T, tr *bus.Transcript) []string {
	t.Helper()
	var out []string
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult && m.ToolName == bus.ToolRunAgent {
			if m.IsError {
				t.Errorf("run_agent error: %s", m.TextOf())
			}
			out = append(out, m.TextOf())
		}
	}
	slices.Sort(out)
	return out
}

func wantAnswers(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("answer %d", i))
	}
	slices.Sort(out)
	return out
}

// A parent fans out to 10 children over 2 workers and merges their
// answers; each child's record and run_started name its parent.
func TestChildRunsFanOutAndIn(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 3})
	f.StartWorker(worker.Config{Concurrency: 3})
	parent := f.Submit("", fanOut(10, 0, nil))
	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	if got, want := childAnswers(t, f.Transcript(parent)), wantAnswers(10); !slices.Equal(got, want) {
		t.Fatalf("answers %q, want %q", got, want)
	}
	workers := map[string]bool{}
	for i := range 10 {
		id := bus.ChildRunID(parent, fmt.Sprintf("k%d", i))
		rec, err := f.Client.Status(fleettest.Context(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != bus.StatusSucceeded || rec.Child == nil || *rec.Child != (bus.ChildOf{ParentRunID: parent, RootRunID: parent, Depth: 1}) {
			t.Fatalf("child %s record %+v child %+v", id, rec, rec.Child)
		}
		workers[rec.Worker] = true
		envs := f.Follow(id)
		if s := fleettest.Decode(t, envs[0]).RunStarted; s == nil || s.Child == nil || s.Child.ParentRunID != parent {
			t.Fatalf("child run_started %s", fleettest.Dump(envs[:1]))
		}
	}
	if len(workers) != 2 {
		t.Logf("children ran on %d worker(s)", len(workers))
	}
}

// A child past the tree's depth is the tool's error; nothing is
// submitted.
func TestChildRunDepthBound(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{MaxChildDepth: 5})
	req := fanOut(1, 0, nil)
	req.Children = &bus.Children{MaxDepth: 1}
	// The child would start its own child: depth 2 > 1.
	req.Faux.Responses[0].Content[0].Arguments["request"] = map[string]any{
		"tools": []string{bus.ToolRunAgent},
		"faux": bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("g", bus.ToolRunAgent, map[string]any{"prompt": "deeper", "request": map[string]any{"faux": bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.Text("too deep")}}}}),
			fleettest.Text("answer 0"),
		}},
	}
	parent := f.Submit("", req)
	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	child := bus.ChildRunID(parent, "k0")
	tr := f.Transcript(child)
	var refused string
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult && m.IsError {
			refused = m.TextOf()
		}
	}
	if !strings.Contains(refused, "depth 2, the tree's limit is 1") {
		t.Fatalf("grandchild not refused: %q", refused)
	}
	if _, err := f.Client.Status(fleettest.Context(t), bus.ChildRunID(child, "g")); err == nil {
		t.Fatal("the grandchild was submitted")
	}
}
