package metrics

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Tool names from tool sources become labels up to MaxToolLabels; then
// "other", so a server listing thousands of tools cannot grow the series.
func TestToolLabelsBounded(t *testing.T) {
	m := New(prometheus.NewRegistry(), Config{Tools: []string{"calculator"}})
	var names []string
	for i := range 300 {
		names = append(names, fmt.Sprintf("mcp__tool%d", i))
	}
	m.AllowTools(names)
	for _, n := range append(names, "calculator", "never_listed") {
		m.ToolCall(n, false, time.Millisecond)
	}
	if got := testutil.ToFloat64(m.toolCalls.WithLabelValues("mcp__tool0", "ok")); got != 1 {
		t.Errorf("mcp__tool0: %v", got)
	}
	if got := testutil.ToFloat64(m.toolCalls.WithLabelValues("calculator", "ok")); got != 1 {
		t.Errorf("calculator: %v", got)
	}
	// 199 source tools fit beside calculator; 101 + never_listed are other.
	if got := testutil.ToFloat64(m.toolCalls.WithLabelValues(Other, "ok")); got != 102 {
		t.Errorf("other: %v", got)
	}
	if n := testutil.CollectAndCount(m.toolCalls); n != MaxToolLabels+1 {
		t.Errorf("%d series, want %d", n, MaxToolLabels+1)
	}

	m.ToolSourceUp("mcp:everything", true)
	m.ToolSourceUp("service:calc", false)
	if testutil.ToFloat64(m.toolSourceUp.WithLabelValues("mcp:everything")) != 1 || testutil.ToFloat64(m.toolSourceUp.WithLabelValues("service:calc")) != 0 {
		t.Error("tool_source_up")
	}
	m.ToolSourceConflict("service:calc", true)
	if testutil.ToFloat64(m.toolConflict.WithLabelValues("service:calc")) != 1 {
		t.Error("tool_source_conflict")
	}
}
