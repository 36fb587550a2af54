package bus_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// Review 57, finding 8: a name is looked up on each queue's def subject,
// so another queue's schedule of the name does not shadow one (both are
// named instead), and a def whose body names another queue or name than
// its subject is no schedule. Create expects the subject's sequence: it
// works again over a tombstone.
func TestScheduleLookupByNameAcrossQueues(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	n := c.Names()
	f.ServeScheduleOps(bus.DefaultQueue)
	req := json.RawMessage(`{"model":"faux/x","prompt":"tick"}`)
	mine := &bus.Schedule{Name: "dup", Queue: bus.DefaultQueue, Every: "1h", Request: req}
	if _, err := c.CreateSchedule(ctx, mine, false); err != nil {
		t.Fatal(err)
	}
	raw := func(subject string, s bus.Schedule) {
		t.Helper()
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		m := &nats.Msg{Subject: subject, Data: b, Header: nats.Header{}}
		m.Header.Set(nats.MsgRollup, nats.MsgRollupSubject)
		if _, err := c.JetStream().PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// Another team's, written around CreateSchedule (which refuses it).
	raw(n.ScheduleDef("other", "dup"), bus.Schedule{Name: "dup", Queue: "other", Every: "1h", Paused: true, Request: req})
	if info, err := c.GetSchedule(ctx, "dup"); !errors.Is(err, bus.ErrScheduleAmbiguous) {
		t.Errorf("a name on two queues: %+v %v, want ErrScheduleAmbiguous", info, err)
	}
	if err := c.PauseSchedule(ctx, "dup"); !errors.Is(err, bus.ErrScheduleAmbiguous) {
		t.Errorf("pause of a name on two queues: %v", err)
	}
	// A body that is not its subject's.
	raw(n.ScheduleDef(bus.DefaultQueue, "liar"), bus.Schedule{Name: "liar", Queue: "other", Every: "1h", Paused: true, Request: req})
	if info, err := c.GetSchedule(ctx, "liar"); !errors.Is(err, bus.ErrScheduleNotFound) {
		t.Errorf("a def naming another queue: %+v %v, want ErrScheduleNotFound", info, err)
	}
	// Create over a tombstone.
	if _, err := c.CreateSchedule(ctx, &bus.Schedule{Name: "again", Queue: bus.DefaultQueue, Every: "1h", Request: req}, false); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSchedule(ctx, "again"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSchedule(ctx, &bus.Schedule{Name: "again", Queue: bus.DefaultQueue, Every: "1h", Request: req}, false); err != nil {
		t.Errorf("create over a tombstone: %v", err)
	}
}

// Review 57, finding 6: each fire copies its definition, so the stream
// keeps at most MaxFiresKept per subject (the newest: catch-up reads it).
func TestScheduleFiresKeptAreBounded(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	subj := c.Names().ScheduleFire(bus.DefaultQueue, "many")
	for i := range bus.MaxFiresKept + 5 {
		if _, err := c.JetStream().Publish(ctx, subj, []byte(`{}`)); err != nil {
			t.Fatalf("fire %d: %v", i, err)
		}
	}
	st, err := c.JetStream().Stream(ctx, c.Names().SchedulesStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	if got := info.State.Subjects[subj]; got != bus.MaxFiresKept {
		t.Errorf("%d fires kept, want %d", got, bus.MaxFiresKept)
	}
}

// Issue 57: submit list --schedule NAME lists the schedule's queued runs
// too: a queued run has no record yet, and its metadata (the schedule's
// name) is in its request.
func TestListByScheduleShowsQueuedRuns(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{}) // no worker: the runs stay queued
	ctx, c := fleettest.Context(t), f.Client
	for i, pri := range []string{"", bus.PriorityLow} {
		req := fleettest.FauxRun("tick", fleettest.Text("tock"))
		req.Metadata = map[string]string{bus.MetaSchedule: "nightly"}
		req.Priority = pri
		if _, err := c.Submit(ctx, bus.DefaultQueue, req); err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
	}
	if _, err := c.Submit(ctx, bus.DefaultQueue, fleettest.FauxRun("other", fleettest.Text("x"))); err != nil {
		t.Fatal(err)
	}
	recs, err := c.List(ctx, bus.ListOptions{Metadata: map[string]string{bus.MetaSchedule: "nightly"}, MaxScan: -1})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("%d runs of schedule nightly listed, want its 2 queued runs: %+v", len(recs), recs)
	}
	for _, r := range recs {
		if r.State != bus.StateQueued || r.Metadata[bus.MetaSchedule] != "nightly" {
			t.Errorf("listed %s: %s %v", r.ID, r.State, r.Metadata)
		}
	}
}
