//go:build adversarial

package adversarial

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// Issue 56: run_agent makes the worker submit a run on the caller's
// behalf. A submitter of tenant acme asks, through its children, for
// another tenant's metadata and a deeper tree than the worker's ceiling
// (its own request asks children.maxDepth 32 of a worker whose ceiling is
// 1). The child asking for the victim's tenant is not submitted; the
// other runs as acme; its own child (depth 2) is refused.
func TestChildRunCannotEscapeItsTenantOrCeilings(t *testing.T) {
	f := startFleet(t, &worker.Config{MaxChildDepth: 1})
	sub := f.Connect(t, "submitter")
	grand := map[string]any{"prompt": "deeper", "request": map[string]any{"faux": bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.Text("too deep")}}}}
	req := fleettest.FauxRun("plan",
		agent.ScriptedResponse{StopReason: agent.StopReasonToolUse, Content: []agent.Content{
			agent.ToolCall("k0", bus.ToolRunAgent, map[string]any{"prompt": "bill the victim",
				"request": map[string]any{"metadata": map[string]string{"tenant": "victim"}, "faux": bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.Text("billed")}}}}),
			agent.ToolCall("k1", bus.ToolRunAgent, map[string]any{"prompt": "go deeper", "request": map[string]any{
				"tools": []string{bus.ToolRunAgent},
				"faux": bus.FauxScript{Responses: []agent.ScriptedResponse{
					fleettest.ToolCall("g", bus.ToolRunAgent, grand), fleettest.Text("child done")}}}}),
		}},
		fleettest.Text("merged"))
	req.ID, req.Tools = "escape-run", []string{bus.ToolRunAgent}
	req.Metadata = map[string]string{"tenant": "acme"}
	req.Children = &bus.Children{MaxDepth: 32, Max: 10_000}
	submit(t, sub, req)
	if fin := follow(t, sub, req.ID).finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	c := ctx(t, 30*time.Second)
	tr, err := sub.LoadTranscript(c, req.ID)
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]agent.Message{}
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult {
			results[m.ToolCallID] = m
		}
	}
	if r := results["k0"]; !r.IsError || !strings.Contains(r.TextOf(), `unknown field "metadata"`) {
		t.Errorf("the call asking for another tenant: %+v", r)
	}
	if _, err := sub.Status(c, childOf(t, f, req.ID, "k0")); err == nil {
		t.Error("the child asking for another tenant was submitted")
	}
	child := childOf(t, f, req.ID, "k1")
	rec, err := sub.Status(c, child)
	if err != nil || rec.Tenant != "acme" || rec.Metadata["tenant"] != "acme" || rec.Child == nil || rec.Child.Depth != 1 {
		t.Fatalf("child record %v %+v", err, rec)
	}
	ctr, err := sub.LoadTranscript(c, child)
	if err != nil {
		t.Fatal(err)
	}
	refused := ""
	for _, m := range ctr.Messages {
		if m.Role == agent.RoleToolResult && m.IsError {
			refused = m.TextOf()
		}
	}
	if !strings.Contains(refused, "the tree's limit is 1") {
		t.Errorf("the grandchild past the worker's ceiling: %q", refused)
	}
	if _, err := sub.Status(c, childOf(t, f, child, "g")); err == nil {
		t.Error("the grandchild past the worker's ceiling was submitted")
	}
}

// oldChildRunID is the child id a submitter can compute: the SHA-256 of
// the parent's id and the call key (the ids before review 56's finding 3).
func oldChildRunID(parent, key string) string {
	h := sha256.Sum256([]byte(parent + "\x00" + key))
	return "c" + hex.EncodeToString(h[:])[:40]
}

// Review 56, finding 3 (the confused deputy) and 5: tenant mallory, a
// submitter, tries to answer victim's run_agent call. Before the victim's
// parent runs it squats every child id it can compute (the SHA-256 ids,
// the call key's fallback form, an HMAC with a guessed key), with a
// forged child link (parent, root, tenant and tree budget of the victim)
// and without; once the real child is queued it copies its sealed request
// under an id of its own with its own answer. Every linked request is
// refused and keeps no link; the victim's parent gets its real child's
// answer. No submitter role reads the child key.
func TestChildRunCannotBeSquattedOrForged(t *testing.T) {
	// One slot, kept while waiting: the real child stays queued until a
	// second worker starts.
	f := startFleet(t, &worker.Config{Concurrency: 1, MaxWaiting: -1})
	mallory := f.Connect(t, "submitter")
	c := ctx(t, 60*time.Second)
	const victim = "victim-plan-1"
	attack := func(id string, link *bus.ChildOf) *bus.RunRequest {
		req := fleettest.FauxRun("squat", fleettest.Text("ATTACKER ANSWER"))
		req.ID, req.Child = id, link
		req.Metadata = map[string]string{"tenant": "victim"}
		return req
	}
	forged := func() *bus.ChildOf {
		return &bus.ChildOf{ParentRunID: victim, RootRunID: victim, Depth: 1, TreeMaxCostUsd: 1000,
			Proof: strings.Repeat("ab", 32)}
	}
	guessed := bus.ChildKey(make([]byte, 32)).RunID(victim, "k0")
	squats := []string{oldChildRunID(victim, "k0"), oldChildRunID(victim, "k0-t1-0"), guessed}
	for _, id := range squats {
		submit(t, mallory, attack(id, forged()))
	}
	plain := attack(oldChildRunID(victim, "k1"), nil)
	submit(t, mallory, plain)

	req := fleettest.FauxRun("plan",
		fleettest.ToolCall("k0", bus.ToolRunAgent, map[string]any{"prompt": "research",
			"request": map[string]any{"faux": fleettest.Texts("REAL ANSWER")}}),
		fleettest.Text("merged"))
	req.ID, req.Tools = victim, []string{bus.ToolRunAgent}
	req.Metadata = map[string]string{"tenant": "victim"}
	victimSub := f.Connect(t, "submitter")
	submit(t, victimSub, req)
	evs := follow(t, mallory, victim)
	upd := evs.wait(t, "the child's id", func(ev *bus.Event) bool {
		_, ok := bus.ChildRunIDOf(ev.Agent)
		return ok
	})
	child, _ := bus.ChildRunIDOf(upd.Agent)
	key, err := f.Worker.ChildKey(c)
	if err != nil {
		t.Fatal(err)
	}
	if child != key.RunID(victim, "k0") || slices.Contains(squats, child) {
		t.Fatalf("the child's id %s", child)
	}
	// The queued child's sealed request, copied under mallory's id with
	// mallory's answer.
	runs, err := mallory.Stream(c, "AGENTS_RUNS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := runs.GetLastMsgForSubject(c, "agents.lane.default.normal.victim."+child) // its parent's lane
	if err != nil {
		t.Fatalf("the queued child: %v", err)
	}
	copied := bytes.ReplaceAll(m.Data, []byte(child), []byte("mallory-copy"))
	copied = bytes.Replace(copied, []byte("REAL ANSWER"), []byte("ATTACKER ANSWER"), 1)
	if _, err := mallory.SubmitRaw(c, "", "mallory-copy", copied); err != nil {
		t.Fatal(err)
	}
	second := f.Connect(t, "worker")
	fleettest.RunWorker(t, worker.Config{Client: second.Client, WorkerID: "adversarial-worker-2", Concurrency: 4,
		DrainTimeout: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(f.WorkerLog, nil))})

	if fin := evs.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("victim's parent %+v", fin)
	}
	if got := results(t, victimSub, victim)["k0"]; got != "REAL ANSWER" {
		t.Fatalf("the victim's call got %q", got)
	}
	for _, id := range append(squats, "mallory-copy") {
		fin := follow(t, mallory, id).finished(t)
		rec, err := mallory.Status(c, id)
		if err != nil || fin.Status != bus.StatusFailed || !strings.Contains(fin.Error, "child.proof") || rec.Child != nil {
			t.Errorf("forged link %s: %+v, record %v %+v", id, fin, err, rec)
		}
	}
	if fin := follow(t, mallory, plain.ID).finished(t); fin.Status != bus.StatusSucceeded {
		t.Errorf("the plain squat %+v", fin)
	}
	for _, role := range []string{"submitter", "observer", "approver", "console"} {
		if k, err := f.Connect(t, role).ChildKey(ctx(t, 5*time.Second)); err == nil || k != nil {
			t.Errorf("%s read the child key", role)
		}
	}
	nc, _ := f.NATS(t, "submitter")
	if _, err := nc.Request("$JS.API.DIRECT.GET.KV_agents_keys.$KV.agents_keys.childkey", nil, 2*time.Second); err == nil {
		t.Error("a submitter's direct get of the child key was answered")
	}
}

// childOf is the id of parent's child of call key (the worker role reads
// the fleet's child key).
func childOf(t *testing.T, f *fleet, parent, key string) string {
	t.Helper()
	k, err := f.Worker.ChildKey(ctx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return k.RunID(parent, key)
}
