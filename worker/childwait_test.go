package worker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// slowChild is a child reply that takes about 40 s to stream.
func slowChild(int) []agent.ScriptedResponse { return slowText(strings.Repeat("slow ", 200)) }

// A parent's timeout covers its wait for a child: the parent fails
// "timeout" at its deadline, not when the child ends, and the child is
// aborted.
func TestChildWaitCountsAgainstTimeout(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4, ParkAfter: -1})
	req := fanOut(1, 5, slowChild)
	req.Limits = &bus.Limits{TimeoutSeconds: 2}
	submitted := time.Now()
	parent := f.Submit("", req)
	rec := childRecord(t, f, parent, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
	if rec.Reason != bus.ReasonTimeout {
		t.Fatalf("parent %s %s: %s", rec.State, rec.Reason, rec.Error)
	}
	if took := rec.FinishedAt.Sub(submitted); took > 15*time.Second {
		t.Fatalf("parent ended %s after its submit, its timeout is 2 s", took)
	}
	child := bus.ChildRunID(parent, "k0")
	if c := childRecord(t, f, child, "finished", func(r *bus.RunRecord) bool { return r.Finished() }); c.State != bus.StatusAborted {
		t.Fatalf("child %s %s", c.State, c.Reason)
	}
}

// A parent parked for a child that never gets a record (lost before its
// submit) is woken by its timer at its deadline and fails "timeout";
// while parked, the waiting-run index lists it.
func TestParkedParentTimesOutOnALostChild(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.WithLostChildren(worker.Config{Concurrency: 4, ParkAfter: 100 * time.Millisecond},
		func(string) bool { return true }))
	req := fanOut(1, 0, nil)
	req.Limits = &bus.Limits{TimeoutSeconds: 3}
	parent := f.Submit("", req)
	childRecord(t, f, parent, "parked", func(r *bus.RunRecord) bool {
		return r.Parked != nil && r.Waiting != nil && r.Waiting.For == bus.WaitingChildren
	})
	page, err := f.Client.ListPage(fleettest.Context(t), bus.ListOptions{State: bus.StateWaiting})
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, r := range page.Records {
		listed = listed || r.ID == parent
	}
	if !listed {
		t.Errorf("the parked parent is not listed waiting (%d listed)", len(page.Records))
	}
	rec := childRecord(t, f, parent, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
	if rec.Reason != bus.ReasonTimeout {
		t.Fatalf("parent %s %s: %s", rec.State, rec.Reason, rec.Error)
	}
}

// A child whose record is deleted while its parent waits ends the call
// with an error result; the parent goes on and finishes.
func TestChildRecordDeletedEndsTheWait(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.WithChildRecheck(worker.Config{Concurrency: 4, ParkAfter: -1}, 100*time.Millisecond))
	parent := f.Submit("", fanOut(1, 5, slowChild))
	child := bus.ChildRunID(parent, "k0")
	childRecord(t, f, child, "running", func(r *bus.RunRecord) bool { return r.State == bus.StateRunning })
	ctx := fleettest.Context(t)
	kv, err := f.Client.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, child); err != nil {
		t.Fatal(err)
	}
	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	for _, m := range f.Transcript(parent).Messages {
		if m.Role == agent.RoleToolResult && (!m.IsError || !strings.Contains(m.TextOf(), "deleted")) {
			t.Fatalf("run_agent result %q (error %v)", m.TextOf(), m.IsError)
		}
	}
}

// Parents waiting for children cost the server no consumer per call:
// with 20 parents waiting for 2 children each, the records bucket's
// consumers are as many as before (read from the server).
func TestWaitingParentsAddNoConsumers(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 6, ParkAfter: -1})
	ctx := fleettest.Context(t)
	stream, err := f.Client.JetStream().Stream(ctx, "KV_"+f.Client.Names().RecordsBucket())
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() int {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	before := consumers()
	const parents = 20
	var ids []string
	for range parents {
		ids = append(ids, f.Submit("", fanOut(2, 5, slowChild)))
	}
	// Every parent waits (the waiting listing; no watch of the test's own).
	for {
		page, err := f.Client.ListPage(ctx, bus.ListOptions{State: bus.StateWaiting, WaitingFor: bus.WaitingChildren})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Records) == parents {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d parents wait", len(page.Records), parents)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if now := consumers(); now > before+2 {
		t.Fatalf("the records bucket has %d consumers with %d calls waiting, %d before", now, 2*parents, before)
	}
	for _, id := range ids {
		if _, err := f.Client.Abort(ctx, id, "test over"); err != nil {
			t.Fatal(err)
		}
	}
}
