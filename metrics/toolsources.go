package metrics

// MaxToolLabels bounds the tool label values: the first this many tool
// names the worker serves are labels, later ones count as "other".
const MaxToolLabels = 200

// AllowTools admits tool names (from tool sources) as tool label values,
// up to MaxToolLabels in all.
func (m *Metrics) AllowTools(names []string) {
	m.toolsMu.Lock()
	defer m.toolsMu.Unlock()
	for _, n := range names {
		if len(m.tools) >= MaxToolLabels {
			return
		}
		m.tools[n] = true
	}
}

// ToolSourceUp sets agentfleet_tool_source_up{source}. Sources are
// configured (MCP servers) or allowed by the operator (tool services), so
// the label stays bounded.
func (m *Metrics) ToolSourceUp(source string, up bool) {
	v := 0.0
	if up {
		v = 1
	}
	m.toolSourceUp.WithLabelValues(source).Set(v)
}

// ToolSourceConflict sets agentfleet_tool_source_conflict{source}: 1 while
// a tool service is refused because its instances announce different
// tools (an impostor, or a rollout that changes them).
func (m *Metrics) ToolSourceConflict(source string, conflict bool) {
	v := 0.0
	if conflict {
		v = 1
	}
	m.toolConflict.WithLabelValues(source).Set(v)
}
