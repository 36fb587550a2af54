package worker

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// A give-up that fails after it took the run (here its read of the run's
// events fails) is retried with the attempt it took, not a new one each
// time: retries used to raise the attempt at every try (seen: 177 while
// reads failed) and store a run_started for each.
func TestGiveUpRetryKeepsItsAttempt(t *testing.T) {
	c := connectTestServer(t)
	hang := echoTool(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	// Heartbeats never come in time: the one delivery times out.
	cfg := Config{Tools: []*agent.Tool{hang}, AckWait: 500 * time.Millisecond, HeartbeatInterval: time.Hour,
		MaxDeliver: 1, DrainTimeout: 50 * time.Millisecond}
	logs := &lockedLog{}
	failing := cfg
	failing.Logger = slog.New(slog.NewTextHandler(logs, nil))
	startInternalOn(t, c, failing, func(w *Worker) { w.eventReadTimeout = time.Nanosecond })
	run := submitRun(t, c, &bus.RunRequest{Prompt: "go", Tools: []string{"echo"}, Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.ToolCall("c1", "echo", map[string]any{"text": "x"})}},
			{Content: []agent.Content{agent.Text("never")}},
		}}})
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for strings.Count(logs.String(), "give-up failed; retrying") < 3 {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("the give-up did not fail three times; log:\n%s", logs.String())
		}
	}
	startInternalOn(t, c, cfg, nil) // its reads work
	rec := waitRecord(t, c, run, "given up", func(r *bus.RunRecord) bool { return r.Finished() })
	if rec.Reason != bus.ReasonGaveUp || rec.Attempt != 2 {
		t.Fatalf("record %s/%s attempt %d, want failed/gave_up attempt 2", rec.State, rec.Reason, rec.Attempt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	envs, err := c.ReadEvents(ctx, run, 0)
	if err != nil {
		t.Fatal(err)
	}
	started := map[int]int{}
	for _, e := range envs {
		if e.Type == bus.EventRunStarted {
			started[e.Attempt]++
		}
	}
	if len(started) != 2 || started[1] != 1 || started[2] != 1 {
		t.Fatalf("run_started per attempt %v, want one for attempt 1 and one for the give-up's attempt 2", started)
	}
	tr := &bus.Transcript{}
	for _, e := range envs {
		tr.Apply(e)
	}
	if tr.Finished == nil || tr.Finished.Reason != bus.ReasonGaveUp || tr.Attempt != 2 {
		t.Fatalf("transcript: finished %+v attempt %d", tr.Finished, tr.Attempt)
	}
}
