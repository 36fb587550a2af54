package main

import (
	"net/http"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// treeParent is a scripted parent that starts two scripted children.
func treeParent(id string) *bus.RunRequest {
	child := func(text string) map[string]any {
		return map[string]any{"faux": bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.Text(text)}}}
	}
	req := fleettest.FauxRun("plan",
		agent.ScriptedResponse{StopReason: agent.StopReasonToolUse, Content: []agent.Content{
			agent.ToolCall("a", bus.ToolRunAgent, map[string]any{"prompt": "research A", "request": child("A is done")}),
			agent.ToolCall("b", bus.ToolRunAgent, map[string]any{"prompt": "research B", "request": child("B is done")}),
		}},
		fleettest.Text("merged"))
	req.ID, req.Tools = id, []string{bus.ToolRunAgent}
	return req
}

// GET /api/runs/{id}/children lists the runs a run's run_agent calls
// started, in call order, each with its state; a run without any lists
// none.
func TestRunChildrenAPI(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{})
	f.submit(treeParent("tree-api"))
	c.waitRun(t, "tree-api", func(r bus.RunRecord) bool { return r.State == bus.StatusSucceeded })
	var kids []childRun
	if code := c.getJSON(t, "/api/runs/tree-api/children", &kids); code != http.StatusOK {
		t.Fatalf("children: %d", code)
	}
	k, err := f.c.ChildKey(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 2 || kids[0].ID != k.RunID("tree-api", "a") || kids[1].ID != k.RunID("tree-api", "b") ||
		kids[0].State != bus.StatusSucceeded || kids[1].State != bus.StatusSucceeded || kids[0].Key != "a" {
		t.Fatalf("children %+v", kids)
	}
	if code := c.getJSON(t, "/api/runs/"+kids[0].ID+"/children", &kids); code != http.StatusOK || len(kids) != 0 {
		t.Fatalf("a leaf's children: %d %+v", code, kids)
	}
	if code := c.getJSON(t, "/api/runs/bad..id/children", &kids); code != http.StatusBadRequest {
		t.Fatalf("a bad id: %d", code)
	}
}
