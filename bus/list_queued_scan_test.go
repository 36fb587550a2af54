package bus_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// TestListQueuedPageBoundsItsReadsAboveTop: a page with a queued cursor
// reads the records written since the listing began to find the runs
// picked up since; MaxScan bounds that read like the others, and a page it
// stops short is marked truncated.
func idsOf(rs []bus.RunRecord) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

func TestListQueuedPageBoundsItsReadsAboveTop(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"q1", "q2", "q3", "q4", "q5"} {
		if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "hi"}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := c.ListPage(ctx, bus.ListOptions{Limit: 2, MaxScan: 50})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3000 { // other runs' writes after the listing began (heartbeats)
		data, _ := json.Marshal(bus.RunRecord{ID: fmt.Sprintf("r%04d", i%1500), Queue: "default", State: bus.StateRunning, HeartbeatAt: time.Now()})
		if _, err := kv.Put(ctx, fmt.Sprintf("r%04d", i%1500), data); err != nil {
			t.Fatal(err)
		}
	}
	p2, err := c.ListPage(ctx, bus.ListOptions{Limit: 2, MaxScan: 50, Cursor: p.NextCursor})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("page 2: %d records, scanned %d (MaxScan 50), truncated %v, cursor %q", len(p2.Records), p2.Scanned, p2.Truncated, p2.NextCursor)
	if p2.Scanned > 50 || !p2.Truncated {
		t.Errorf("page 2 scanned %d (MaxScan 50), truncated %v: want at most 50, truncated", p2.Scanned, p2.Truncated)
	}
	if got := idsOf(p2.Records); len(got) != 2 || got[0] != "q3" || got[1] != "q4" {
		t.Errorf("page 2 lists %v, want [q3 q4]", got)
	}
}
