package bus_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// TestListQueuedPagesWithRunningRewrites: running runs' records rewritten
// (heartbeats) between pages of queued runs. What protocol §7 promises: a
// run queued when the listing began is listed once; a rewritten run whose
// id comes after the cursor's is listed once, among the queued runs; one
// whose id the queued pages have passed (a-run) is listed at most once (its
// copy at or below top is gone: not listed, a known limit).
func TestListQueuedPagesWithRunningRewrites(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	put := func(id, state string) {
		t.Helper()
		data, _ := json.Marshal(bus.RunRecord{ID: id, Queue: "default", State: state, HeartbeatAt: time.Now()})
		if _, err := kv.Put(ctx, id, data); err != nil {
			t.Fatal(err)
		}
	}
	put("a-run", bus.StateRunning)
	put("z-run", bus.StateRunning)
	for _, id := range []string{"q1", "q2", "q3", "q4", "q5"} {
		if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "hi"}); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	var order []string
	cursor := ""
	for page := 1; page < 20; page++ {
		p, err := c.ListPage(ctx, bus.ListOptions{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range p.Records {
			seen[r.ID]++
			order = append(order, r.ID+":"+r.State)
		}
		if page == 1 {
			put("a-run", bus.StateRunning) // heartbeats between pages
			put("z-run", bus.StateRunning)
		}
		if p.NextCursor == "" {
			break
		}
		cursor = p.NextCursor
	}
	t.Logf("order %v", order)
	if seen["a-run"] > 1 {
		t.Errorf("a-run listed %d times", seen["a-run"])
	}
	for _, id := range []string{"z-run", "q1", "q2", "q3", "q4", "q5"} {
		if seen[id] != 1 {
			t.Errorf("%s listed %d times", id, seen[id])
		}
	}
}
