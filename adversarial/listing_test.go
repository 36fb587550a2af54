//go:build adversarial

package adversarial

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// TestListingPagesStayBoundedAndRoleScoped attacks the paged listings of
// waiting runs and approvals (docs/security.md, "Listing waiting runs and
// approvals"): cursors a client crafts (sequences past the end, queued
// cursors whose top is 0 or past the end, junk) and records a compromised
// worker writes (a waiting record listing hundreds of calls asked at the
// epoch, one in 1.2's string form, one that is no JSON) must each give an
// error or a page whose scan stays within MaxScan and one window, within
// the step's bound; the roles that may list (approver, submitter,
// observer) do, and the tool service's cannot read a page.
func TestListingPagesStayBoundedAndRoleScoped(t *testing.T) {
	f := startFleet(t, nil)
	w := f.Worker.Client
	c := ctx(t, 2*time.Minute)
	if err := w.EnsureStreams(c, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	for i := range 150 {
		if err := fleettest.PutWaitingRun(c, w, "default", fmt.Sprintf("wait-%03d", i), "c1", map[string]int{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := w.Records(c)
	if err != nil {
		t.Fatal(err)
	}
	many := make([]bus.PendingApproval, 500)
	for i := range many {
		many[i] = bus.PendingApproval{ToolCallID: fmt.Sprintf("x%d", i), ToolName: "deploy"} // requestedAt 0: the epoch
	}
	hostile := map[string][]byte{"many-calls": mustJSON(t, bus.RunRecord{ID: "many-calls", Queue: "default", State: bus.StateRunning,
		Waiting: &bus.Waiting{For: bus.WaitingApproval, Approvals: many}})}
	hostile["string-form"] = []byte(`{"id":"string-form","queue":"default","state":"running","waiting":"approval"}`)
	hostile["not-json"] = []byte(`{"id":"not-json","state":"running","waiting":{"for":"approval"`)
	for k, v := range hostile {
		if _, err := kv.Put(c, k, v); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 300 {
		if _, err := kv.Put(c, fmt.Sprintf("done-%03d", i), mustJSON(t, bus.RunRecord{ID: fmt.Sprintf("done-%03d", i), Queue: "default", State: bus.StatusSucceeded})); err != nil {
			t.Fatal(err)
		}
	}

	// The waiting index: a worker's entry for a run that is not waiting
	// (finished, or no record at all: a bug or a forgery) is never listed;
	// no other role can write or purge an entry.
	for _, id := range []string{"done-000", "no-record"} {
		if err := w.PutWaiting(c, &bus.RunRecord{ID: id, Queue: "default", Waiting: &bus.Waiting{For: bus.WaitingApproval}}, false); err != nil {
			t.Fatal(err)
		}
	}
	for _, role := range []string{"submitter", "approver", "observer", "console", "toolservice"} {
		rc := f.Connect(t, role)
		wc := ctx(t, time.Second) // a denied publish is never answered
		if err := rc.PutWaiting(wc, &bus.RunRecord{ID: "forged-" + role, Queue: "default", Waiting: &bus.Waiting{For: bus.WaitingApproval}}, false); err == nil {
			t.Errorf("%s wrote a waiting-index entry", role)
		}
		if err := rc.DropWaiting(ctx(t, time.Second), "default", "wait-000"); err == nil {
			t.Errorf("%s purged a waiting-index entry", role)
		}
	}
	ic := ctx(t, 10*time.Second)
	idx, err := w.JetStream().Stream(ic, w.Names().WaitingStream())
	if err != nil {
		t.Fatal(err)
	}
	// Stored entries of the forged ids (a purge of wait-000 would show in
	// the pages below: every waiting run is listed).
	info, err := idx.Info(ic, jetstream.WithSubjectFilter(w.Names().WaitingEntry("default", "forged-*")))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != 0 {
		t.Errorf("forged index entries stored: %v", info.State.Subjects)
	}

	const maxScan = 200
	bound := maxScan + 8192 // the bound is checked between windows
	approver := f.Connect(t, "approver")
	cursors := []string{"18446744073709551615", "1", "q.0.18446744073709551615.a", "q.18446744073709551615.0.a",
		"q.0.0.a", "0", "-1", "q.1.2", "q.1.2.a.b", "../../x", strings.Repeat("9", 5000), "q.1.1." + strings.Repeat("a", 65),
		"w.0", "w.1", "w.18446744073709551615", "w.-1", "w." + strings.Repeat("9", 5000)}
	for _, cur := range cursors {
		sc := ctx(t, 20*time.Second)
		p, err := approver.PendingApprovalsPage(sc, bus.ApprovalsOptions{Limit: 100, Cursor: cur, MaxScan: maxScan})
		if sc.Err() != nil {
			t.Fatalf("cursor %.40q: the page took its whole bound (%v)", cur, err)
		}
		if err == nil && p.Scanned > bound {
			t.Errorf("cursor %.40q: %d records read, over %d", cur, p.Scanned, bound)
		}
		lp, err := approver.ListPage(sc, bus.ListOptions{State: bus.StateWaiting, Limit: 100, Cursor: cur, MaxScan: maxScan})
		if err == nil && lp.Scanned > bound {
			t.Errorf("list cursor %.40q: %d records read, over %d", cur, lp.Scanned, bound)
		}
	}

	// Page through everything as each role that may: every honest call
	// once, the hostile records' calls at most as they are listed.
	for _, role := range []string{"approver", "submitter", "observer"} {
		rc := f.Connect(t, role)
		seen := map[string]bool{}
		cursor := ""
		for pages := 0; ; pages++ {
			if pages > 10 {
				t.Fatalf("%s: more than 10 pages of 100", role)
			}
			p, err := rc.PendingApprovalsPage(ctx(t, 30*time.Second), bus.ApprovalsOptions{Limit: 100, Cursor: cursor})
			if err != nil {
				t.Fatalf("%s: %v", role, err)
			}
			for _, call := range p.Calls {
				if strings.HasPrefix(call.Run, "wait-") {
					seen[call.Run] = true
				}
				if call.Run == "done-000" || call.Run == "no-record" {
					t.Errorf("%s: %s listed from an index entry its record does not back", role, call.Run)
				}
			}
			if cursor = p.NextCursor; cursor == "" {
				break
			}
		}
		if len(seen) != 150 {
			t.Errorf("%s listed %d of the 150 waiting runs", role, len(seen))
		}
	}
	ts := f.Connect(t, "toolservice")
	tc := ctx(t, 5*time.Second)
	if p, err := ts.PendingApprovalsPage(tc, bus.ApprovalsOptions{Limit: 100}); err == nil {
		t.Errorf("the tool service's role listed %d pending calls", len(p.Calls))
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
