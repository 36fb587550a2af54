package worker_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/llm/faux"
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
	if rec.State != bus.StatusFailed || rec.Reason != bus.ReasonTimeout {
		t.Fatalf("parent %s %s: %s", rec.State, rec.Reason, rec.Error)
	}
	if took := rec.FinishedAt.Sub(submitted); took > 15*time.Second {
		t.Fatalf("parent ended %s after its submit, its timeout is 2 s", took)
	}
	child := childID(t, f.Client, parent, "k0")
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
	req.Limits = &bus.Limits{TimeoutSeconds: 5}
	parent := f.Submit("", req)
	childRecord(t, f, parent, "parked", func(r *bus.RunRecord) bool {
		return r.Parked != nil && r.Waiting != nil && r.Waiting.For == bus.WaitingChildren
	})
	// The index entry is written after the record that begins the wait.
	ctx := fleettest.Context(t)
	for listed := false; !listed; {
		page, err := f.Client.ListPage(ctx, bus.ListOptions{State: bus.StateWaiting})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			listed = listed || r.ID == parent
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the parked parent is not listed waiting (%d listed)", len(page.Records))
		case <-time.After(50 * time.Millisecond):
		}
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
	child := childID(t, f.Client, parent, "k0")
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
// with 10 parents waiting for 2 children each, the records bucket's
// consumers are as many as before (read from the server).
func TestWaitingParentsAddNoConsumers(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 6, ParkAfter: -1})
	// Generous: the listing is read until every parent waits, on a loaded
	// machine too.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
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
	const parents = 10
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

// compactingParent is a priced faux model for a parent that starts its
// children one at a time ("task 0" to "task 2", each answered with a
// long text that makes the parent's context compact), the last child's
// answer held until release is closed, then a fourth, past children.max.
func compactingParent(release <-chan struct{}) *pricedFaux {
	long := strings.Repeat("x", 6000)
	return &pricedFaux{m: faux.New(faux.Options{Fallback: func(llm agent.Context) faux.Response {
		first, last := llm.Messages[0], llm.Messages[len(llm.Messages)-1]
		switch {
		case strings.Contains(llm.SystemPrompt, "context summarization assistant"):
			return fleettest.Text("## Goal\nplan summary")
		case strings.HasPrefix(first.TextOf(), "task "):
			i := strings.TrimPrefix(first.TextOf(), "task ")
			if i == "2" {
				<-release
			}
			return fleettest.Text("answer " + i + " " + long)
		case last.Role == agent.RoleToolResult && strings.Contains(last.TextOf(), "at most"):
			return fleettest.Text("merged")
		case last.Role == agent.RoleToolResult && strings.HasPrefix(last.TextOf(), "answer 2"):
			return fleettest.ToolCall("k3", bus.ToolRunAgent, map[string]any{"prompt": "task 3"})
		case last.Role == agent.RoleToolResult && strings.HasPrefix(last.TextOf(), "answer 1"):
			return fleettest.ToolCall("k2", bus.ToolRunAgent, map[string]any{"prompt": "task 2"})
		case last.Role == agent.RoleToolResult:
			return fleettest.ToolCall("k1", bus.ToolRunAgent, map[string]any{"prompt": "task 1"})
		}
		return fleettest.ToolCall("k0", bus.ToolRunAgent, map[string]any{"prompt": "task 0"})
	}})}
}

// A parent resumed from a compacted context still counts every child in
// its treeCost and against children.max: the first child's call was
// summarised away before the parent's worker was killed, and the resumed
// attempt's context lacks it (the events it reads have it).
func TestTreeCostCountsCompactedChildCalls(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	cfg := func(c worker.Config) worker.Config {
		c.Providers = map[string]worker.Provider{"priced": compactingParent(release)}
		c.ModelWindows = map[string]worker.ModelWindow{"priced/m": {ContextWindow: 3000, ReserveTokens: 500, KeepRecentTokens: 500}}
		return c
	}
	// One slot, kept while waiting: the children run on the second worker.
	kill := killable(f, cfg(worker.Config{Concurrency: 1, MaxWaiting: -1}))
	parent := f.Submit("", &bus.RunRequest{Prompt: "plan", Model: &bus.ModelRef{Provider: "priced", ID: "m"},
		Tools: []string{bus.ToolRunAgent}, Compaction: &bus.Compaction{}, Children: &bus.Children{Max: 3}})
	childRecord(t, f, parent, "running", func(r *bus.RunRecord) bool { return r.State == bus.StateRunning })
	f.StartWorker(cfg(worker.Config{Concurrency: 4}))
	childRecord(t, f, childID(t, f.Client, parent, "k2"), "running", func(r *bus.RunRecord) bool { return r.State == bus.StateRunning })
	kill()
	close(release)
	envs := f.Follow(parent)
	if _, ends := compactionsOf(t, envs); len(ends) == 0 || ends[0].Error != "" {
		t.Fatalf("the parent never compacted: %+v", ends)
	}
	fin := finishedOf(t, envs)
	if fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	want := fin.Cost
	for i := range 3 {
		rec, err := f.Client.Status(fleettest.Context(t), childID(t, f.Client, parent, fmt.Sprintf("k%d", i)))
		if err != nil || rec.Cost <= 0 {
			t.Fatalf("child k%d: %v %+v", i, err, rec)
		}
		want += rec.Cost
	}
	if _, err := f.Client.Status(fleettest.Context(t), childID(t, f.Client, parent, "k3")); err == nil {
		t.Fatal("a fourth child, past children.max 3, was submitted")
	}
	if math.Abs(fin.TreeCost-want) > 1e-9 {
		t.Fatalf("treeCost %v, want %v (own %v)", fin.TreeCost, want, fin.Cost)
	}
}

// A tool gated for the parent stays gated through its child: the child's
// call of it waits for approval (the parent's policy is the child's),
// and aborting the parent ends both.
func TestChildInheritsTheParentsApprovalPolicy(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4, ParkAfter: -1})
	req := fanOut(1, 0, func(int) []agent.ScriptedResponse {
		return []agent.ScriptedResponse{
			fleettest.ToolCall("c", "calculator", map[string]any{"expression": "1+1"}),
			fleettest.Text("computed"),
		}
	})
	// The child's own request asks for calculator, ungated.
	call := req.Faux.Responses[0].Content[0]
	call.Arguments["request"].(map[string]any)["tools"] = []string{"calculator"}
	req.Approval = &bus.Approval{Tools: []string{"calculator"}}
	parent := f.Submit("", req)
	child := childID(t, f.Client, parent, "k0")
	rec := childRecord(t, f, child, "waiting for approval", func(r *bus.RunRecord) bool {
		return r.Finished() || r.Waiting != nil && r.Waiting.For == bus.WaitingApproval
	})
	if rec.Finished() {
		t.Fatalf("the child ran the gated tool unasked: %s %s", rec.State, rec.Reason)
	}
	if _, err := f.Client.Abort(fleettest.Context(t), parent, "test over"); err != nil {
		t.Fatal(err)
	}
	if rec := childRecord(t, f, child, "finished", func(r *bus.RunRecord) bool { return r.Finished() }); rec.State != bus.StatusAborted {
		t.Fatalf("child %s", rec.State)
	}
}

// A run parked for its concurrency key's place is listed waiting from the
// waiting-run index.
func TestKeyParkedRunIsListedWaiting(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4})
	slow := fleettest.FauxRun("hold", slowText(strings.Repeat("slow ", 200))...)
	slow.Faux.TokensPerSecond = 5
	slow.Concurrency = &bus.Concurrency{Key: "k", Limit: 1}
	holder := f.Submit("", slow)
	childRecord(t, f, holder, "running", func(r *bus.RunRecord) bool { return r.State == bus.StateRunning })
	next := fleettest.FauxRun("next", fleettest.Text("done"))
	next.Concurrency = &bus.Concurrency{Key: "k", Limit: 1}
	parked := f.Submit("", next)
	childRecord(t, f, parked, "parked for its key", func(r *bus.RunRecord) bool {
		return r.Parked != nil && r.Waiting != nil && r.Waiting.For == bus.WaitingKey
	})
	ctx := fleettest.Context(t)
	// Any wait: the listing pages the index (a filter on an unindexed kind
	// would walk the records). The entry is written after the record.
	for {
		page, err := f.Client.ListPage(ctx, bus.ListOptions{State: bus.StateWaiting})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Records) == 1 && page.Records[0].ID == parked {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("listed %d waiting, want %s", len(page.Records), parked)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if _, err := f.Client.Abort(ctx, holder, "test over"); err != nil {
		t.Fatal(err)
	}
	if fin := f.WaitFinished(parked); fin.Status != bus.StatusSucceeded {
		t.Fatalf("the parked run %+v", fin)
	}
}

// A parent whose child's notice is lost (a reconnect) still ends its wait:
// it reads the child's record again every recheck.
func TestChildWaitSurvivesALostNotice(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.WithChildRecheck(worker.WithLostNotices(worker.Config{Concurrency: 4, ParkAfter: -1}), 200*time.Millisecond))
	parent := f.Submit("", fanOut(2, 20, nil))
	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
}
