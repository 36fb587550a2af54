package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// An abort that comes while a tool runs ends the tool's context (a tool
// blocked on it returns) within a second, and the run ends aborted: the
// tool's context is the run's, not detached from it.
func TestAnAbortWhileAToolRunsEndsTheToolsContext(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	running := make(chan struct{}, 1)
	ctxEnded := make(chan time.Time, 1)
	release := make(chan struct{}) // only if the abort does not end it
	block := agent.NewTool("block", "blocks until its context ends", func(ctx context.Context, _ struct {
		Why string `json:"why"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		running <- struct{}{}
		select {
		case <-ctx.Done():
			ctxEnded <- time.Now()
			return agent.ToolResult{}, ctx.Err()
		case <-release:
			return agent.TextResult("released by the test's end"), nil
		}
	})
	f.StartWorker(worker.Config{Tools: []*agent.Tool{block}})
	t.Cleanup(func() { close(release) }) // runs before the worker stops
	id := f.Submit("", &bus.RunRequest{Prompt: "go", Tools: []string{"block"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("c1", "block", map[string]any{"why": "to be aborted"}), fleettest.Text("never")}}})
	waitFor(t, running, "the tool to run")
	sent := time.Now()
	if _, err := f.Client.Abort(fleettest.Context(t), id, "stop the tool"); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-ctxEnded:
		t.Logf("the tool's context ended %s after the abort was sent", at.Sub(sent).Round(time.Millisecond))
	case <-time.After(time.Second - time.Since(sent)):
		t.Fatal("the tool's context did not end within 1s of the abort")
	}
	fin := f.WaitFinished(id)
	if fin.Status != bus.StatusAborted || fin.Reason != bus.ReasonAbortedByUser || fin.Error != "stop the tool" {
		t.Fatalf("run_finished %+v, want aborted by the user", fin)
	}
	rec, err := f.Client.Status(fleettest.Context(t), id)
	if err != nil || rec.State != bus.StatusAborted {
		t.Fatalf("record %+v %v", rec, err)
	}
}

func TestToolTimeout(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newGate()
	f.StartWorker(worker.Config{Tools: []*agent.Tool{g.tool()}, ToolTimeout: 100 * time.Millisecond})
	id := f.Submit("", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.ToolCall("c", "gate", map[string]any{"name": "x"}), fleettest.Text("ok")}}})
	envs := f.Follow(id)
	if fin := checkEnvelopes(t, id, envs); fin.Status != bus.StatusSucceeded {
		t.Fatalf("%+v", fin)
	}
	tr := transcriptOf(t, envs)
	if res := tr.Messages[2]; !res.IsError || !strings.Contains(res.TextOf(), "timed out after 100ms") {
		t.Fatalf("tool result %+v", res)
	}
}

// Tool arguments and results are capped: oversized arguments fail the call
// without running the tool; a long result is cut and says so.
func TestToolSizeCaps(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	ran := make(chan string, 10)
	echo := agent.NewTool("echo", "returns its text", func(_ context.Context, a struct {
		Text string `json:"text"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		ran <- a.Text
		return agent.TextResult(strings.Repeat(a.Text, 100)), nil
	})
	f.StartWorker(worker.Config{Tools: []*agent.Tool{echo}, MaxToolArgsBytes: 200, MaxToolResultBytes: 500})
	id := f.Submit("", &bus.RunRequest{Prompt: "go", Tools: []string{"echo"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("big", "echo", map[string]any{"text": strings.Repeat("x", 300)}),
			fleettest.ToolCall("small", "echo", map[string]any{"text": "0123456789"}),
			fleettest.Text("done"),
		}}})
	envs := f.Follow(id)
	if fin := checkEnvelopes(t, id, envs); fin.Status != bus.StatusSucceeded {
		t.Fatalf("%+v", fin)
	}
	tr := transcriptOf(t, envs)
	big, small := tr.Messages[2], tr.Messages[4]
	if !big.IsError || !strings.Contains(big.TextOf(), "the limit is 200") {
		t.Fatalf("oversized arguments: %+v", big)
	}
	if small.IsError || !strings.Contains(small.TextOf(), "[tool result truncated: 1000 bytes, the limit is 500]") {
		t.Fatalf("long result: %q", small.TextOf())
	}
	close(ran)
	var executed []string
	for s := range ran {
		executed = append(executed, s)
	}
	if len(executed) != 1 || executed[0] != "0123456789" {
		t.Fatalf("tool ran with %q; the oversized call must not run", executed)
	}
}

// A tool stopped by an abort says so, not "context canceled".
func TestAbortedToolSaysTheRunWasAborted(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	id := f.Submit("", &bus.RunRequest{Prompt: "nap", Model: fleettest.FauxModel(), Tools: []string{"sleep"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.ToolCall("c1", "sleep", map[string]any{"seconds": 30}), fleettest.Text("never")}}})
	var result string
	for env, err := range f.Client.Follow(fleettest.Context(t), id) {
		if err != nil {
			t.Fatal(err)
		}
		ev := fleettest.Decode(t, env)
		if ev.Agent != nil && ev.Agent.Type == "tool_execution_start" {
			if _, err := f.Client.Abort(fleettest.Context(t), id, "enough"); err != nil {
				t.Fatal(err)
			}
		}
		if ev.Agent != nil && ev.Agent.Type == "tool_execution_end" && ev.Agent.Result != nil {
			result = ev.Agent.Result.Content[0].Text
		}
	}
	// Stopped while it ran, or before it began (an abort that lands while
	// the call waits for its start to be stored): either way, why.
	if result != "tool sleep stopped: the run was aborted" && result != "tool sleep not run: the run was aborted" {
		t.Fatalf("the aborted tool's result is %q", result)
	}
}
