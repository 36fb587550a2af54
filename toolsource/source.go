// Package toolsource gives a worker tools it was not compiled with: the
// tools of MCP servers (stdio or Streamable HTTP) and of NATS tool services
// (nats.go micro services). A source keeps its connection alive, follows
// its tool list, and never makes a run's request bad: while it is down,
// its tools fail their calls with an error result that says why.
package toolsource

import (
	"context"
	"strings"

	"github.com/agentfleet/agentfleet/agent"
)

// Source serves the tools of one or more namespaces (`<namespace>__<tool>`).
type Source interface {
	// Run keeps the source connected and its tool list current until ctx
	// is cancelled.
	Run(ctx context.Context)
	// Ready is closed once the first connection attempt ended, well or not.
	Ready() <-chan struct{}
	// Resolve returns the tools of a namespace now, and whether the source
	// serves the namespace at all (configured or allowed; it may be down).
	Resolve(ctx context.Context, namespace string) (tools []*agent.Tool, ok bool)
	// Missing returns a tool of a served namespace that is not there now:
	// its calls fail with an error result saying why.
	Missing(name string) *agent.Tool
	// Status reports the source's parts (up or not) and tools, for
	// presence and metrics.
	Status() ([]SourceStatus, []ToolStatus)
}

// SourceStatus is one MCP server ("mcp:<server>") or tool service
// ("service:<name>").
type SourceStatus struct {
	Name string
	Up   bool
	// Conflict: a tool service refused because its instances announce
	// different tools.
	Conflict bool
}

// ToolStatus is one tool as workers advertise it.
type ToolStatus struct {
	Name        string `json:"name"`
	Source      string `json:"source"`
	Description string `json:"description,omitempty"`
	Available   bool   `json:"available"`
}

// SplitName splits `<namespace>__<tool>`; ok is false without a separator.
func SplitName(name string) (namespace, tool string, ok bool) {
	return strings.Cut(name, Separator)
}

func failingTool(name, description string, err func() error) *agent.Tool {
	return &agent.Tool{
		Name: name, Description: description,
		Parameters: []byte(`{"type":"object"}`),
		Execute: func(context.Context, string, map[string]any, agent.UpdateFunc) (agent.ToolResult, error) {
			return agent.ToolResult{}, err()
		},
	}
}
