package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// submit status and list show a run's priority and, for a run whose
// concurrency key is full, that it waits for its key and which.
func TestStatusAndListShowPriorityAndKeyWait(t *testing.T) {
	// Not parallel: its workers add a queue to the runs stream, and two
	// workers adding queues at once may lose one's (EnsureStreams
	// updates the subjects without compare-and-set).
	queue := "lanesview"
	stop, _, err := startWorkerProcess(filepath.Join(t.TempDir(), "worker.log"), nil,
		"--nats", fleet.url, "--queue", queue, "--concurrency", "4", "--worker-id", "lanes-view")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := fleettest.Connect(t, fleet.url)
	sleeper := func(id string, seconds float64) *bus.RunRequest {
		return &bus.RunRequest{ID: id, Prompt: "sleep", Tools: []string{"sleep"}, Model: &bus.ModelRef{Provider: "faux", ID: "s"},
			Concurrency: &bus.Concurrency{Key: "cust-view", Limit: 1}, Priority: bus.PriorityLow,
			Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
				{Content: []agent.Content{agent.ToolCall("s", "sleep", map[string]any{"seconds": seconds})}, StopReason: agent.StopReasonToolUse},
				{Content: []agent.Content{agent.Text("done")}}}}}
	}
	for _, id := range []string{"view-holder", "view-waiter"} {
		if _, err := c.Submit(ctx, queue, sleeper(id, 3)); err != nil {
			t.Fatal(err)
		}
	}
	// Whichever was picked up second waits for the key.
	var out string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		waits := false
		for _, id := range []string{"view-holder", "view-waiter"} {
			o, _, code := submit(t, "status", id)
			if code == 0 && strings.Contains(o, "cust-view (its concurrency key is full") {
				out, waits = o, true
			}
		}
		if waits {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed the key wait:\n%s", out)
		}
	}
	if !strings.Contains(out, "priority") || !strings.Contains(out, "low") {
		t.Errorf("status does not show the priority:\n%s", out)
	}
	list, _, _ := submit(t, "list", "--queue", queue)
	if !strings.Contains(list, "(waiting: key cust-view)") || !strings.Contains(list, "[low]") {
		t.Errorf("list:\n%s", list)
	}
}
