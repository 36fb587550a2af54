package worker_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/llm/faux"
	"github.com/agentfleet/agentfleet/worker"
)

// fanOut is a parent's faux script: one turn calling run_agent n times in
// parallel, child i scripted to answer "answer i" (its reply delayed by
// pace tokens per second, 0: at once), then the merged answer.
func fanOut(n int, pace float64, childResponses func(i int) []agent.ScriptedResponse) *bus.RunRequest {
	var calls []agent.Content
	for i := range n {
		responses := []agent.ScriptedResponse{fleettest.Text(fmt.Sprintf("answer %d", i))}
		if childResponses != nil {
			responses = childResponses(i)
		}
		calls = append(calls, agent.ToolCall(fmt.Sprintf("k%d", i), bus.ToolRunAgent, map[string]any{
			"prompt":  fmt.Sprintf("task %d", i),
			"request": map[string]any{"faux": bus.FauxScript{Responses: responses, TokensPerSecond: pace}},
		}))
	}
	req := fleettest.FauxRun("plan",
		agent.ScriptedResponse{Content: calls, StopReason: agent.StopReasonToolUse},
		fleettest.Text("merged"))
	req.Tools = []string{bus.ToolRunAgent}
	return req
}

// childAnswers are the texts of the parent's run_agent results, sorted.
func childAnswers(t *testing.T, tr *bus.Transcript) []string {
	t.Helper()
	var out []string
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult && m.ToolName == bus.ToolRunAgent {
			if m.IsError {
				t.Errorf("run_agent error: %s", m.TextOf())
			}
			out = append(out, m.TextOf())
		}
	}
	slices.Sort(out)
	return out
}

func wantAnswers(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("answer %d", i))
	}
	slices.Sort(out)
	return out
}

// A parent fans out to 10 children over 2 workers and merges their
// answers; each child's record and run_started name its parent.
func TestChildRunsFanOutAndIn(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 3})
	f.StartWorker(worker.Config{Concurrency: 3})
	parent := f.Submit("", fanOut(10, 0, nil))
	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	if got, want := childAnswers(t, f.Transcript(parent)), wantAnswers(10); !slices.Equal(got, want) {
		t.Fatalf("answers %q, want %q", got, want)
	}
	workers := map[string]bool{}
	for i := range 10 {
		id := childID(t, f.Client, parent, fmt.Sprintf("k%d", i))
		rec, err := f.Client.Status(fleettest.Context(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != bus.StatusSucceeded || rec.Child == nil || *rec.Child != (bus.ChildOf{ParentRunID: parent, RootRunID: parent, Depth: 1}) {
			t.Fatalf("child %s record %+v child %+v", id, rec, rec.Child)
		}
		workers[rec.Worker] = true
		envs := f.Follow(id)
		if s := fleettest.Decode(t, envs[0]).RunStarted; s == nil || s.Child == nil || s.Child.ParentRunID != parent {
			t.Fatalf("child run_started %s", fleettest.Dump(envs[:1]))
		}
	}
	if len(workers) != 2 {
		t.Logf("children ran on %d worker(s)", len(workers))
	}
}

// A child past the tree's depth is the tool's error; nothing is
// submitted.
func TestChildRunDepthBound(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{MaxChildDepth: 5})
	req := fanOut(1, 0, nil)
	req.Children = &bus.Children{MaxDepth: 1}
	// The child would start its own child: depth 2 > 1.
	req.Faux.Responses[0].Content[0].Arguments["request"] = map[string]any{
		"tools": []string{bus.ToolRunAgent},
		"faux": bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("g", bus.ToolRunAgent, map[string]any{"prompt": "deeper", "request": map[string]any{"faux": bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.Text("too deep")}}}}),
			fleettest.Text("answer 0"),
		}},
	}
	parent := f.Submit("", req)
	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	child := childID(t, f.Client, parent, "k0")
	tr := f.Transcript(child)
	var refused string
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult && m.IsError {
			refused = m.TextOf()
		}
	}
	if !strings.Contains(refused, "depth 2, the tree's limit is 1") {
		t.Fatalf("grandchild not refused: %q", refused)
	}
	if _, err := f.Client.Status(fleettest.Context(t), childID(t, f.Client, child, "g")); err == nil {
		t.Fatal("the grandchild was submitted")
	}
}

// childRecord watches run's record until ok holds (30 s at most).
func childRecord(t *testing.T, f *fleettest.Fleet, run, what string, ok func(*bus.RunRecord) bool) *bus.RunRecord {
	t.Helper()
	// Only a guard against a hang: on a loaded machine a parent waits for
	// its child behind the queue's other requests, then for its wake
	// behind them again (60 parents and their children took over 30 s).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kv, err := f.Client.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	var last *bus.RunRecord
	for {
		select {
		case e := <-w.Updates():
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			rec, err := bus.DecodeRecord(e)
			if err != nil {
				continue
			}
			if last = rec; ok(rec) {
				return rec
			}
		case <-ctx.Done():
			t.Fatalf("record of %s never %s; last %+v", run, what, last)
		}
	}
}

// slowText is a child's reply that takes about seconds to stream.
func slowText(text string) []agent.ScriptedResponse {
	return []agent.ScriptedResponse{fleettest.Text(text)}
}

// The parent's worker is killed while its 10 children run on another:
// the parent resumes there, finds its children by their ids instead of
// submitting them again (each ran once, attempt 1), and finishes with
// all 10 answers.
func TestChildRunsParentKilled(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	// One slot, kept while waiting: the parent holds it, its children
	// run on the other worker.
	kill := killable(f, worker.Config{Concurrency: 1, MaxWaiting: -1})
	req := fanOut(10, 4, nil) // "answer i" at 4 tokens a second: about a second each
	parent := f.Submit("", req)
	childRecord(t, f, parent, "running", func(r *bus.RunRecord) bool { return r.State == bus.StateRunning })
	f.StartWorker(worker.Config{Concurrency: 12})
	for i := range 10 {
		// Finished counts too: on a loaded machine a child may end before
		// the watch sees it running.
		childRecord(t, f, childID(t, f.Client, parent, fmt.Sprintf("k%d", i)), "running", func(r *bus.RunRecord) bool { return r.State == bus.StateRunning || r.Finished() })
	}
	kill()
	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	if got, want := childAnswers(t, f.Transcript(parent)), wantAnswers(10); !slices.Equal(got, want) {
		t.Fatalf("answers %q, want %q", got, want)
	}
	for i := range 10 {
		id := childID(t, f.Client, parent, fmt.Sprintf("k%d", i))
		starts := 0
		for _, env := range f.Follow(id) {
			if env.Type == bus.EventRunStarted {
				starts++
			}
		}
		rec, err := f.Client.Status(fleettest.Context(t), id)
		if err != nil || rec.Attempt != 1 || starts != 1 {
			t.Fatalf("child %s ran %d times (attempt %d): %v", id, starts, rec.Attempt, err)
		}
	}
}

// 50 parents, each waiting for 2 children, on a worker with 4 slots and
// the default --max-waiting: the parents wait off their slots, so the
// children run and every parent finishes.
func TestChildRunsManyParentsFewSlots(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4})
	var parents []string
	for range 50 {
		parents = append(parents, f.Submit("", fanOut(2, 0, nil)))
	}
	for _, p := range parents {
		if fin := f.WaitFinished(p); fin.Status != bus.StatusSucceeded {
			t.Fatalf("parent %s %+v", p, fin)
		}
		if got, want := childAnswers(t, f.Transcript(p)), wantAnswers(2); !slices.Equal(got, want) {
			t.Fatalf("parent %s answers %q, want %q", p, got, want)
		}
	}
}

// nested is a child request argument: a run that starts one child
// (request next) and then answers, or with next nil a slow leaf.
func nested(next map[string]any) map[string]any {
	if next == nil {
		return map[string]any{"faux": bus.FauxScript{Responses: slowText(strings.Repeat("slow ", 200)), TokensPerSecond: 5}}
	}
	return map[string]any{"tools": []string{bus.ToolRunAgent}, "faux": bus.FauxScript{Responses: []agent.ScriptedResponse{
		fleettest.ToolCall("n", bus.ToolRunAgent, map[string]any{"prompt": "go on", "request": next}),
		fleettest.Text("done"),
	}}}
}

// Aborting a parent aborts its descendants: with 3 levels below it, all
// four runs end aborted within 2 s of the abort.
func TestChildRunsAbortTree(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 8})
	req := fleettest.FauxRun("root",
		fleettest.ToolCall("n", bus.ToolRunAgent, map[string]any{"prompt": "level 1", "request": nested(nested(nested(nil)))}),
		fleettest.Text("done"))
	req.Tools = []string{bus.ToolRunAgent}
	root := f.Submit("", req)
	l1 := childID(t, f.Client, root, "n")
	l2 := childID(t, f.Client, l1, "n")
	l3 := childID(t, f.Client, l2, "n")
	childRecord(t, f, l3, "running", func(r *bus.RunRecord) bool { return r.State == bus.StateRunning })
	aborted := time.Now()
	if _, err := f.Client.Abort(fleettest.Context(t), root, "test"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{root, l1, l2, l3} {
		rec := childRecord(t, f, id, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
		if rec.State != bus.StatusAborted {
			t.Fatalf("run %s %s: %s", id, rec.State, rec.Error)
		}
		if took := rec.FinishedAt.Sub(aborted); took > 2*time.Second {
			t.Fatalf("run %s ended %s after the abort", id, took)
		}
	}
	if rec, _ := f.Client.Status(fleettest.Context(t), l3); rec.Child == nil || rec.Child.Depth != 3 || rec.Child.RootRunID != root {
		t.Fatalf("depth 3 record %+v", rec.Child)
	}
}

// A parent waiting only for its children parks (its request acknowledged,
// nothing of it on the worker); its last child's end wakes it and it
// finishes with every answer.
func TestChildRunsParentParks(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4, ParkAfter: 100 * time.Millisecond})
	parent := f.Submit("", fanOut(3, 4, nil)) // about a second each
	childRecord(t, f, parent, "parked", func(r *bus.RunRecord) bool {
		return r.Parked != nil && r.Waiting != nil && r.Waiting.For == bus.WaitingChildren
	})
	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	if got, want := childAnswers(t, f.Transcript(parent)), wantAnswers(3); !slices.Equal(got, want) {
		t.Fatalf("answers %q, want %q", got, want)
	}
}

// An abort wakes a parent parked for its children, which aborts them.
func TestChildRunsParkedParentAborted(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 4, ParkAfter: 100 * time.Millisecond})
	parent := f.Submit("", fanOut(2, 2, func(int) []agent.ScriptedResponse { return slowText(strings.Repeat("slow ", 100)) }))
	childRecord(t, f, parent, "parked", func(r *bus.RunRecord) bool { return r.Parked != nil })
	if _, err := f.Client.Abort(fleettest.Context(t), parent, "test"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{parent, childID(t, f.Client, parent, "k0"), childID(t, f.Client, parent, "k1")} {
		if rec := childRecord(t, f, id, "finished", func(r *bus.RunRecord) bool { return r.Finished() }); rec.State != bus.StatusAborted {
			t.Fatalf("run %s %s", id, rec.State)
		}
	}
}

// pricedFaux answers by prompt, at $1,000 per million tokens: "plan"
// fans out to three children ("task i", answered "answer i"), then
// merges.
type pricedFaux struct{ m *faux.Model }

func newPricedFaux() *pricedFaux { return newPricedFauxN(3) }

// newPricedFauxN is newPricedFaux with n children.
func newPricedFauxN(n int) *pricedFaux {
	return &pricedFaux{m: faux.New(faux.Options{Fallback: func(llm agent.Context) faux.Response {
		prompt := llm.Messages[0].TextOf()
		turns := 0
		for _, m := range llm.Messages {
			if m.Role == agent.RoleAssistant {
				turns++
			}
		}
		switch {
		case prompt == "plan" && turns == 0:
			var calls []agent.Content
			for i := range n {
				calls = append(calls, agent.ToolCall(fmt.Sprintf("k%d", i), bus.ToolRunAgent, map[string]any{"prompt": fmt.Sprintf("task %d", i)}))
			}
			return agent.ScriptedResponse{Content: calls, StopReason: agent.StopReasonToolUse}
		case prompt == "plan":
			return fleettest.Text("merged")
		}
		return fleettest.Text("answer " + strings.TrimPrefix(prompt, "task "))
	}})}
}

func (p *pricedFaux) Stream(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	return p.m.Stream(ctx, model, llm, opts)
}

func (p *pricedFaux) Model(id string) agent.Model {
	return agent.Model{ID: id, Name: id, API: "faux", Provider: "priced", MaxTokens: 50, Cost: agent.ModelCost{Input: 1000, Output: 1000}}
}

// A parent's run_finished and final record carry the tree's cost: its
// own and its children's; each child's carries its own only.
func TestChildRunsTreeCost(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Providers: map[string]worker.Provider{"priced": newPricedFaux()}})
	parent := f.Submit("", &bus.RunRequest{Prompt: "plan", Model: &bus.ModelRef{Provider: "priced", ID: "m"}, Tools: []string{bus.ToolRunAgent}})
	fin := f.WaitFinished(parent)
	if fin.Status != bus.StatusSucceeded || fin.Cost <= 0 {
		t.Fatalf("parent %+v", fin)
	}
	if got, want := childAnswers(t, f.Transcript(parent)), wantAnswers(3); !slices.Equal(got, want) {
		t.Fatalf("answers %q, want %q", got, want)
	}
	want := fin.Cost
	for i := range 3 {
		id := childID(t, f.Client, parent, fmt.Sprintf("k%d", i))
		rec, err := f.Client.Status(fleettest.Context(t), id)
		if err != nil || rec.Cost <= 0 || rec.TreeCost != 0 {
			t.Fatalf("child %s: %v cost %v tree %v", id, err, rec.Cost, rec.TreeCost)
		}
		want += rec.Cost
	}
	if math.Abs(fin.TreeCost-want) > 1e-9 {
		t.Fatalf("run_finished treeCost %v, want %v (own %v)", fin.TreeCost, want, fin.Cost)
	}
	if rec, err := f.Client.Status(fleettest.Context(t), parent); err != nil || rec.TreeCost != fin.TreeCost {
		t.Fatalf("parent record treeCost %v, run_finished %v: %v", rec.TreeCost, fin.TreeCost, err)
	}
}

// Ten parallel children that would overspend the tree's budget (the
// root's maxCostUsd) together are stopped at it: every run of the tree
// holds its calls' worst case in one account, so the tree's total stays
// within the budget and the children without room fail budget_exceeded.
func TestChildRunsTreeBudget(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 12, Providers: map[string]worker.Provider{"priced": newPricedFauxN(10)}})
	const budget = 0.3
	parent := f.Submit("", &bus.RunRequest{Prompt: "plan", Model: &bus.ModelRef{Provider: "priced", ID: "m"}, Tools: []string{bus.ToolRunAgent},
		Limits: &bus.Limits{MaxCostUsd: budget}})
	fin := f.WaitFinished(parent)
	total, refused := fin.Cost, 0
	for i := range 10 {
		id := childID(t, f.Client, parent, fmt.Sprintf("k%d", i))
		rec := childRecord(t, f, id, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
		total += rec.Cost
		if rec.Reason == bus.ReasonBudgetExceeded {
			refused++
		}
		if rec.Child == nil || rec.Child.TreeMaxCostUsd != budget {
			t.Fatalf("child %s link %+v", id, rec.Child)
		}
	}
	t.Logf("parent %s (%s) cost %.4f, tree %.4f, %d children refused", fin.Status, fin.Reason, fin.Cost, total, refused)
	if refused == 0 || refused == 10 {
		t.Fatalf("%d of 10 children stopped at the tree's budget", refused)
	}
	if total > budget+1e-9 {
		t.Fatalf("the tree spent $%.6f, its budget is $%.2f", total, budget)
	}
}

// Parents whose one child ends around the moment they park (child
// delays 0 to 300 ms, ParkAfter 150 ms) all finish: the parking attempt
// still knows the child it waited for when it looks (invariant 6).
func TestChildFinishesWhileParentParks(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 8, ParkAfter: 150 * time.Millisecond})
	var parents []string
	for i := range 60 {
		text := "w" + strings.Repeat("w", 4*(i%31)) // about i%31 tokens: 0-300 ms at 100 a second
		parents = append(parents, f.Submit("", fanOut(1, 100, func(int) []agent.ScriptedResponse { return slowText(text) })))
	}
	for _, p := range parents {
		if rec := childRecord(t, f, p, "finished", func(r *bus.RunRecord) bool { return r.Finished() }); rec.State != bus.StatusSucceeded {
			t.Fatalf("parent %s %s: %s", p, rec.State, rec.Error)
		}
	}
}

// A child whose wake of its parked parent fails hands its request back
// instead of acking it; the redelivery, which finds the child finished
// (no request read), wakes the parent from the child's record.
func TestChildWakesParentAfterFailedWake(t *testing.T) {
	f := newFleet(t) // not parallel: the wake fault is the package's
	var mu sync.Mutex
	failing := map[string]bool{}
	failed := 0
	wakeFault := func(parent string) error {
		mu.Lock()
		defer mu.Unlock()
		if failing[parent] {
			delete(failing, parent)
			failed++
			return errors.New("test: wake lost")
		}
		return nil
	}
	f.StartWorker(worker.WithWakeFault(worker.Config{Concurrency: 4, ParkAfter: 100 * time.Millisecond}, wakeFault))
	mu.Lock()
	parent := f.Submit("", fanOut(1, 4, nil)) // about a second
	failing[parent] = true
	mu.Unlock()
	childRecord(t, f, parent, "parked", func(r *bus.RunRecord) bool { return r.Parked != nil })
	if rec := childRecord(t, f, parent, "finished", func(r *bus.RunRecord) bool { return r.Finished() }); rec.State != bus.StatusSucceeded {
		t.Fatalf("parent %s: %s", rec.State, rec.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	if failed != 1 {
		t.Fatalf("%d wakes failed, want 1", failed)
	}
}

// A parent attempt that loses its lease while its child runs leaves the
// child alone: the new attempt waits for it and it ends succeeded.
func TestChildSurvivesParentLeaseLoss(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	// Worker A heartbeats later than AckWait and keeps its one slot while
	// waiting: the parent's request is redelivered to B, where its child
	// runs, and A learns at its renewal that it lost the lease.
	f.StartWorker(worker.Config{Concurrency: 1, MaxWaiting: -1, AckWait: time.Second,
		HeartbeatInterval: 1500 * time.Millisecond, WorkerID: "stalled"})
	parent := f.Submit("", fanOut(1, 10, func(int) []agent.ScriptedResponse { return slowText(strings.Repeat("slow ", 40)) }))
	child := childID(t, f.Client, parent, "k0")
	childRecord(t, f, parent, "waiting", func(r *bus.RunRecord) bool {
		return r.Waiting != nil && r.Waiting.For == bus.WaitingChildren
	})
	f.StartWorker(worker.Config{Concurrency: 4, AckWait: time.Second, HeartbeatInterval: 250 * time.Millisecond, WorkerID: "healthy"})
	if rec := childRecord(t, f, child, "finished", func(r *bus.RunRecord) bool { return r.Finished() }); rec.State != bus.StatusSucceeded {
		t.Fatalf("child %s: %s %s", rec.State, rec.Reason, rec.Error)
	}
	if rec := childRecord(t, f, parent, "finished", func(r *bus.RunRecord) bool { return r.Finished() }); rec.State != bus.StatusSucceeded || rec.Attempt < 2 {
		t.Fatalf("parent %s attempt %d: %s", rec.State, rec.Attempt, rec.Error)
	}
}
