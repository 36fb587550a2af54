//go:build adversarial

package adversarial

import (
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
	if _, err := sub.Status(c, bus.ChildRunID(req.ID, "k0")); err == nil {
		t.Error("the child asking for another tenant was submitted")
	}
	child := bus.ChildRunID(req.ID, "k1")
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
	if _, err := sub.Status(c, bus.ChildRunID(child, "g")); err == nil {
		t.Error("the grandchild past the worker's ceiling was submitted")
	}
}
