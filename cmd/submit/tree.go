package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// maxTreeRuns bounds the runs `submit status` shows below a run.
const maxTreeRuns = 500

// treeChildren are the child runs (protocol 1.10) that run's run_agent
// calls started: their ids follow from the calls' keys (bus.ChildRunID).
// Calls whose child has no record yet are left out.
func treeChildren(ctx context.Context, c *bus.Client, run string) ([]*bus.RunRecord, error) {
	tr, err := c.LoadTranscript(ctx, run)
	if err != nil {
		return nil, err
	}
	var out []*bus.RunRecord
	for _, m := range tr.Messages {
		if m.Role != agent.RoleAssistant {
			continue
		}
		for _, call := range m.ToolCalls() {
			if call.Name != bus.ToolRunAgent {
				continue
			}
			rec, err := c.Status(ctx, bus.ChildRunID(run, call.ID))
			if err != nil {
				continue // not submitted (refused), or not yet
			}
			out = append(out, rec)
		}
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
