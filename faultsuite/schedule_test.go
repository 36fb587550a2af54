//go:build fault && linux

package faultsuite

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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

// Schedules survive a NATS restart (issue 57), with the catch-up their
// policy names: four schedules firing every second (@every 1s and the
// cron "* * * * * *", each with catch-up once and none) on two worker
// processes, NATS killed (-9) for 5 s and restarted. While down the
// server fires nothing; at the restart it fires each schedule once for
// what it missed (its catch-up fire, found here as the server fire stored
// more than bus.ScheduleOutageGap after the time its previous fire named).
// With catch-up once that fire has exactly one run, with none it has
// none; every other server fire up to the newest run has exactly one run,
// and no run is planned at a time no fire had. Without the worker's look
// back (afterOutage), catch-up none ran the restart's fire as on time.
func TestScheduleSurvivesNATSRestart(t *testing.T) {
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	procs := []*proc{f.startWorker("s1"), f.startWorker("s2")}
	specs := map[string]bus.Schedule{
		"every-once": {Every: "1s", CatchUp: bus.CatchUpOnce},
		"every-none": {Every: "1s", CatchUp: bus.CatchUpNone},
		"cron-once":  {Cron: "* * * * * *", CatchUp: bus.CatchUpOnce},
		"cron-none":  {Cron: "* * * * * *", CatchUp: bus.CatchUpNone},
	}
	for name, s := range specs {
		s.Name, s.Queue, s.Request, s.Overlap = name, "default", scheduleTick, bus.OverlapAllow
		ctx, cancel := f.ctx(60 * time.Second)
		_, err := f.c.CreateSchedule(ctx, &s, false)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]int{}
	for name := range specs {
		before[name] = len(scheduleRuns(t, f, name, 3, 60*time.Second))
	}
	nc.kill(0)
	killed := time.Now()
	time.Sleep(5 * time.Second) // the outage
	nc.start(0)
	restarted := time.Now()
	t.Logf("nats: killed at %s, restarted at %s", killed.UTC().Format(time.RFC3339Nano), restarted.UTC().Format(time.RFC3339Nano))
	for name := range specs {
		scheduleRuns(t, f, name, before[name]+6, 90*time.Second)
	}
	for name := range specs {
		pauseSchedule(t, f, name)
	}
	for name, s := range specs {
		planned := scheduleRuns(t, f, name, before[name]+6, 10*time.Second)
		runs := map[time.Time]int{}
		for _, p := range planned {
			runs[p]++
		}
		fires := serverFires(t, f, name)
		catchUp := -1
		for i := 1; i < len(fires); i++ {
			if fires[i].stored.Sub(fires[i-1].next) > bus.ScheduleOutageGap {
				if catchUp >= 0 {
					t.Errorf("FAIL: %s: two fires after a gap: %s and %s", name, fires[catchUp].planned.Format(time.RFC3339), fires[i].planned.Format(time.RFC3339))
				}
				catchUp = i
			}
		}
		if catchUp < 0 {
			t.Errorf("FAIL: %s: no catch-up fire after the restart among %d fires", name, len(fires))
			continue
		}
		c := fires[catchUp]
		if c.stored.Before(restarted.Add(-time.Second)) || fires[catchUp-1].stored.After(killed.Add(time.Second)) {
			t.Errorf("FAIL: %s: the gap in the fires (%s .. %s) is not the outage", name, fires[catchUp-1].stored.Format(time.RFC3339Nano), c.stored.Format(time.RFC3339Nano))
		}
		want := 1
		if s.CatchUp == bus.CatchUpNone {
			want = 0
		}
		if runs[c.planned] != want {
			t.Errorf("FAIL: %s (catch-up %s): %d runs of the restart's fire (planned %s), want %d", name, s.CatchUp, runs[c.planned], c.planned.Format(time.RFC3339Nano), want)
		}
		newest := planned[len(planned)-1]
		known := map[time.Time]bool{}
		for i, fi := range fires {
			known[fi.planned] = true
			if i == catchUp || fi.planned.After(newest) {
				continue
			}
			if runs[fi.planned] != 1 {
				t.Errorf("FAIL: %s: the fire planned %s has %d runs, want 1", name, fi.planned.Format(time.RFC3339), runs[fi.planned])
			}
		}
		for p, n := range runs {
			if !known[p] {
				t.Errorf("FAIL: %s: %d runs planned %s, which no fire was", name, n, p.Format(time.RFC3339Nano))
			}
		}
		t.Logf("%s: %d fires, %d runs; the restart's fire planned %s (stored %s, its previous named %s): %d runs",
			name, len(fires), len(planned), c.planned.Format(time.RFC3339Nano), c.stored.Format(time.RFC3339Nano),
			fires[catchUp-1].next.Format(time.RFC3339Nano), runs[c.planned])
	}
	for _, p := range procs {
		if p.exited() {
			t.Errorf("FAIL: worker %s exited; last lines:\n%s", p.name, p.tail(20))
		}
	}
}

// fireInfo is a server fire as stored: its planned time (as a worker
// computes it), store time, and the next fire time it names.
type fireInfo struct{ planned, stored, next time.Time }

// serverFires reads a schedule's server fires from the stream, oldest
// first (triggers left out).
func serverFires(t *testing.T, f *fleet, name string) []fireInfo {
	t.Helper()
	ctx, cancel := f.ctx(30 * time.Second)
	defer cancel()
	n := f.c.Names()
	st, err := f.c.JetStream().Stream(ctx, n.SchedulesStream())
	if err != nil {
		t.Fatal(err)
	}
	var out []fireInfo
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(n.ScheduleFire("default", name)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		seq = m.Sequence + 1
		var s bus.Schedule
		if err := json.Unmarshal(m.Data, &s); err != nil {
			t.Fatalf("fire %d: %v", m.Sequence, err)
		}
		if m.Header.Get(bus.HeaderScheduler) == "" {
			continue // a trigger
		}
		planned, _, err := s.FirePlanned(m.Header, m.Time)
		if err != nil {
			t.Fatalf("fire %d: %v", m.Sequence, err)
		}
		next, _ := time.Parse(time.RFC3339Nano, m.Header.Get("Nats-Schedule-Next"))
		out = append(out, fireInfo{planned: planned, stored: m.Time, next: next})
	}
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

// A NATS restart shorter than an @every interval, in mid-interval, misses
// no planned time: the server's re-anchored fire (restart + interval) runs
// under catch-up none, so no gap beyond the interval (review 57b #2).
func TestScheduleShortRestartMidInterval(t *testing.T) {
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	f.startWorker("s1")
	s := bus.Schedule{Name: "every6", Queue: "default", Every: "6s", CatchUp: bus.CatchUpNone, Overlap: bus.OverlapAllow, Request: scheduleTick}
	ctx, cancel := f.ctx(60 * time.Second)
	if _, err := f.c.CreateSchedule(ctx, &s, false); err != nil {
		t.Fatal(err)
	}
	cancel()
	n0 := len(scheduleRuns(t, f, "every6", 2, 60*time.Second))
	time.Sleep(1500 * time.Millisecond) // mid-interval: about 1.5 s after a fire
	nc.kill(0)
	time.Sleep(time.Second) // the outage
	nc.start(0)
	// The restart's re-anchored fire and the one after it.
	time.Sleep(16 * time.Second)
	planned := scheduleRuns(t, f, "every6", n0+2, 30*time.Second)
	for _, fi := range serverFires(t, f, "every6") {
		t.Logf("fire planned %s stored %s next %s", fi.planned.Format(time.RFC3339Nano), fi.stored.Format(time.RFC3339Nano), fi.next.Format(time.RFC3339Nano))
	}
	for i := 1; i < len(planned); i++ {
		d := planned[i].Sub(planned[i-1])
		if d > 12*time.Second {
			t.Errorf("no run for %s (%s .. %s) of a 6 s schedule after a 1 s restart that missed no planned time", d, planned[i-1].Format(time.RFC3339Nano), planned[i].Format(time.RFC3339Nano))
		}
		if d < 5*time.Second {
			t.Errorf("runs planned %s apart (%s, %s) for an @every 6s schedule", d, planned[i-1].Format(time.RFC3339Nano), planned[i].Format(time.RFC3339Nano))
		}
	}
}

// An outage that covers an @every schedule's planned time: the server's
// re-anchored fire after the restart is the outage's, and catch-up none
// skips it; the next fire runs (review 57b #2).
func TestScheduleRestartOverPlannedTime(t *testing.T) {
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	f.startWorker("s1")
	s := bus.Schedule{Name: "every6", Queue: "default", Every: "6s", CatchUp: bus.CatchUpNone, Overlap: bus.OverlapAllow, Request: scheduleTick}
	ctx, cancel := f.ctx(60 * time.Second)
	if _, err := f.c.CreateSchedule(ctx, &s, false); err != nil {
		t.Fatal(err)
	}
	cancel()
	n0 := len(scheduleRuns(t, f, "every6", 2, 60*time.Second))
	time.Sleep(1500 * time.Millisecond) // about 1.5 s after a fire
	nc.kill(0)
	killed := time.Now()
	time.Sleep(7 * time.Second) // over the next planned time
	nc.start(0)
	// Wait for the run of the second fire after the restart.
	var after []fireInfo
	ran := map[time.Time]bool{}
	for deadline := time.Now().Add(40 * time.Second); ; {
		after = after[:0]
		for _, fi := range serverFires(t, f, "every6") {
			if fi.stored.After(killed) {
				after = append(after, fi)
			}
		}
		for _, p := range scheduleRuns(t, f, "every6", n0, 10*time.Second) {
			ran[p.UTC()] = true
		}
		if len(after) >= 2 && ran[after[1].planned.UTC()] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no run of the second fire after the restart (%d fires after it)", len(after))
		}
		time.Sleep(200 * time.Millisecond) // polling interval
	}
	for _, fi := range after {
		t.Logf("fire planned %s stored %s next %s", fi.planned.Format(time.RFC3339Nano), fi.stored.Format(time.RFC3339Nano), fi.next.Format(time.RFC3339Nano))
	}
	if ran[after[0].planned.UTC()] {
		t.Errorf("the outage's fire (planned %s) ran under catch-up none", after[0].planned.Format(time.RFC3339Nano))
	}
}
