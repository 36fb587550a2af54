//go:build adversarial

package adversarial

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// Review of issue 56, finding 9: a finished child's notice to its waiting
// parent (agents.childdone.<parent>.<child>, core NATS) is the worker
// role's alone. Every other role that connects to the fleet tries to
// forge one and to listen to them (to learn which runs finish): the
// server refuses both. The worker's own notices pass: a parent's child
// ends and no worker violation is logged.
func TestChildDoneNoticesAreWorkersOnly(t *testing.T) {
	f := startFleet(t, &worker.Config{ParkAfter: -1})
	const subject = "agents.childdone.victim-parent.cforged"
	for _, role := range []string{"submitter", "observer", "approver", "console", "toolservice", "toolcaller"} {
		nc, _ := f.NATS(t, role)
		if err := nc.Publish(subject, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := nc.SubscribeSync("agents.childdone.*.*"); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		if !f.Log.Violation(role, subject) {
			t.Errorf("%s published a child's notice without a permissions violation", role)
		}
		if !f.Log.Violation(role, "agents.childdone.*.*") {
			t.Errorf("%s subscribed to children's notices without a permissions violation", role)
		}
	}
	sub := f.Connect(t, "submitter")
	req := fleettest.FauxRun("plan",
		fleettest.ToolCall("k0", bus.ToolRunAgent, map[string]any{"prompt": "child",
			"request": map[string]any{"faux": bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.Text("child answer")}}}}),
		fleettest.Text("merged"))
	req.ID, req.Tools = "notice-parent", []string{bus.ToolRunAgent}
	submit(t, sub, req)
	if fin := follow(t, sub, req.ID).finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	if f.Log.Violation("worker", "agents.childdone") {
		t.Errorf("the worker role may not use children's notices: %q", f.Log.Lines("Violation", "childdone"))
	}
}

// Review of issue 56, finding 11: a submitter whose runs must ask before
// calling calculator tries to get it called unasked through a child, whose
// own request (its run_agent request argument) lists calculator and asks
// no approval. The child asks all the same: the parent's policy is its.
func TestChildCannotDropTheParentsApproval(t *testing.T) {
	f := startFleet(t, &worker.Config{ParkAfter: -1})
	sub := f.Connect(t, "submitter")
	req := fleettest.FauxRun("plan",
		fleettest.ToolCall("k0", bus.ToolRunAgent, map[string]any{"prompt": "compute",
			"request": map[string]any{"tools": []string{"calculator"}, "faux": bus.FauxScript{Responses: []agent.ScriptedResponse{
				fleettest.ToolCall("c", "calculator", map[string]any{"expression": "1+1"}), fleettest.Text("computed")}}}}),
		fleettest.Text("merged"))
	req.ID, req.Tools = "gated-parent", []string{bus.ToolRunAgent}
	req.Approval = &bus.Approval{Tools: []string{"calculator"}}
	submit(t, sub, req)
	child := follow(t, sub, childOf(t, f, req.ID, "k0"))
	ev := child.wait(t, "the child's call asking for approval or its end", func(ev *bus.Event) bool {
		return ev.Type == bus.EventToolApprovalRequested || ev.Type == bus.EventRunFinished
	})
	if ev.Type != bus.EventToolApprovalRequested || ev.Approval.ToolName != "calculator" {
		t.Fatalf("the child's gated call did not ask: %s", child.summary())
	}
	if _, err := sub.Abort(ctx(t, 10*time.Second), req.ID, "test over"); err != nil {
		t.Fatal(err)
	}
	if fin := child.finished(t); fin.Status != bus.StatusAborted {
		t.Fatalf("child %+v", fin)
	}
}
