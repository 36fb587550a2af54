package main

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// The run page's child runs (protocol 1.10, docs/protocol.md §17): GET
// /api/runs/{id}/children lists the runs the run's run_agent calls
// started, in call order, each with its state and cost, for the page to
// link to. A child's id is named by its call's events once its request
// is stored (details.childRunId: ids are an HMAC with the fleet's key); a
// child with no record yet is listed "queued"; a record that does not
// name the run as its parent is not its child and is left out.

// maxChildrenListed bounds one answer (the worker's ceiling is 100 a run
// by default).
const maxChildrenListed = 500

// childRun is one child in the answer.
type childRun struct {
	ID       string  `json:"id"`
	Key      string  `json:"key"`
	State    string  `json:"state"`
	Title    string  `json:"title,omitempty"`
	Cost     float64 `json:"cost,omitempty"`
	TreeCost float64 `json:"treeCost,omitempty"`
}

func (s *server) children(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	id, _, ok := s.pathRun(ctx, w, r)
	if !ok {
		return
	}
	// The calls' events name each child's id once its request is stored
	// (ids cannot be computed: an HMAC with the fleet's key).
	envs, err := s.client.ReadEvents(ctx, id, 0)
	if err != nil {
		writeError(w, http.StatusBadGateway, "%v", err)
		return
	}
	// In call order: the calls' starts come in it, their children's ids
	// as each request is stored.
	var calls []string
	ids := map[string]string{}
	for _, env := range envs {
		ev, err := env.Decode()
		if err != nil || ev.Agent == nil || ev.Agent.ToolName != bus.ToolRunAgent {
			continue
		}
		if _, ok := ids[ev.Agent.ToolCallID]; !ok {
			calls = append(calls, ev.Agent.ToolCallID)
			ids[ev.Agent.ToolCallID] = ""
		}
		if cid, ok := bus.ChildRunIDOf(ev.Agent); ok {
			ids[ev.Agent.ToolCallID] = cid
		}
	}
	out := []childRun{}
	for _, call := range calls {
		if ids[call] == "" || len(out) >= maxChildrenListed {
			continue
		}
		c := childRun{ID: ids[call], Key: call, State: "queued"}
		rec, err := s.client.Status(ctx, c.ID)
		switch {
		case errors.Is(err, bus.ErrRunNotFound):
		case err != nil:
			writeError(w, http.StatusBadGateway, "%v", err)
			return
		case rec.State != bus.StateQueued && (rec.Child == nil || rec.Child.ParentRunID != id):
			continue
		default:
			c.State, c.Title, c.Cost, c.TreeCost = rec.State, rec.Title, rec.Cost, rec.TreeCost
		}
		out = append(out, c)
	}
	writeJSON(w, http.StatusOK, out)
}
