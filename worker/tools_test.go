package worker_test

import (
	"context"
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
