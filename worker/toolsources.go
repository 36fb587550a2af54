package worker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/toolsource"
)

// startToolSources starts the tool sources and waits (within setup) for
// each one's first connection attempt, so the first runs see their tools.
// The sources outlive the drain: the returned func stops them.
func (w *Worker) startToolSources(setup context.Context) (stop func()) {
	if len(w.cfg.ToolSources) == 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(setup))
	var wg sync.WaitGroup
	for _, s := range w.cfg.ToolSources {
		wg.Go(func() { s.Run(ctx) })
	}
	for _, s := range w.cfg.ToolSources {
		select {
		case <-s.Ready():
		case <-setup.Done():
		}
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// resolveTools fixes the run's tool set at pickup: built-in and embedded
// tools by name, a source's tools by `<namespace>__<tool>` or a whole
// namespace `<namespace>__*`. A namespace a source serves never makes the
// request bad, even while the source is down: its missing tools fail
// their calls instead. run_started lists the expanded names, sorted.
func (r *run) resolveTools(ctx context.Context) []string {
	w := r.w
	var problems []string
	seen := map[string]bool{}
	var tools []*agent.Tool
	add := func(t *agent.Tool) {
		if !seen[t.Name] {
			seen[t.Name] = true
			tools = append(tools, t)
		}
	}
	// A longer list is the decoder's problem; its first names are checked.
	for _, name := range r.req.Tools[:min(len(r.req.Tools), bus.MaxTools)] {
		if t := w.tools[name]; t != nil {
			add(t)
			continue
		}
		if name == "*" {
			problems = append(problems, `tool "*": name tools or a namespace ("<server>__*"), not every tool`)
			continue
		}
		if ns, rest, ok := toolsource.SplitName(name); ok && ns != "" && rest != "" {
			if src, found := w.resolveNamespace(ctx, ns); src != nil {
				if rest == "*" {
					for _, t := range found {
						if !seen[t.Name] {
							add(w.wrapTool(r.sourceTool(t)))
						}
					}
					continue
				}
				if seen[name] {
					continue
				}
				i := slices.IndexFunc(found, func(t *agent.Tool) bool { return t.Name == name })
				if i >= 0 {
					add(w.wrapTool(r.sourceTool(found[i])))
				} else {
					add(w.wrapTool(r.sourceTool(src.Missing(name))))
				}
				continue
			}
		}
		problems = append(problems, fmt.Sprintf("unknown tool %q: %s%s", clipString(name, 64), w.similarTools(name),
			w.peers.UnknownToolNote(ctx, r.queue, name))) // internal/peers
	}
	slices.SortFunc(tools, func(a, b *agent.Tool) int { return strings.Compare(a.Name, b.Name) })
	r.tools = tools
	r.toolList = make([]string, len(tools))
	for i, t := range tools {
		r.toolList[i] = t.Name
	}
	return problems
}

// sourceTool tells a source's tool which run calls it.
func (r *run) sourceTool(t *agent.Tool) *agent.Tool {
	inner := t.Execute
	call := toolsource.Call{Run: r.id, Attempt: r.attempt}
	return &agent.Tool{
		Name: t.Name, Label: t.Label, Description: t.Description, Parameters: t.Parameters,
		ExecutionMode: t.ExecutionMode, PrepareArguments: t.PrepareArguments,
		Execute: func(ctx context.Context, id string, args map[string]any, update agent.UpdateFunc) (agent.ToolResult, error) {
			return inner(toolsource.WithCall(ctx, call), id, args, update)
		},
	}
}

// resolveNamespace finds the source serving a namespace and its tools now.
func (w *Worker) resolveNamespace(ctx context.Context, ns string) (toolsource.Source, []*agent.Tool) {
	for _, s := range w.cfg.ToolSources {
		if tools, ok := s.Resolve(ctx, ns); ok {
			return s, tools
		}
	}
	return nil, nil
}

// servedToolNames lists every tool the worker serves now, sorted.
func (w *Worker) servedToolNames() []string {
	names := slices.Clone(w.toolNames)
	for _, s := range w.cfg.ToolSources {
		_, tools := s.Status()
		for _, t := range tools {
			if t.Available {
				names = append(names, t.Name)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// similarTools says which served tools look like an unknown name.
func (w *Worker) similarTools(name string) string {
	all := w.servedToolNames()
	if len(all) <= 12 {
		return fmt.Sprintf("this worker has %v", all)
	}
	lname := strings.ToLower(name)
	ns, _, _ := toolsource.SplitName(lname)
	var similar []string
	for _, n := range all {
		ln := strings.ToLower(n)
		nns, _, _ := toolsource.SplitName(ln)
		if strings.Contains(ln, lname) || strings.Contains(lname, ln) || (ns != "" && ns == nns) ||
			editDistance(ln, lname) <= max(2, len(lname)/4) {
			similar = append(similar, n)
		}
		if len(similar) == 12 {
			break
		}
	}
	if len(similar) == 0 {
		return fmt.Sprintf("no tool this worker serves (%d) has a similar name", len(all))
	}
	return fmt.Sprintf("similarly named tools this worker serves: %v", similar)
}

// editDistance is the Levenshtein distance of two short names.
func editDistance(a, b string) int {
	if len(a) > 128 || len(b) > 128 {
		return max(len(a), len(b))
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// ToolSourceObserver is an Observer that is also told, about once a
// second, the state of the worker's tool sources.
type ToolSourceObserver interface {
	ToolSources(parts []toolsource.SourceStatus, tools []string)
}

// ToolSources implements ToolSourceObserver for the metrics.
func (o *metricsObserver) ToolSources(parts []toolsource.SourceStatus, tools []string) {
	o.m.AllowTools(tools)
	for _, p := range parts {
		o.m.ToolSourceUp(p.Name, p.Up)
		o.m.ToolSourceConflict(p.Name, p.Conflict)
	}
}

// observeToolSources tells a ToolSourceObserver the sources' state.
func (w *Worker) observeToolSources() {
	o, ok := w.obs.(ToolSourceObserver)
	if !ok || len(w.cfg.ToolSources) == 0 {
		return
	}
	var parts []toolsource.SourceStatus
	var names []string
	for _, s := range w.cfg.ToolSources {
		p, tools := s.Status()
		parts = append(parts, p...)
		for _, t := range tools {
			names = append(names, t.Name)
		}
	}
	o.ToolSources(parts, names)
}
