package bus_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// TestListPages writes records with rewrites (holes in the records
// stream) and deletes, then reads them page by page: every record once,
// newest write first, filters applied, and a page reads only its window.
func TestListPages(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

// TestListFieldFilters: model, tenant, metadata and text (id or title)
// filters, each alone and together, on a bounded scan that says how far
// it got and how many records the bucket holds.
func TestListFieldFilters(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		r := bus.RunRecord{ID: fmt.Sprintf("f%03d", i), Queue: "default", State: bus.StatusSucceeded, Model: "openai/small",
			Tenant: "acme", Title: fmt.Sprintf("Report %d", i), Metadata: map[string]string{"team": "blue"}}
		if i%3 == 0 {
			r.Model = "openai/large"
		}
		if i%5 == 0 {
			r.Tenant = "globex"
		}
		if i%7 == 0 {
			r.Metadata = map[string]string{"team": "red", "env": "prod/eu"}
		}
		data, _ := json.Marshal(r)
		if _, err := kv.Put(ctx, r.ID, data); err != nil {
			t.Fatal(err)
		}
	}
	count := func(o bus.ListOptions) (*bus.RunPage, []string) {
		t.Helper()
		p, err := c.ListPage(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		return p, ids(p.Records)
	}
	want := func(keep func(i int) bool) []string {
		var out []string
		for i := n - 1; i >= 0; i-- {
			if keep(i) {
				out = append(out, fmt.Sprintf("f%03d", i))
			}
		}
		return out
	}
	cases := []struct {
		name string
		o    bus.ListOptions
		keep func(int) bool
	}{
		{"model", bus.ListOptions{Model: "openai/large"}, func(i int) bool { return i%3 == 0 }},
		{"tenant", bus.ListOptions{Tenant: "globex"}, func(i int) bool { return i%5 == 0 }},
		{"metadata", bus.ListOptions{Metadata: map[string]string{"team": "red", "env": "prod/eu"}}, func(i int) bool { return i%7 == 0 }},
		{"metadata value differs", bus.ListOptions{Metadata: map[string]string{"team": "prod/eu"}}, func(int) bool { return false }},
		{"text in the title", bus.ListOptions{Text: "report 1"}, func(i int) bool { return strings.HasPrefix(fmt.Sprint(i), "1") }},
		{"text in the id", bus.ListOptions{Text: "F29"}, func(i int) bool { return i >= 290 }},
		{"all", bus.ListOptions{Model: "openai/large", Tenant: "globex", Metadata: map[string]string{"team": "red"}}, func(i int) bool { return i%105 == 0 }},
	}
	for _, tc := range cases {
		p, got := count(tc.o)
		if w := want(tc.keep); !slices.Equal(got, w) {
			t.Errorf("%s: %v, want %v", tc.name, got, w)
		}
		if p.Stored != n || p.Scanned != n || p.Truncated {
			t.Errorf("%s: stored %d scanned %d truncated %v", tc.name, p.Stored, p.Scanned, p.Truncated)
		}
	}
	// A full page that ends at the first record is the last one.
	p1, _ := count(bus.ListOptions{Limit: n / 2})
	p2, _ := count(bus.ListOptions{Limit: n / 2, BeforeSeq: p1.Next})
	if p1.Next == 0 || len(p2.Records) != n/2 || p2.Next != 0 || p2.Records[n/2-1].ID != "f000" {
		t.Errorf("two full pages: next %d, then %d records and next %d", p1.Next, len(p2.Records), p2.Next)
	}
	// A bounded scan stops (after the window it is in) and says how far
	// it read.
	p, got := count(bus.ListOptions{Tenant: "globex", MaxScan: 100, Limit: 50})
	if !p.Truncated || p.Scanned < 100 || p.Scanned >= n || p.Stored != n || len(got) == 0 || len(got) >= 50 || p.Next == 0 {
		t.Errorf("bounded: truncated %v scanned %d stored %d, %d records, next %d", p.Truncated, p.Scanned, p.Stored, len(got), p.Next)
	}
	rest, more := count(bus.ListOptions{Tenant: "globex", MaxScan: 1000, Limit: 50, BeforeSeq: p.Next})
	if all := append(got, more...); !slices.Equal(all, want(func(i int) bool { return i%5 == 0 })) || rest.Truncated {
		t.Errorf("bounded, continued: %v", all)
	}
}

// TestListQueuedPagesListEveryRunOnce: queued runs that fill pages go on
// on the next pages (after the last listed), runs picked up between pages
// are listed once (as their record, where they would have been listed as
// queued), and the records follow: every run once across the pages.
func TestListQueuedPagesListEveryRunOnce(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	put := func(id, state string, reqSeq uint64) {
		t.Helper()
		data, _ := json.Marshal(bus.RunRecord{ID: id, Queue: "default", State: state, RequestSeq: reqSeq, HeartbeatAt: time.Now()})
		if _, err := kv.Put(ctx, id, data); err != nil {
			t.Fatal(err)
		}
	}
	put("done-1", bus.StatusSucceeded, 0)
	put("done-2", bus.StatusFailed, 0)
	seqs := map[string]uint64{}
	submit := func(id string) {
		t.Helper()
		res, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "hi"})
		if err != nil {
			t.Fatal(err)
		}
		seqs[id] = res.Seq
	}
	for _, id := range []string{"q1", "q2", "q3", "q4", "q5"} {
		submit(id)
	}
	seen := map[string]int{}
	var order []string
	cursor := ""
	for page := 1; ; page++ {
		p, err := c.ListPage(ctx, bus.ListOptions{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range p.Records {
			seen[r.ID]++
			order = append(order, r.ID+":"+r.State)
		}
		if page == 1 {
			// Between pages: q4, not listed yet, is picked up (its record
			// written as a worker would), q1, listed, too; a run is
			// queued after the last listed and one before it.
			put("q4", bus.StateRunning, seqs["q4"])
			put("q1", bus.StateRunning, seqs["q1"])
			submit("q0")
			submit("q9")
		}
		if p.NextCursor == "" || page > 10 {
			break
		}
		cursor = p.NextCursor
	}
	for _, id := range []string{"q1", "q2", "q3", "q4", "q5", "done-1", "done-2"} {
		if seen[id] != 1 {
			t.Errorf("%s listed %d times", id, seen[id])
		}
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("%s listed %d times", id, n)
		}
	}
	if want := []string{"q1:queued", "q2:queued", "q3:queued", "q4:running", "q5:queued", "q9:queued", "done-2:failed", "done-1:succeeded"}; !slices.Equal(order, want) {
		t.Errorf("pages listed %v, want %v", order, want)
	}
	if err := bus.CheckListCursor("q.1.2.x y"); err == nil {
		t.Error("a cursor with a bad id passes")
	}
}
