package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/agentfleet/agentfleet/bus"
)

// maxTreeRuns bounds the runs `submit status` shows below a run.
const maxTreeRuns = 500

// treeChildren are the child runs (protocol 1.10) that run's run_agent
// calls started, in the order they were started. Their ids cannot be
// computed (an HMAC with the fleet's key): the parent's events name them
// (tool_execution_update and _end, details.childRunId) once their
// requests are stored. A run counts only if its record links it to run:
// a worker checked the link's seal before writing it, so no submitter's
// run shows as another's child (the events, which only workers write,
// name a child only once its request is stored).
func treeChildren(ctx context.Context, c *bus.Client, run string) ([]*bus.RunRecord, error) {
	envs, err := c.ReadEvents(ctx, run, 0)
	if err != nil {
		return nil, err
	}
	var out []*bus.RunRecord
	seen := map[string]bool{}
	for _, env := range envs {
		ev, err := env.Decode()
		if err != nil || ev.Agent == nil {
			continue
		}
		id, ok := bus.ChildRunIDOf(ev.Agent)
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		rec, err := c.Status(ctx, id)
		if err != nil || (rec.State != bus.StateQueued && (rec.Child == nil || rec.Child.ParentRunID != run)) {
			continue // not run's child (a queued one has no record to say)
		}
		out = append(out, rec)
	}
	return out, nil
}

// writeTree prints the child runs below rec, each with its state and
// cost, indented by depth; n counts the runs shown (maxTreeRuns).
func writeTree(ctx context.Context, e *env, st style, c *bus.Client, rec *bus.RunRecord, depth int, n *int) {
	kids, err := treeChildren(ctx, c, rec.ID)
	if err != nil {
		fmt.Fprintf(e.stdout, "%schildren: cannot read: %v\n", strings.Repeat("  ", depth), err)
		return
	}
	for _, k := range kids {
		if *n >= maxTreeRuns {
			fmt.Fprintf(e.stdout, "%s… (more than %d runs)\n", strings.Repeat("  ", depth), maxTreeRuns)
			return
		}
		*n++
		fmt.Fprintf(e.stdout, "%s└ %s  %s  %s  %s\n", strings.Repeat("  ", depth), k.ID, stateColor(st, k.State), money(k.Cost), field(k.Title))
		writeTree(ctx, e, st, c, k, depth+1, n)
	}
}
