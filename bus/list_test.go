package bus_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// TestListPages writes records with rewrites (holes in the records
// stream) and deletes, then reads them page by page: every record once,
// newest write first, filters applied, and a page reads only its window.
func TestListPages(t *testing.T) {
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
	const n = 700
	var want []string // newest write first
	for i := range n {
		id := fmt.Sprintf("r%04d", i)
		put(id, bus.StateRunning) // rewritten below: a hole
		state := bus.StatusSucceeded
		if i%10 == 3 {
			state = bus.StatusFailed
		}
		put(id, state)
		want = append([]string{id}, want...)
	}
	if err := kv.Delete(ctx, "r0005"); err != nil {
		t.Fatal(err)
	}
	want = slices.DeleteFunc(want, func(id string) bool { return id == "r0005" })
	var got []string
	var before uint64
	pages := 0
	for {
		p, err := c.ListPage(ctx, bus.ListOptions{Limit: 50, BeforeSeq: before})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, r := range p.Records {
			got = append(got, r.ID)
		}
		if p.Scanned > 2*50 {
			t.Errorf("page %d read %d records for 50", pages, p.Scanned)
		}
		if p.Next == 0 {
			break
		}
		before = p.Next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages gave %d records (want %d):\n%v", len(got), len(want), got[:min(len(got), 20)])
	}
	failed, err := c.List(ctx, bus.ListOptions{State: bus.StatusFailed, Limit: 20})
	if err != nil || len(failed) != 20 || failed[0].ID != "r0693" || failed[19].ID != "r0503" {
		t.Fatalf("failed: %v %v", ids(failed), err)
	}
	// A page after a run: --before <run>.
	rec, err := c.Status(ctx, "r0100")
	if err != nil {
		t.Fatal(err)
	}
	older, err := c.List(ctx, bus.ListOptions{BeforeSeq: rec.Revision, Limit: 3})
	if err != nil || !slices.Equal(ids(older), []string{"r0099", "r0098", "r0097"}) {
		t.Fatalf("before r0100: %v %v", ids(older), err)
	}
	// Since: only what was written from then on.
	mark := time.Now()
	put("late", bus.StatusAborted)
	since, err := c.List(ctx, bus.ListOptions{Since: mark})
	if err != nil || !slices.Equal(ids(since), []string{"late"}) {
		t.Fatalf("since: %v %v", ids(since), err)
	}
	beforeMark, err := c.List(ctx, bus.ListOptions{Before: mark, Limit: 1})
	if err != nil || !slices.Equal(ids(beforeMark), []string{"r0699"}) {
		t.Fatalf("before a time: %v %v", ids(beforeMark), err)
	}
	// A scan bound ends a page early with a cursor.
	p, err := c.ListPage(ctx, bus.ListOptions{State: bus.StatusAborted, Limit: 5, MaxScan: 100})
	if err != nil || !p.Truncated || p.Next == 0 || len(p.Records) != 1 {
		t.Fatalf("bounded scan: %+v %v", p, err)
	}
}

func ids(recs []bus.RunRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

// TestListQueuedFirst: queued runs come first on the first page only, and
// a page they fill still points at the records.
func TestListQueuedFirst(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	for _, id := range []string{"q-b", "q-a"} {
		if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "hi"}); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(bus.RunRecord{ID: "done", Queue: "default", State: bus.StatusSucceeded})
	if _, err := kv.Put(ctx, "done", data); err != nil {
		t.Fatal(err)
	}
	p, err := c.ListPage(ctx, bus.ListOptions{Limit: 2})
	if err != nil || !slices.Equal(ids(p.Records), []string{"q-a", "q-b"}) || p.Next == 0 {
		t.Fatalf("first page: %v next %d %v", ids(p.Records), p.Next, err)
	}
	p, err = c.ListPage(ctx, bus.ListOptions{Limit: 2, BeforeSeq: p.Next})
	if err != nil || !slices.Equal(ids(p.Records), []string{"done"}) || p.Next != 0 {
		t.Fatalf("second page: %v next %d %v", ids(p.Records), p.Next, err)
	}
	all, err := c.List(ctx, bus.ListOptions{})
	if err != nil || !slices.Equal(ids(all), []string{"q-a", "q-b", "done"}) {
		t.Fatalf("all: %v %v", ids(all), err)
	}
	if q, err := c.List(ctx, bus.ListOptions{State: bus.StateQueued}); err != nil || len(q) != 2 {
		t.Fatalf("queued: %v %v", ids(q), err)
	}
}
