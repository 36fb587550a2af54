package worker

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// TestAToolRunsOnlyOnceItsStartIsStored: when a call runs, its
// tool_execution_start (and the assistant message that made it) is
// stored, so a worker killed while it runs leaves the start behind and
// the next attempt does not run the call again. Before, the start was
// still on its way (a batch commits every 2 ms): under load, a kill lost
// it, and the next attempt asked the model again.
func TestAToolRunsOnlyOnceItsStartIsStored(t *testing.T) {
	var cur atomic.Pointer[run]
	var c *bus.Client
	checked := make(chan string, 2)
	probe := agent.NewTool("probe", "checks that its start is stored", func(ctx context.Context, a struct {
		Call string `json:"call"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		defer func() { checked <- a.Call }()
		r := cur.Load()
		if n := unacknowledged(r.pub); n != 0 {
			t.Errorf("call %s runs with %d events of its run not stored", a.Call, n)
		}
		envs, err := c.ReadEvents(ctx, r.id, 0)
		if err != nil {
			t.Errorf("events of %s: %v", r.id, err)
		}
		for _, e := range envs {
			if e.Type == string(agent.EventToolExecutionStart) && strings.Contains(string(e.Event), `"toolCallId":"`+a.Call+`"`) {
				return agent.TextResult("ok"), nil
			}
		}
		t.Errorf("call %s runs before its tool_execution_start is stored", a.Call)
		return agent.TextResult("ok"), nil
	})
	_, c = startInternal(t, Config{Tools: []*agent.Tool{probe}, HeartbeatInterval: time.Second}, func(w *Worker) {
		w.hooks.afterControlStart = func(r *run) { cur.Store(r) }
	})
	id := submitRun(t, c, &bus.RunRequest{Prompt: "go", Tools: []string{"probe"}, Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{ // a parallel batch: both starts go out before either call runs
				agent.ToolCall("c1", "probe", map[string]any{"call": "c1"}),
				agent.ToolCall("c2", "probe", map[string]any{"call": "c2"}),
			}, StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text("done")}},
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, fin := followToFinished(ctx, t, c, id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("run %s: %s %s", fin.Status, fin.Reason, fin.Error)
	}
	if len(checked) != 2 {
		t.Fatalf("%d calls ran, want 2", len(checked))
	}
}

// unacknowledged counts p's events not yet stored.
func unacknowledged(p *publisher) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, o := range p.queue {
		if !o.acked {
			n++
		}
	}
	return n
}
