package worker_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/metrics"
	"github.com/agentfleet/agentfleet/worker"
)

// scheduleRuns returns the runs of a schedule, by planned time, those
// still queued too: a fire is done once its request is stored, and a
// queued run has no record (its metadata is in the request).
func scheduleRuns(t *testing.T, c *bus.Client, name string) []bus.RunRecord {
	t.Helper()
	ctx := fleettest.Context(t)
	all, err := c.List(ctx, bus.ListOptions{MaxScan: -1})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := c.JetStream().Stream(ctx, c.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	var recs []bus.RunRecord
	for _, r := range all {
		if r.State == bus.StateQueued && r.Metadata == nil {
			subj := c.Names().Submit(r.Queue, r.ID)
			if r.Priority != "" {
				subj = c.Names().LaneRequest(r.Queue, "*", "*", r.ID)
			}
			m, err := runs.GetLastMsgForSubject(ctx, subj)
			switch {
			case errors.Is(err, jetstream.ErrMsgNotFound): // run and finished since the list
				rec, err := c.Status(ctx, r.ID)
				if err != nil {
					t.Fatal(err)
				}
				r = *rec
			case err != nil:
				t.Fatal(err)
			default:
				var req bus.RunRequest
				if err := json.Unmarshal(m.Data, &req); err != nil {
					t.Fatal(err)
				}
				r.Metadata = req.Metadata
			}
		}
		if r.Metadata[bus.MetaSchedule] == name {
			recs = append(recs, r)
		}
	}
	slices.SortFunc(recs, func(a, b bus.RunRecord) int {
		return strings.Compare(a.Metadata[bus.MetaScheduledFor], b.Metadata[bus.MetaScheduledFor])
	})
	return recs
}

// waitScheduleRuns waits until a schedule has at least n runs and returns
// them. It looks every 100 ms: the runs are records other workers write.
func waitScheduleRuns(t *testing.T, c *bus.Client, name string, n int, within time.Duration) []bus.RunRecord {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		recs := scheduleRuns(t, c, name)
		if len(recs) >= n {
			return recs
		}
		if time.Now().After(deadline) {
			t.Fatalf("schedule %s: %d runs after %s, want %d", name, len(recs), within, n)
		}
		<-tick.C
	}
}

func plannedOf(t *testing.T, r bus.RunRecord) time.Time {
	t.Helper()
	p, err := time.Parse(time.RFC3339Nano, r.Metadata[bus.MetaScheduledFor])
	if err != nil {
		t.Fatalf("run %s: scheduledFor %q: %v", r.ID, r.Metadata[bus.MetaScheduledFor], err)
	}
	return p
}

func newSchedule(t *testing.T, name string, req *bus.RunRequest, set func(*bus.Schedule)) *bus.Schedule {
	t.Helper()
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	s := &bus.Schedule{Name: name, Queue: bus.DefaultQueue, Request: body}
	set(s)
	return s
}

// An @every 1s schedule gives one run per second: ten seconds of runs
// with no planned second twice and none missing, each run id the hash of
// its planned time.
func TestScheduleEverySecond(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	// Two workers: both pull the fires; neither is the scheduler.
	f.StartWorker(worker.Config{})
	f.StartWorker(worker.Config{})
	ctx := fleettest.Context(t)
	// Overlap allow: on a loaded machine a run may outlast its second, and
	// overlap skip would then rightly skip the next fire (a gap here).
	s := newSchedule(t, "tick", fleettest.FauxRun("tick", fleettest.Text("tock")), func(s *bus.Schedule) {
		s.Every = "1s"
		s.Overlap = bus.OverlapAllow
	})
	if _, err := f.Client.CreateSchedule(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	recs := waitScheduleRuns(t, f.Client, "tick", 11, 40*time.Second)
	if err := f.Client.PauseSchedule(ctx, "tick"); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var prev time.Time
	for i, r := range recs {
		p := plannedOf(t, r)
		if seen[r.ID] {
			t.Errorf("run %s twice", r.ID)
		}
		seen[r.ID] = true
		if want := bus.ScheduleRunID(bus.DefaultQueue, "tick", p, false); r.ID != want {
			t.Errorf("run %s planned %s: id want %s", r.ID, p, want)
		}
		if p.Nanosecond() != 0 {
			t.Errorf("run %s planned %s: not on a second", r.ID, p)
		}
		if i > 0 && p.Sub(prev) != time.Second {
			t.Errorf("run %s planned %s, %s after the previous (want 1s: no duplicate, no gap)", r.ID, p.Format(time.RFC3339Nano), p.Sub(prev))
		}
		prev = p
	}
}

// A six-field cron fires on its seconds: every other second here, each
// fire planned on an even second and stored within a second of it.
func TestScheduleCronSeconds(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	ctx := fleettest.Context(t)
	s := newSchedule(t, "even", fleettest.FauxRun("even", fleettest.Text("ok")), func(s *bus.Schedule) {
		s.Cron = "*/2 * * * * *"
		s.TimeZone = "Europe/Berlin"
	})
	if _, err := f.Client.CreateSchedule(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	recs := waitScheduleRuns(t, f.Client, "even", 3, 30*time.Second)
	for i, r := range recs {
		p := plannedOf(t, r)
		if p.Nanosecond() != 0 || p.Second()%2 != 0 {
			t.Errorf("run %s planned %s: not an even second", r.ID, p.Format(time.RFC3339Nano))
		}
		if late := r.SubmittedAt.Sub(p); late < 0 || late > 2*time.Second {
			t.Errorf("run %s planned %s submitted %s: %s late", r.ID, p.Format(time.RFC3339Nano), r.SubmittedAt.Format(time.RFC3339Nano), late)
		}
		if i > 0 && p.Sub(plannedOf(t, recs[i-1])) != 2*time.Second {
			t.Errorf("run %s planned %s: %s after the previous", r.ID, p, p.Sub(plannedOf(t, recs[i-1])))
		}
	}
}

// Pause stops the fires (the server's schedule is gone), resume starts
// them again; trigger fires a paused schedule once.
func TestSchedulePauseResume(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	ctx := fleettest.Context(t)
	s := newSchedule(t, "pr", fleettest.FauxRun("pr", fleettest.Text("ok")), func(s *bus.Schedule) { s.Every = "1s" })
	if _, err := f.Client.CreateSchedule(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	waitScheduleRuns(t, f.Client, "pr", 2, 30*time.Second)
	if err := f.Client.PauseSchedule(ctx, "pr"); err != nil {
		t.Fatal(err)
	}
	st, err := f.Client.JetStream().Stream(ctx, f.Client.Names().SchedulesStream())
	if err != nil {
		t.Fatal(err)
	}
	// A fire stored before the pause may still be on its way: the newest
	// fire is read once the pause is stored, and must stay the newest.
	fireSeq := func() uint64 {
		m, err := st.GetLastMsgForSubject(ctx, f.Client.Names().ScheduleFire(bus.DefaultQueue, "pr"))
		if err != nil {
			t.Fatal(err)
		}
		return m.Sequence
	}
	before := fireSeq()
	info, err := f.Client.GetSchedule(ctx, "pr")
	if err != nil {
		t.Fatal(err)
	}
	if !info.Paused || !info.Next.IsZero() {
		t.Errorf("paused schedule: paused %v next %v", info.Paused, info.Next)
	}
	// Three fire intervals with no fire: the absence is what is checked.
	<-time.After(3 * time.Second)
	if after := fireSeq(); after != before {
		t.Errorf("fires went on after the pause: newest fire %d, was %d", after, before)
	}
	n := len(scheduleRuns(t, f.Client, "pr"))
	id, err := f.Client.TriggerSchedule(ctx, "pr")
	if err != nil {
		t.Fatal(err)
	}
	f.WaitFinished(id)
	if err := f.Client.ResumeSchedule(ctx, "pr"); err != nil {
		t.Fatal(err)
	}
	waitScheduleRuns(t, f.Client, "pr", n+3, 30*time.Second)
}

// metricValue is a counter's value, or a histogram's count, of the series
// with the label value (any, when label is ""); -1 without it.
func metricValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			if label != "" && (len(s.GetLabel()) == 0 || s.GetLabel()[0].GetValue() != label) {
				continue
			}
			if s.Counter != nil {
				return s.Counter.GetValue()
			}
			if s.Histogram != nil {
				return float64(s.Histogram.GetSampleCount())
			}
		}
	}
	return -1
}

// Overlap skip: a run that sleeps three seconds on a one-second schedule
// skips the fires while it goes; no two runs of the schedule overlap. The
// metrics count the fires, the skips by reason and the lateness.
func TestScheduleOverlapSkip(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	reg := prometheus.NewRegistry()
	f.StartWorker(worker.Config{Concurrency: 4, Observer: worker.MetricsObserver(metrics.New(reg, metrics.Config{}))})
	ctx := fleettest.Context(t)
	req := &bus.RunRequest{Prompt: "slow", Tools: []string{"sleep"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("s1", "sleep", map[string]any{"seconds": 3}), fleettest.Text("done")}}}
	s := newSchedule(t, "slow", req, func(s *bus.Schedule) { s.Every = "1s" })
	if _, err := f.Client.CreateSchedule(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	recs := waitScheduleRuns(t, f.Client, "slow", 3, 60*time.Second)
	if err := f.Client.PauseSchedule(ctx, "slow"); err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		fin := f.WaitFinished(r.ID)
		if fin.Status != bus.StatusSucceeded {
			t.Errorf("run %s: %s %s", r.ID, fin.Status, fin.Reason)
		}
		if i == 0 {
			continue
		}
		prev, err := f.Client.Status(ctx, recs[i-1].ID)
		if err != nil {
			t.Fatal(err)
		}
		// The list may have shown r still queued (no record yet, no
		// submit time): its record now has one.
		cur, err := f.Client.Status(ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		r = *cur
		// Submitted only once the previous one finished: the fires in
		// between were skipped.
		if r.SubmittedAt.Before(prev.FinishedAt) {
			t.Errorf("run %s submitted %s, before the previous run %s finished (%s)", r.ID, r.SubmittedAt, prev.ID, prev.FinishedAt)
		}
		if gap := plannedOf(t, r).Sub(plannedOf(t, recs[i-1])); gap < 3*time.Second {
			t.Errorf("run %s planned %s after the previous: fires while it ran were not skipped", r.ID, gap)
		}
	}
	fires, skips := metricValue(t, reg, "agentfleet_schedule_fires_total", ""), metricValue(t, reg, "agentfleet_schedule_skips_total", "overlap")
	if fires < float64(len(recs)) || skips < 2 || metricValue(t, reg, "agentfleet_schedule_fire_lateness_seconds", "") != fires {
		t.Errorf("metrics: %v fires (runs %d), %v overlap skips, lateness count %v", fires, len(recs), skips,
			metricValue(t, reg, "agentfleet_schedule_fire_lateness_seconds", ""))
	}
}

// Overlap abort: each fire of a one-second schedule whose runs sleep
// three seconds aborts the run before it; the newest is left to finish.
func TestScheduleOverlapAbort(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4})
	ctx := fleettest.Context(t)
	req := &bus.RunRequest{Prompt: "slow", Tools: []string{"sleep"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("s1", "sleep", map[string]any{"seconds": 3}), fleettest.Text("done")}}}
	s := newSchedule(t, "abortive", req, func(s *bus.Schedule) { s.Every = "1s"; s.Overlap = bus.OverlapAbort })
	if _, err := f.Client.CreateSchedule(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	recs := waitScheduleRuns(t, f.Client, "abortive", 3, 30*time.Second)
	if err := f.Client.PauseSchedule(ctx, "abortive"); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs[:2] {
		if fin := f.WaitFinished(r.ID); fin.Status != bus.StatusAborted {
			t.Errorf("run %s planned %s: %s, want aborted by the next fire", r.ID, plannedOf(t, r).Format(time.RFC3339), fin.Status)
		}
	}
}

// Catch-up after the workers were away: the server kept firing and the
// fires waited in the stream. With catch-up once the newest of them runs,
// and only it; with none, none of them. The schedules fire three times
// (a cron of three seconds), so what is stored is all there is. A third
// schedule, paused while away, runs none of its stored fires (review 57,
// finding 5: they are not the stored definition's).
func TestScheduleCatchUpAfterWorkersAway(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.ServeScheduleOps(bus.DefaultQueue) // no worker yet: a stand-in answers the operations
	ctx := fleettest.Context(t)
	n := f.Client.Names()
	st, err := f.Client.JetStream().Stream(ctx, n.SchedulesStream())
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now().UTC().Add(2 * time.Second).Truncate(time.Second)
	if base.Second() > 55 { // the three seconds in one minute
		base = base.Truncate(time.Minute).Add(time.Minute + time.Second)
	}
	cron := fmt.Sprintf("%d,%d,%d %d %d * * *", base.Second(), base.Second()+1, base.Second()+2, base.Minute(), base.Hour())
	for _, pol := range []string{bus.CatchUpOnce, bus.CatchUpNone} {
		s := newSchedule(t, "away-"+pol, fleettest.FauxRun("tick", fleettest.Text("tock")), func(s *bus.Schedule) { s.Cron = cron; s.CatchUp = pol })
		if _, err := f.Client.CreateSchedule(ctx, s, false); err != nil {
			t.Fatal(err)
		}
	}
	paused := newSchedule(t, "away-paused", fleettest.FauxRun("tick", fleettest.Text("tock")), func(s *bus.Schedule) { s.Every = "1s" })
	if _, err := f.Client.CreateSchedule(ctx, paused, false); err != nil {
		t.Fatal(err)
	}
	// Three fires of each stored with no worker to take them.
	for _, name := range []string{"away-" + bus.CatchUpOnce, "away-" + bus.CatchUpNone, "away-paused"} {
		subj := n.ScheduleFire(bus.DefaultQueue, name)
		for deadline := time.Now().Add(70 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			info, err := st.Info(ctx, jetstream.WithSubjectFilter(subj))
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Subjects[subj] >= 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d fires stored in 70 s", subj, info.State.Subjects[subj])
			}
		}
	}
	if err := f.Client.PauseSchedule(ctx, "away-paused"); err != nil {
		t.Fatal(err)
	}
	// The workers come back; every fire waited, so every one is late here
	// (however soon the worker takes the newest).
	f.StartWorker(worker.Config{ScheduleLate: time.Nanosecond})
	cons, err := f.Client.JetStream().Consumer(ctx, n.SchedulesStream(), n.FiresConsumer())
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ci, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumPending == 0 && ci.NumAckPending == 0 && ci.Delivered.Stream > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fires not all handled in 30 s: %d pending, %d unacknowledged", ci.NumPending, ci.NumAckPending)
		}
	}
	if got := len(scheduleRuns(t, f.Client, "away-paused")); got != 0 {
		t.Errorf("paused while away: %d runs, want 0", got)
	}
	if got := len(scheduleRuns(t, f.Client, "away-"+bus.CatchUpOnce)); got != 1 {
		t.Errorf("catch-up once: %d runs, want 1", got)
	}
	if got := len(scheduleRuns(t, f.Client, "away-"+bus.CatchUpNone)); got != 0 {
		t.Errorf("catch-up none: %d runs, want 0", got)
	}
}

// Review 57, finding 2: a fire's run id is computed from public data, so a
// submitter may take the next ids first (here on another queue). Those
// fires are skipped as taken, counted, and leave .last alone; the next
// fire runs.
func TestScheduleRunIDTakenByAnotherRequest(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	reg := prometheus.NewRegistry()
	f.StartWorker(worker.Config{Observer: worker.MetricsObserver(metrics.New(reg, metrics.Config{}))})
	ctx := fleettest.Context(t)
	s := newSchedule(t, "squat", fleettest.FauxRun("tick", fleettest.Text("tock")), func(s *bus.Schedule) {
		s.Queue = "other"
		s.Cron = "*/2 * * * * *"
	})
	if _, err := f.Client.CreateSchedule(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	p1 := s.NextAfter(time.Now().Add(time.Second), time.Time{})
	p2 := s.NextAfter(p1, time.Time{})
	squatted := map[string]bool{}
	for _, p := range []time.Time{p1, p2} {
		req := fleettest.FauxRun("squat", fleettest.Text("mine"))
		req.ID = bus.ScheduleRunID("other", "squat", p, false)
		if _, err := f.Client.Submit(ctx, bus.DefaultQueue, req); err != nil {
			t.Fatal(err)
		}
		squatted[req.ID] = true
	}
	// The fire after p2 runs; those at p1 and p2 ran nothing of theirs.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		recs := scheduleRuns(t, f.Client, "squat")
		if len(recs) > 0 && plannedOf(t, recs[len(recs)-1]).After(p2) {
			for _, r := range recs {
				if p := plannedOf(t, r); (p.Equal(p1) || p.Equal(p2)) && r.Queue == "other" {
					t.Errorf("run %s on other planned %s, whose id was taken", r.ID, p)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no run of the schedule after %s in 30 s", p2)
		}
	}
	if got := metricValue(t, reg, "agentfleet_schedule_skips_total", "taken"); got != 2 {
		t.Errorf("%v fires skipped as taken, want 2", got)
	}
	if err := f.Client.PauseSchedule(ctx, "squat"); err != nil {
		t.Fatal(err)
	}
	if l, err := f.Client.LastScheduleRun(ctx, "other", "squat"); err != nil || l == nil || squatted[l.Run] {
		t.Errorf("last run %+v (%v): want the schedule's own", l, err)
	}
}

// Review 57, finding 3: a fire a worker took and never acknowledged (it
// died) comes again after AckWait, later than the late limit; it was on
// time, so it runs, even with catch-up none.
func TestScheduleRedeliveredFireIsNotMissed(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.ServeScheduleOps(bus.DefaultQueue) // no worker yet: a stand-in answers the operations
	ctx := fleettest.Context(t)
	n := f.Client.Names()
	js := f.Client.JetStream()
	cons, err := js.Consumer(ctx, n.SchedulesStream(), n.FiresConsumer())
	if err != nil {
		t.Fatal(err)
	}
	// A shorter AckWait than the product's 30 s, still above the worker's
	// late limit below, as 30 s is above the default 30 s.
	cfg := cons.CachedInfo().Config
	cfg.AckWait = 2 * time.Second
	if _, err := js.UpdateConsumer(ctx, n.SchedulesStream(), cfg); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(2 * time.Second).UTC().Truncate(time.Second)
	s := newSchedule(t, "redelivered", fleettest.FauxRun("tick", fleettest.Text("tock")), func(s *bus.Schedule) {
		s.At = &at
		s.CatchUp = bus.CatchUpNone
	})
	if _, err := f.Client.CreateSchedule(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	// The dead worker: takes the fire and does nothing with it.
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got int
	for range batch.Messages() {
		got++
	}
	if got != 1 {
		t.Fatalf("the dead worker took %d fires, want 1 (%v)", got, batch.Error())
	}
	f.StartWorker(worker.Config{ScheduleLate: time.Second, SkipEnsureStreams: true})
	recs := waitScheduleRuns(t, f.Client, "redelivered", 1, 20*time.Second)
	if len(recs) != 1 || !plannedOf(t, recs[0]).Equal(at) {
		t.Errorf("runs %+v, want one planned at %s", recs, at)
	}
}
