package worker_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/budget"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// childID is the run id of call key's child of parent, computed with the
// fleet's child key (the tests' connection may read it; submitters may
// not).
func childID(t *testing.T, c *bus.Client, parent, key string) string {
	t.Helper()
	k, err := c.ChildKey(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	return k.RunID(parent, key)
}

// Review 56, finding 6: a parent whose child is still queued, stored by
// an earlier attempt on a worker with other ceilings (children.max 3, so
// another body), takes the queued request as its child instead of
// failing the call on the id's other body: the child runs once, from
// that request, and the parent gets its answer. The parent's call is
// gated, so the earlier attempt's request is stored before it runs; the
// parent keeps its worker's one slot, so the child stays queued until a
// second worker (ceilings 1 and 3) starts.
func TestQueuedChildIsTheChild(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 1, MaxWaiting: -1, ParkAfter: -1})
	req := fleettest.FauxRun("plan",
		fleettest.ToolCall("k0", bus.ToolRunAgent, map[string]any{"prompt": "research",
			"request": map[string]any{"faux": fleettest.Texts("from this worker")}}),
		fleettest.Text("merged"))
	req.Tools = []string{bus.ToolRunAgent}
	req.Approval = &bus.Approval{Tools: []string{bus.ToolRunAgent}}
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
		Children: &bus.Children{MaxDepth: 1, Max: 3},
		Child:    &bus.ChildOf{ParentRunID: parent, RootRunID: parent, Depth: 1, Proof: bus.ProofPlaceholder}}
	body, err := agent.MarshalJSON(earlier)
	if err == nil {
		body, err = key.Seal(bus.DefaultQueue, body)
	}
	if err != nil {
		t.Fatal(err)
	}
	stored, err := f.Client.SubmitRaw(ctx, "", id, body)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Client.Answer(ctx, parent, bus.ApprovalAnswer{ToolCallID: "k0", Decision: "approve", By: "test"}); err != nil {
		t.Fatal(err)
	}
	childRecord(t, f, parent, "waiting for its child", func(r *bus.RunRecord) bool { // the call took the queued child
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
	if err != nil || rec.Attempt != 1 || rec.RequestSeq != stored.Seq || rec.Child == nil || rec.Child.ParentRunID != parent {
		t.Fatalf("child record %v %+v (the earlier attempt's request is %d)", err, rec, stored.Seq)
	}
}

// Review 56, finding 10: with budgets off a tree's account expires (every
// write carries the tree TTL), so the budgets bucket does not keep every
// tree for ever.
func TestTreeAccountExpires(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.WithTreeTTL(worker.Config{Concurrency: 4, Providers: map[string]worker.Provider{"priced": newPricedFauxN(2)}}, 2*time.Second))
	parent := f.Submit("", &bus.RunRequest{Prompt: "plan", Model: &bus.ModelRef{Provider: "priced", ID: "m"}, Tools: []string{bus.ToolRunAgent},
		Limits: &bus.Limits{MaxCostUsd: 10}})
	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	ctx := fleettest.Context(t)
	kv, err := f.Client.Budgets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	k := budget.Key("tree//"+parent, time.Unix(0, 0))
	s, err := f.Client.JetStream().Stream(ctx, "KV_"+kv.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, "$KV."+kv.Bucket()+"."+k)
	if err != nil {
		t.Fatalf("the tree's account %s: %v", k, err)
	}
	if ttl := m.Header.Get(jetstream.MsgTTLHeader); ttl != "2s" {
		t.Fatalf("the tree's account's last write has TTL %q", ttl)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) { // the server expires it
		_, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tree's account %s is still there: %v", k, err)
		}
	}
}

// A child that parks (its gated call waits past ParkAfter) is woken with
// its kept request, byte for byte on its queue: the seal still verifies
// and the woken child runs as its parent's (children.go, invariant 7).
func TestParkedChildKeepsItsSeal(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4, ParkAfter: 100 * time.Millisecond, ApproveTools: []string{"calculator"}})
	req := fleettest.FauxRun("plan",
		fleettest.ToolCall("k0", bus.ToolRunAgent, map[string]any{"prompt": "compute", "request": map[string]any{
			"tools": []string{"calculator"},
			"faux": bus.FauxScript{Responses: []agent.ScriptedResponse{
				fleettest.ToolCall("c1", "calculator", map[string]any{"expression": "6*7"}), fleettest.Text("child done")}}}}),
		fleettest.Text("merged"))
	req.Tools = []string{bus.ToolRunAgent}
	parent := f.Submit("", req)
	child := childID(t, f.Client, parent, "k0")
	childRecord(t, f, child, "parked", func(r *bus.RunRecord) bool { return r.Parked != nil })
	if _, err := f.Client.Answer(fleettest.Context(t), child, bus.ApprovalAnswer{ToolCallID: "c1", Decision: "approve", By: "test"}); err != nil {
		t.Fatal(err)
	}
	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	rec, err := f.Client.Status(fleettest.Context(t), child)
	if err != nil || rec.State != bus.StatusSucceeded || rec.Child == nil || rec.Child.ParentRunID != parent {
		t.Fatalf("child %v %+v", err, rec)
	}
	for _, m := range f.Transcript(parent).Messages {
		if m.Role == agent.RoleToolResult && m.TextOf() != "child done" {
			t.Fatalf("the call's result %q", m.TextOf())
		}
	}
}
