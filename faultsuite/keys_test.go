//go:build fault && linux

package faultsuite

import (
	"fmt"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// keyedSleep is a faux run of concurrency key key (limit 1) that sleeps in
// a tool.
func keyedSleep(id, key string, seconds float64) *bus.RunRequest {
	return &bus.RunRequest{ID: id, Prompt: "sleep", Tools: []string{"sleep"},
		Model:       &bus.ModelRef{Provider: "faux", ID: "scripted"},
		Concurrency: &bus.Concurrency{Key: key, Limit: 1},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			toolCall("s1", "sleep", map[string]any{"seconds": seconds}),
			{Content: []agent.Content{agent.Text("done")}},
		}}}
}

// A worker killed (-9) while it holds a concurrency key's place, with runs
// of the key parked in line behind it: the place is not forgotten. The
// killed run's redelivery (its lease) finds its place and keeps it, its
// end hands the place on, and every run in line runs, one at a time as the
// events show.
func TestConcurrencyKeyPlaceSurvivesKill9(t *testing.T) {
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	a := f.startWorker("keys-a")
	ctx, cancel := f.ctx(5 * time.Minute)
	defer cancel()
	const key = "customer-42"
	ids := []string{"key-holder", "key-w1", "key-w2"}
	if _, err := f.c.Submit(ctx, "default", keyedSleep(ids[0], key, 3)); err != nil {
		t.Fatal(err)
	}
	waitRecord(t, f, ids[0], func(r *bus.RunRecord) bool {
		return r.State == bus.StateRunning && r.Worker == "keys-a" && r.Parked == nil
	})
	for _, id := range ids[1:] {
		if _, err := f.c.Submit(ctx, "default", keyedSleep(id, key, 0.2)); err != nil {
			t.Fatal(err)
		}
		waitRecord(t, f, id, func(r *bus.RunRecord) bool {
			return r.Parked != nil && r.Waiting != nil && r.Waiting.For == bus.WaitingKey && r.Waiting.Key == key
		})
	}
	a.kill()
	f.startWorker("keys-b")
	var spans [][2]int64
	for _, id := range ids {
		rec := waitRecord(t, f, id, func(r *bus.RunRecord) bool { return r.Finished() })
		if rec.State != bus.StatusSucceeded {
			t.Fatalf("%s ended %s: %s", id, rec.State, rec.Error)
		}
		raw, err := rawEvents(ctx, f.c, id)
		if err != nil {
			t.Fatal(err)
		}
		var s [2]int64
		for _, e := range raw {
			if ev, err := e.Decode(); err == nil && ev.Type == bus.EventRunStarted {
				s[0] = e.TS
			} else if err == nil && ev.Type == bus.EventRunFinished {
				s[1] = e.TS
			}
		}
		spans = append(spans, s)
		t.Logf("%s: attempt %d on %s, ran %v", id, rec.Attempt, rec.Worker, time.Duration(s[1]-s[0])*time.Millisecond)
	}
	for i := range spans {
		for j := range spans {
			if i != j && spans[i][0] < spans[j][1] && spans[j][0] < spans[i][1] {
				t.Errorf("%s and %s of key %s (limit 1) ran at once: %v %v", ids[i], ids[j], key, spans[i], spans[j])
			}
		}
	}
}

// waitRecord polls a run's record until ok.
func waitRecord(t *testing.T, f *fleet, id string, ok func(*bus.RunRecord) bool) *bus.RunRecord {
	t.Helper()
	ctx, cancel := f.ctx(2 * time.Minute)
	defer cancel()
	var last *bus.RunRecord
	var lastErr error
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		r, err := f.c.Status(ctx, id)
		if err == nil && ok(r) {
			return r
		}
		last, lastErr = r, err
	}
	t.Fatalf("%s: record never reached the state awaited: %v %s", id, lastErr, fmt.Sprintf("%+v", last))
	return nil
}
