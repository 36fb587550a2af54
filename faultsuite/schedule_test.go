//go:build fault && linux

package faultsuite

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// Schedules survive a NATS restart (issue 57): an @every 1s schedule on
// two worker processes, NATS killed (-9) for 3 s and restarted. Every
// planned second outside the outage has exactly one run, none twice; the
// outage is one gap, and at the restart NATS fires once for what it
// missed (a 3 s outage: the fire is on time, so catch-up once and none
// both run it) and goes on every second from there.
func TestScheduleSurvivesNATSRestart(t *testing.T) {
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	procs := []*proc{f.startWorker("s1"), f.startWorker("s2")}
	req := json.RawMessage(`{"model":"faux/x","prompt":"tick","faux":{"responses":[{"content":[{"type":"text","text":"tock"}]}]}}`)
	ctx, cancel := f.ctx(5 * time.Minute)
	defer cancel()
	if _, err := f.c.CreateSchedule(ctx, &bus.Schedule{Name: "restart", Queue: "default", Every: "1s", Request: req,
		// A run cut by the outage may still go when the catch-up fires:
		// overlap allow keeps the count of fires what NATS fired.
		Overlap: bus.OverlapAllow}, false); err != nil {
		t.Fatal(err)
	}
	runs := func(min int, within time.Duration) []bus.RunRecord {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			lctx, lcancel := f.ctx(10 * time.Second)
			recs, err := f.c.List(lctx, bus.ListOptions{Metadata: map[string]string{bus.MetaSchedule: "restart"}, MaxScan: -1})
			lcancel()
			if err == nil && len(recs) >= min {
				return recs
			}
			if time.Now().After(deadline) {
				t.Fatalf("fewer than %d runs of the schedule after %s (%d; %v)", min, within, len(recs), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	before := len(runs(4, 60*time.Second))
	nc.kill(0)
	killed := time.Now()
	time.Sleep(3 * time.Second) // the outage
	nc.start(0)
	restarted := time.Now()
	t.Logf("nats: killed at %s, restarted at %s", killed.UTC().Format(time.RFC3339Nano), restarted.UTC().Format(time.RFC3339Nano))
	runs(before+8, 90*time.Second)
	pctx, pcancel := f.ctx(30 * time.Second)
	err := f.c.PauseSchedule(pctx, "restart")
	pcancel()
	if err != nil {
		t.Fatal(err)
	}
	recs := runs(before+8, 10*time.Second)

	planned := make([]time.Time, 0, len(recs))
	ids := map[string]bool{}
	for _, r := range recs {
		p, err := time.Parse(time.RFC3339Nano, r.Metadata[bus.MetaScheduledFor])
		if err != nil {
			t.Fatalf("run %s: scheduledFor %q", r.ID, r.Metadata[bus.MetaScheduledFor])
		}
		if ids[r.ID] {
			t.Errorf("run %s listed twice", r.ID)
		}
		ids[r.ID] = true
		planned = append(planned, p)
	}
	slices.SortFunc(planned, func(a, b time.Time) int { return a.Compare(b) })
	var gaps []string
	for i := 1; i < len(planned); i++ {
		switch d := planned[i].Sub(planned[i-1]); {
		case d == 0:
			t.Errorf("FAIL: planned second %s has two runs", planned[i].Format(time.RFC3339))
		case d == time.Second:
		default:
			gaps = append(gaps, planned[i-1].Format(time.RFC3339)+" .. "+planned[i].Format(time.RFC3339))
			// The one gap is the outage: it begins before the kill and
			// ends after the restart.
			if planned[i-1].After(killed.Add(time.Second)) || planned[i].Before(restarted.Add(-time.Second)) {
				t.Errorf("FAIL: a gap outside the outage: %s (killed %s, restarted %s)", gaps[len(gaps)-1],
					killed.UTC().Format(time.RFC3339Nano), restarted.UTC().Format(time.RFC3339Nano))
			}
		}
	}
	// The catch-up: NATS fires once at the restart, not for each second
	// it missed (those have no run: the one gap), and an @every schedule
	// goes on from that fire (its planned time, the next less the
	// interval, is the restart's second), so fires resume at once.
	resumed := time.Time{}
	for _, p := range planned {
		if p.After(killed.Add(time.Second)) {
			resumed = p
			break
		}
	}
	if resumed.Before(restarted.Add(-time.Second)) || resumed.After(restarted.Add(2*time.Second)) {
		t.Errorf("FAIL: the first run after the outage is planned %s, want the catch-up fire at the restart (%s)",
			resumed.Format(time.RFC3339Nano), restarted.UTC().Format(time.RFC3339Nano))
	}
	if len(gaps) > 1 {
		t.Errorf("FAIL: %d gaps in the planned seconds, want the outage only: %s", len(gaps), strings.Join(gaps, "; "))
	}
	for _, p := range procs {
		if p.exited() {
			t.Errorf("FAIL: worker %s exited; last lines:\n%s", p.name, p.tail(20))
		}
	}
	t.Logf("schedule across a NATS restart: %d runs, planned %s .. %s, gaps %v", len(planned),
		planned[0].Format(time.RFC3339), planned[len(planned)-1].Format(time.RFC3339), gaps)
}
