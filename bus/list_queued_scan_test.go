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

// TestListQueuedPageKeepsACursorWhenItsScanIsSpent: page 1 lists queued
// runs; before page 2 more records are written than MaxScan (heartbeats of
// a busy fleet). Page 2's read above top spends the whole bound: it still
// lists the queued runs left and returns a cursor to the records at or
// below top, so a client following cursors lists every run (it ended the
// listing there: Next 0, NextCursor "").
func TestListQueuedPageKeepsACursorWhenItsScanIsSpent(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 5 { // finished runs, at or below top
		id := fmt.Sprintf("old%d", i)
		want = append(want, id)
		data, _ := json.Marshal(bus.RunRecord{ID: id, Queue: "default", State: bus.StatusSucceeded, HeartbeatAt: time.Now()})
		if _, err := kv.Put(ctx, id, data); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"q1", "q2", "q3"} {
		want = append(want, id)
		if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "hi"}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := c.ListPage(ctx, bus.ListOptions{Limit: 2, MaxScan: 20})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range p.Records {
		seen[r.ID]++
	}
	// Meanwhile: 30 writes of a running run that is none of the queued.
	for i := range 30 {
		data, _ := json.Marshal(bus.RunRecord{ID: "busy", Queue: "default", State: bus.StateRunning, HeartbeatAt: time.Now(), Attempt: i + 1})
		if _, err := kv.Put(ctx, "busy", data); err != nil {
			t.Fatal(err)
		}
	}
	cursor := p.NextCursor
	for n := 2; cursor != ""; n++ {
		if n > 20 {
			t.Fatalf("still paging after 20 pages (cursor %q)", cursor)
		}
		p, err = c.ListPage(ctx, bus.ListOptions{Limit: 2, MaxScan: 20, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("page %d: %v, scanned %d, truncated %v, next %d, cursor %q", n, idsOf(p.Records), p.Scanned, p.Truncated, p.Next, p.NextCursor)
		if n == 2 && (p.Scanned > 20 || !p.Truncated) {
			t.Errorf("page 2 scanned %d, truncated %v: want at most 20 (MaxScan), truncated", p.Scanned, p.Truncated)
		}
		for _, r := range p.Records {
			seen[r.ID]++
		}
		cursor = p.NextCursor
	}
	for _, id := range want {
		if seen[id] != 1 {
			t.Errorf("%s listed %d times, want once (seen %v)", id, seen[id], seen)
		}
	}
}
