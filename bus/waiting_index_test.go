package bus_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// TestWaitingListingPagesTheIndex: `list --state waiting` and `approvals`
// page the waiting index oldest first, each entry checked against its
// record, so runs that finished since (stale entries) and entries with no
// record (forged) are never listed, however many records were written
// above the waiting ones; a model's rate-limit wait is not listed from the
// index (an entry a 1.9 worker wrote is skipped: since 1.10 it is not
// indexed), and asking for it walks the records; with no index (a fleet
// before 1.9) the records walk lists them.
func TestWaitingListingPagesTheIndex(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	put := func(r bus.RunRecord, entry bool) {
		t.Helper()
		data, _ := json.Marshal(r)
		if _, err := kv.Put(ctx, r.ID, data); err != nil {
			t.Fatal(err)
		}
		if entry {
			if r.Waiting == nil { // an entry whose record does not wait
				r.Waiting = &bus.Waiting{For: bus.WaitingApproval}
			}
			if err := c.PutWaiting(ctx, &r, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	now := time.Now()
	waiting := func(id, queue, what string) bus.RunRecord {
		return bus.RunRecord{ID: id, Queue: queue, State: bus.StateRunning, HeartbeatAt: now, Waiting: &bus.Waiting{For: what, Since: now}}
	}
	put(waiting("w1", "default", bus.WaitingApproval), true)
	put(waiting("w2", "default", bus.WaitingBudget), true)
	put(waiting("w5", "default", bus.WaitingModel), true)
	put(waiting("stale", "default", bus.WaitingApproval), true)
	put(bus.RunRecord{ID: "stale", Queue: "default", State: bus.StatusSucceeded}, false) // finished; its entry left
	put(bus.RunRecord{ID: "ghost", Queue: "default", State: bus.StatusFailed}, false)
	if err := c.PutWaiting(ctx, &bus.RunRecord{ID: "forged", Queue: "default", Waiting: &bus.Waiting{For: bus.WaitingApproval}}, false); err != nil {
		t.Fatal(err) // no record at all
	}
	put(waiting("w3", "other", bus.WaitingApproval), true)
	put(waiting("w4", "default", bus.WaitingApproval), true)
	for i := range 500 { // finished after them: the walk's first windows
		put(bus.RunRecord{ID: fmt.Sprintf("done-%03d", i), Queue: "default", State: bus.StatusSucceeded}, false)
	}
	ids := func(recs []bus.RunRecord) string {
		var out []string
		for _, r := range recs {
			out = append(out, r.ID)
		}
		return strings.Join(out, " ")
	}
	pages := func(o bus.ListOptions) (string, int) {
		t.Helper()
		var out []string
		scanned := 0
		for range 10 {
			p, err := c.ListPage(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, ids(p.Records))
			scanned += p.Scanned
			if o.Cursor = p.NextCursor; o.Cursor == "" {
				break
			}
			if !strings.HasPrefix(o.Cursor, "w.") {
				t.Fatalf("cursor %q, want a waiting-index one", o.Cursor)
			}
		}
		return strings.Join(out, " | "), scanned
	}
	if got, scanned := pages(bus.ListOptions{State: bus.StateWaiting, Limit: 2}); got != "w1 w2 | w3 w4" || scanned > 8 {
		t.Errorf("waiting pages %q (%d entries read), want w1 w2 | w3 w4 from the index", got, scanned)
	}
	if got, _ := pages(bus.ListOptions{State: bus.StateWaiting, WaitingFor: bus.WaitingApproval, Queue: "default"}); got != "w1 w4" {
		t.Errorf("waiting for approval in default: %q, want w1 w4", got)
	}
	if recs, err := c.List(ctx, bus.ListOptions{State: bus.StateWaiting, WaitingFor: bus.WaitingModel}); err != nil || ids(recs) != "w5" {
		t.Errorf("waiting for the model: %q %v, want w5 from the records", ids(recs), err)
	}
	p, err := c.PendingApprovalsPage(ctx, bus.ApprovalsOptions{Limit: 10})
	if err != nil || p.Scanned > 6 {
		t.Fatalf("approvals: %v, %d read", err, p.Scanned)
	}
	if _, err := c.ListPage(ctx, bus.ListOptions{State: bus.StateRunning, Cursor: "w.1"}); err == nil {
		t.Error("a waiting-index cursor listed runs of another state")
	}

	// No index: the records walk (the newest first).
	if err := c.JetStream().DeleteStream(ctx, c.Names().WaitingStream()); err != nil {
		t.Fatal(err)
	}
	recs, err := c.List(ctx, bus.ListOptions{State: bus.StateWaiting})
	if err != nil || ids(recs) != "w4 w3 w5 w2 w1" {
		t.Errorf("without the index: %q %v, want w4 w3 w5 w2 w1", ids(recs), err)
	}
	if _, err := c.ListPage(ctx, bus.ListOptions{State: bus.StateWaiting, Cursor: "w.1"}); err == nil {
		t.Error("a waiting-index cursor was taken with no index")
	}
}

// TestWaitingPageBoundsItsHoles: the sequences a page of the index reads,
// the holes runs that stopped waiting left included, count against
// MaxScan: a page over 600 holes with MaxScan 100 stops truncated with a
// cursor, and the pages after it reach the run that waits after them.
func TestWaitingPageBoundsItsHoles(t *testing.T) {
	t.Parallel()
	ids := func(recs []bus.RunRecord) string {
		var out []string
		for _, r := range recs {
			out = append(out, r.ID)
		}
		return strings.Join(out, " ")
	}
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	// A run that waits before the holes (holes below the index's first
	// entry are never read).
	if err := fleettest.PutWaitingRun(ctx, c, "default", "first", "c1", map[string]int{}); err != nil {
		t.Fatal(err)
	}
	short := &bus.RunRecord{ID: "short", Queue: "default", Waiting: &bus.Waiting{For: bus.WaitingModel}}
	for range 600 { // each rewrite deletes the one before: a hole
		if err := c.PutWaiting(ctx, short, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DropWaiting(ctx, "default", "short"); err != nil {
		t.Fatal(err)
	}
	if err := fleettest.PutWaitingRun(ctx, c, "default", "waits", "c1", map[string]int{}); err != nil {
		t.Fatal(err)
	}
	o := bus.ListOptions{State: bus.StateWaiting, Limit: 10, MaxScan: 100}
	p, err := c.ListPage(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Truncated || ids(p.Records) != "first" || !strings.HasPrefix(p.NextCursor, "w.") {
		t.Fatalf("first page: truncated %v, %q, cursor %q; want first, truncated, with a cursor", p.Truncated, ids(p.Records), p.NextCursor)
	}
	p.Records = nil
	for pages := 1; len(p.Records) == 0; pages++ {
		if pages > 20 || p.NextCursor == "" {
			t.Fatalf("the waiting run was not reached (%d pages, cursor %q)", pages, p.NextCursor)
		}
		o.Cursor = p.NextCursor
		if p, err = c.ListPage(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if p.Records[0].ID != "waits" {
		t.Fatalf("listed %s, want waits", p.Records[0].ID)
	}
}

// TestSweepRemovesStaleEntries: a sweep pass reads at most n sequences of
// the index and purges the entries whose record is gone, final, waits for
// nothing the index lists, or is of another queue; entries of runs that
// still wait, and entries younger than minAge, stay; two sweeps at once
// are harmless; an entry put again after the stale one (the run waits
// again) stays.
func TestSweepRemovesStaleEntries(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	record := func(id, queue, state, what string) bus.RunRecord {
		r := bus.RunRecord{ID: id, Queue: queue, State: state, HeartbeatAt: now}
		if what != "" {
			r.Waiting = &bus.Waiting{For: what, Since: now}
		}
		return r
	}
	put := func(r bus.RunRecord, entryQueue string) {
		t.Helper()
		data, _ := json.Marshal(r)
		if _, err := kv.Put(ctx, r.ID, data); err != nil {
			t.Fatal(err)
		}
		e := r
		e.Queue = entryQueue
		if e.Waiting == nil || !bus.Indexed(e.Waiting.For) {
			e.Waiting = &bus.Waiting{For: bus.WaitingApproval}
		}
		if err := c.PutWaiting(ctx, &e, false); err != nil {
			t.Fatal(err)
		}
	}
	put(record("waits", "default", bus.StateRunning, bus.WaitingApproval), "default")
	put(record("done", "default", bus.StatusSucceeded, ""), "default")
	put(record("budget", "default", bus.StateRunning, bus.WaitingBudget), "default")
	put(record("model", "default", bus.StateRunning, bus.WaitingModel), "default")
	put(record("moved", "default", bus.StateRunning, bus.WaitingApproval), "other")
	put(record("going", "default", bus.StateRunning, ""), "default")
	if err := c.PutWaiting(ctx, &bus.RunRecord{ID: "ghost", Queue: "default", Waiting: &bus.Waiting{For: bus.WaitingApproval}}, false); err != nil {
		t.Fatal(err)
	}
	entries := func() string {
		t.Helper()
		s, err := c.JetStream().Stream(ctx, c.Names().WaitingStream())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, id := range []string{"waits", "done", "budget", "model", "going", "ghost"} {
			if _, err := s.GetLastMsgForSubject(ctx, c.Names().WaitingEntry("default", id)); err == nil {
				out = append(out, id)
			}
		}
		if _, err := s.GetLastMsgForSubject(ctx, c.Names().WaitingEntry("other", "moved")); err == nil {
			out = append(out, "moved")
		}
		return strings.Join(out, " ")
	}
	all := "waits done budget model going ghost moved"
	if next, removed, err := c.SweepWaiting(ctx, 0, 100, time.Hour); err != nil || removed != 0 || next != 0 || entries() != all {
		t.Fatalf("a sweep of young entries: next %d, removed %d, %v; left %q", next, removed, err, entries())
	}
	// A pass of 3 sequences: waits, done, budget.
	next, removed, err := c.SweepWaiting(ctx, 0, 3, 0)
	if err != nil || removed != 1 || next != 3 || entries() != "waits budget model going ghost moved" {
		t.Fatalf("the first pass: next %d, removed %d, %v; left %q", next, removed, err, entries())
	}
	// The run "going" waits again before the sweep reaches its old entry:
	// its new entry stays.
	put(record("going", "default", bus.StateRunning, bus.WaitingApproval), "default")
	// Two sweepers at once over the rest.
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			after := next
			for {
				n, _, err := c.SweepWaiting(ctx, after, 2, 0)
				if err != nil || n == 0 {
					errs <- err
					return
				}
				after = n
			}
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := entries(); got != "waits budget going" {
		t.Fatalf("after the sweeps: %q, want waits budget going", got)
	}
}
