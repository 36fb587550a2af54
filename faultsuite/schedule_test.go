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

// scheduleTick is the faux run of the schedules' fires.
var scheduleTick = json.RawMessage(`{"model":"faux/x","prompt":"tick","faux":{"responses":[{"content":[{"type":"text","text":"tock"}]}]}}`)

// createTick creates an @every 1s schedule; overlap allow, so a run cut by
// a fault that still goes when the next fire comes does not hide the fire.
func createTick(t *testing.T, f *fleet, name string) {
	t.Helper()
	ctx, cancel := f.ctx(60 * time.Second)
	defer cancel()
	if _, err := f.c.CreateSchedule(ctx, &bus.Schedule{Name: name, Queue: "default", Every: "1s", Request: scheduleTick,
		Overlap: bus.OverlapAllow}, false); err != nil {
		t.Fatal(err)
	}
}

// scheduleRuns waits, up to within, until the schedule has at least min
// runs, and returns their planned times, sorted; a run listed twice fails.
func scheduleRuns(t *testing.T, f *fleet, name string, min int, within time.Duration) []time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := f.ctx(10 * time.Second)
		recs, err := f.c.List(ctx, bus.ListOptions{Metadata: map[string]string{bus.MetaSchedule: name}, MaxScan: -1})
		cancel()
		if err == nil && len(recs) >= min {
			ids := map[string]bool{}
			planned := make([]time.Time, 0, len(recs))
			for _, r := range recs {
				p, err := time.Parse(time.RFC3339Nano, r.Metadata[bus.MetaScheduledFor])
				if err != nil {
					t.Fatalf("run %s: scheduledFor %q", r.ID, r.Metadata[bus.MetaScheduledFor])
				}
				if ids[r.ID] {
					t.Errorf("FAIL: run %s listed twice", r.ID)
				}
				ids[r.ID] = true
				planned = append(planned, p)
			}
			slices.SortFunc(planned, func(a, b time.Time) int { return a.Compare(b) })
			return planned
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d runs of schedule %s after %s (%d; %v)", min, name, within, len(recs), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// scheduleGaps returns the gaps in the planned seconds (each "a .. b"),
// failing on a second planned twice and on a gap that does not span the
// fault (from before from to after to).
func scheduleGaps(t *testing.T, planned []time.Time, from, to time.Time) []string {
	t.Helper()
	var gaps []string
	for i := 1; i < len(planned); i++ {
		switch d := planned[i].Sub(planned[i-1]); {
		case d == 0:
			t.Errorf("FAIL: planned second %s has two runs", planned[i].Format(time.RFC3339))
		case d == time.Second:
		default:
			gap := planned[i-1].Format(time.RFC3339) + " .. " + planned[i].Format(time.RFC3339)
			gaps = append(gaps, gap)
			if planned[i-1].After(from.Add(time.Second)) || planned[i].Before(to.Add(-time.Second)) {
				t.Errorf("FAIL: a gap outside the fault: %s (fault %s .. %s)", gap, from.UTC().Format(time.RFC3339Nano), to.UTC().Format(time.RFC3339Nano))
			}
		}
	}
	if len(gaps) > 1 {
		t.Errorf("FAIL: %d gaps in the planned seconds, want the fault's only: %s", len(gaps), strings.Join(gaps, "; "))
	}
	return gaps
}

func pauseSchedule(t *testing.T, f *fleet, name string) {
	t.Helper()
	ctx, cancel := f.ctx(30 * time.Second)
	defer cancel()
	if err := f.c.PauseSchedule(ctx, name); err != nil {
		t.Fatal(err)
	}
}

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
	createTick(t, f, "restart")
	before := len(scheduleRuns(t, f, "restart", 4, 60*time.Second))
	nc.kill(0)
	killed := time.Now()
	time.Sleep(3 * time.Second) // the outage
	nc.start(0)
	restarted := time.Now()
	t.Logf("nats: killed at %s, restarted at %s", killed.UTC().Format(time.RFC3339Nano), restarted.UTC().Format(time.RFC3339Nano))
	scheduleRuns(t, f, "restart", before+8, 90*time.Second)
	pauseSchedule(t, f, "restart")
	planned := scheduleRuns(t, f, "restart", before+8, 10*time.Second)
	gaps := scheduleGaps(t, planned, killed, restarted)
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
	for _, p := range procs {
		if p.exited() {
			t.Errorf("FAIL: worker %s exited; last lines:\n%s", p.name, p.tail(20))
		}
	}
	t.Logf("schedule across a NATS restart: %d runs, planned %s .. %s, gaps %v", len(planned),
		planned[0].Format(time.RFC3339), planned[len(planned)-1].Format(time.RFC3339), gaps)
}

// Schedules survive the loss of one node of a 3-node cluster (R3): the
// node leading AGENTS_SCHEDULES is killed during an @every 1s schedule.
// The new leader fires on; no planned second has two runs, and what has
// none is one gap around the leader change.
func TestScheduleSurvivesClusterNodeLoss(t *testing.T) {
	dir := workDir(t)
	nc := startNATS(t, dir, 3, "")
	f := newFleet(t, dir, nc)
	ctx, cancel := f.ctx(60 * time.Second)
	err := f.c.EnsureStreams(ctx, bus.StreamsConfig{Queues: []string{"default"}, Replicas: 3, AckWait: f.ackWait, MaxDeliver: f.maxDeliver})
	cancel()
	if err != nil {
		t.Fatalf("EnsureStreams R3: %v", err)
	}
	if bins.replicasFlag != "" {
		f.extraArgs = []string{bins.replicasFlag, "3"}
	}
	procs := []*proc{f.startWorker("c1"), f.startWorker("c2")}
	createTick(t, f, "cluster")
	before := len(scheduleRuns(t, f, "cluster", 4, 60*time.Second))
	ictx, icancel := f.ctx(10 * time.Second)
	s, err := f.c.JetStream().Stream(ictx, f.c.Names().SchedulesStream())
	var leader string
	if err == nil {
		if info, err := s.Info(ictx); err == nil && info.Cluster != nil {
			leader = info.Cluster.Leader
			if info.Config.Replicas != 3 {
				t.Errorf("FAIL: %s is R%d, want R3", f.c.Names().SchedulesStream(), info.Config.Replicas)
			}
		}
	}
	icancel()
	victim := -1
	for i, nd := range nc.nodes {
		if nd.name == leader {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("no leader of %s known (%q)", f.c.Names().SchedulesStream(), leader)
	}
	nc.kill(victim)
	killed := time.Now()
	t.Logf("cluster: killed %s (leader of %s) at %s", leader, f.c.Names().SchedulesStream(), killed.UTC().Format(time.RFC3339Nano))
	scheduleRuns(t, f, "cluster", before+10, 120*time.Second)
	pauseSchedule(t, f, "cluster")
	planned := scheduleRuns(t, f, "cluster", before+10, 10*time.Second)
	// The gap, if any, lies within the leader change (bounded here by 30 s).
	gaps := scheduleGaps(t, planned, killed, killed)
	for _, p := range procs {
		if p.exited() {
			t.Errorf("FAIL: worker %s exited; last lines:\n%s", p.name, p.tail(20))
		}
	}
	if n := len(gaps); n == 1 {
		parts := strings.Split(gaps[0], " .. ")
		if end, err := time.Parse(time.RFC3339, parts[1]); err == nil && end.After(killed.Add(30*time.Second)) {
			t.Errorf("FAIL: fires stopped for %s after the node loss", gaps[0])
		}
	}
	t.Logf("schedule across a node loss: %d runs, planned %s .. %s, gaps %v", len(planned),
		planned[0].Format(time.RFC3339), planned[len(planned)-1].Format(time.RFC3339), gaps)
}

// Schedules survive a worker's kill -9: of two workers pulling the fires,
// one is killed during an @every 1s schedule (a fire it held comes again,
// to the other, after AckWait 30 s at most). No planned second is lost or
// has two runs.
func TestScheduleSurvivesWorkerKill(t *testing.T) {
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	victim, other := f.startWorker("k1"), f.startWorker("k2")
	createTick(t, f, "kill")
	before := len(scheduleRuns(t, f, "kill", 4, 60*time.Second))
	victim.kill()
	killed := time.Now()
	t.Logf("worker k1 killed at %s", killed.UTC().Format(time.RFC3339Nano))
	// Past the fires consumer's AckWait (30 s), so a fire k1 held has come
	// again to k2.
	scheduleRuns(t, f, "kill", before+35, 120*time.Second)
	pauseSchedule(t, f, "kill")
	planned := scheduleRuns(t, f, "kill", before+35, 10*time.Second)
	if gaps := scheduleGaps(t, planned, killed, killed); len(gaps) > 0 {
		t.Errorf("FAIL: planned seconds without a run after a worker's kill: %v", gaps)
	}
	if other.exited() {
		t.Errorf("FAIL: worker k2 exited; last lines:\n%s", other.tail(20))
	}
	t.Logf("schedule across a worker kill: %d runs, planned %s .. %s", len(planned),
		planned[0].Format(time.RFC3339), planned[len(planned)-1].Format(time.RFC3339))
}
