package worker_test

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// A child waits in its parent's lane: a high-priority parent of tenant
// acme submits its child on lane high/acme, with priority high and tenant
// acme.
func TestChildRunInParentsLane(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 2})
	req := fanOut(1, 0, nil)
	req.Priority = bus.PriorityHigh
	req.Metadata = map[string]string{bus.TenantMetadataKey: "acme"}
	req.ID = bus.NewRunID()
	id := childID(t, f.Client, req.ID, "k0")
	// The request is acked away once run: a core subscription sees where
	// it was stored.
	stored, err := f.Client.Conn().SubscribeSync(f.Client.Names().LaneRequest(bus.DefaultQueue, bus.PriorityHigh, "acme", id))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Client.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	parent := f.Submit("", req)
	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	rec, err := f.Client.Status(fleettest.Context(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != bus.StatusSucceeded || rec.Priority != bus.PriorityHigh || rec.Tenant != "acme" {
		t.Fatalf("child record %+v", rec)
	}
	if _, err := stored.NextMsg(time.Second); err != nil {
		t.Fatalf("no child request on its parent's lane: %v", err)
	}
}

// A parent in a lane, resumed, takes its child queued on the queue's old
// subject by a worker before 1.10 (TestQueuedChildIsTheChild's setup).
func TestQueuedChildOnOldSubject(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 1, MaxWaiting: -1, ParkAfter: -1})
	req := fleettest.FauxRun("plan",
		fleettest.ToolCall("k0", bus.ToolRunAgent, map[string]any{"prompt": "research",
			"request": map[string]any{"faux": fleettest.Texts("from this worker")}}),
		fleettest.Text("merged"))
	req.Tools = []string{bus.ToolRunAgent}
	req.Approval = &bus.Approval{Tools: []string{bus.ToolRunAgent}}
	req.Priority = bus.PriorityHigh
	req.Metadata = map[string]string{bus.TenantMetadataKey: "acme"}
	parent := f.Submit("", req)
	childRecord(t, f, parent, "waiting for approval", func(r *bus.RunRecord) bool {
		return r.Waiting != nil && r.Waiting.For == bus.WaitingApproval
	})

	ctx := fleettest.Context(t)
	key, err := f.Client.ChildKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := key.RunID(parent, "k0")
	earlier := &bus.RunRequest{ID: id, Prompt: "research", Model: &bus.ModelRef{Provider: "faux", ID: "scripted"},
		Faux:     &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.Text("from the earlier attempt")}},
		Metadata: map[string]string{bus.TenantMetadataKey: "acme"},
		Children: &bus.Children{MaxDepth: 1, Max: 3},
		Child:    &bus.ChildOf{ParentRunID: parent, RootRunID: parent, Depth: 1, Proof: bus.ProofPlaceholder}}
	body, err := agent.MarshalJSON(earlier)
	if err == nil {
		body, err = key.Seal(bus.DefaultQueue, body)
	}
	if err != nil {
		t.Fatal(err)
	}
	stored, err := f.Client.SubmitRaw(ctx, "", id, body) // the old subject
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Client.Answer(ctx, parent, bus.ApprovalAnswer{ToolCallID: "k0", Decision: "approve", By: "test"}); err != nil {
		t.Fatal(err)
	}
	childRecord(t, f, parent, "waiting for its child", func(r *bus.RunRecord) bool {
		return r.Waiting != nil && r.Waiting.For == bus.WaitingChildren
	})
	f.StartWorker(worker.Config{MaxChildDepth: 1, MaxChildren: 3})

	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	var got string
	for _, m := range f.Transcript(parent).Messages {
		if m.Role == agent.RoleToolResult && m.ToolName == bus.ToolRunAgent {
			got = m.TextOf()
		}
	}
	if got != "from the earlier attempt" {
		t.Fatalf("the call's result %q", got)
	}
	rec, err := f.Client.Status(ctx, id)
	if err != nil || rec.RequestSeq != stored.Seq || rec.Child == nil || rec.Child.ParentRunID != parent {
		t.Fatalf("child record %v %+v (the earlier attempt's request is %d)", err, rec, stored.Seq)
	}
}
