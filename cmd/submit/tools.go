package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/agentfleet/agentfleet/bus"
)

// fleetTool is one tool as the fleet serves it: the workers that have it
// available now.
type fleetTool struct {
	Name        string   `json:"name"`
	Source      string   `json:"source"`
	Description string   `json:"description,omitempty"`
	Workers     []string `json:"workers"`
}

func cmdTools(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "tools", "submit tools [--json]")
	var cf conn
	var asJSON bool
	cf.register(fs.FlagSet, e)
	fs.BoolVar(&asJSON, "json", false, "print a JSON array of tools (name, source, description, workers)")
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return fail(e, usagef("tools takes no arguments (got %q); to submit the prompt %q: submit -- %s", pos[0], "tools", "tools"))
	}
	ctx, cancel := interruptible(ctx, e)
	defer cancel()
	c, err := cf.connect(ctx, e)
	if err != nil {
		return fail(e, err)
	}
	defer c.Close()
	ws, err := c.ListWorkers(ctx)
	if err != nil {
		return fail(e, fleetError(c, err))
	}
	tools := fleetTools(ws)
	if asJSON {
		return writeJSON(e, tools)
	}
	if len(tools) == 0 {
		fmt.Fprintf(e.stderr, "no tools: %d workers are up\n", len(ws))
		return exitOK
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tSOURCE\tWORKERS\tDESCRIPTION")
	for _, t := range tools {
		desc, _, _ := strings.Cut(t.Description, "\n")
		if len(desc) > 80 {
			desc = desc[:77] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", t.Name, t.Source, len(t.Workers), desc)
	}
	_ = tw.Flush()
	return exitOK
}

// fleetTools merges the workers' tool lists; a tool no worker has
// available now is listed with no workers.
func fleetTools(ws []bus.WorkerPresence) []fleetTool {
	byKey := map[string]*fleetTool{}
	for _, w := range ws {
		for _, t := range w.Tools {
			k := t.Name + "\x00" + t.Source
			ft := byKey[k]
			if ft == nil {
				ft = &fleetTool{Name: t.Name, Source: t.Source, Description: t.Description, Workers: []string{}}
				byKey[k] = ft
			}
			if t.Available {
				ft.Workers = append(ft.Workers, w.Worker)
			}
		}
	}
	out := make([]fleetTool, 0, len(byKey))
	for _, t := range byKey {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b fleetTool) int {
		return strings.Compare(a.Name+"\x00"+a.Source, b.Name+"\x00"+b.Source)
	})
	return out
}

// promptWords are command words added after prompts could start with
// them: they are commands only when nothing but their own flags comes
// before them, so `submit --model m tools` still submits the prompt
// "tools" (and `submit -- tools` always does).
var promptWords = map[string]func(e *env) *flag.FlagSet{
	"tools": func(e *env) *flag.FlagSet {
		fs := flag.NewFlagSet("tools", flag.ContinueOnError)
		var cf conn
		cf.register(fs, e)
		fs.Bool("json", false, "")
		return fs
	},
	"budgets": func(e *env) *flag.FlagSet {
		fs := flag.NewFlagSet("budgets", flag.ContinueOnError)
		var cf conn
		cf.register(fs, e)
		var asJSON, all bool
		budgetsFlags(fs, &asJSON, &all) // budgets.go
		return fs
	},
	"approvals": approvalPromptWords("approvals"), // approvals.go
	"approve":   approvalPromptWords("approve"),
	"deny":      approvalPromptWords("deny"),
}

// takesOnly reports whether every flag in args is one fs defines.
func takesOnly(fs *flag.FlagSet, args []string) bool {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") || a == "-" {
			continue // a flag's value
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if fs.Lookup(name) == nil {
			return false
		}
	}
	return true
}
