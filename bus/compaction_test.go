package bus

import (
	"testing"

	"github.com/agentfleet/agentfleet/agent"
)

// A compaction_end whose first kept message is a tool result was made from
// another transcript (a cut is on a turn boundary): the context is the
// whole transcript, never a tool result without its call.
func TestCompactedContextRejectsACutAtAToolResult(t *testing.T) {
	call := agent.Message{Role: agent.RoleAssistant, Content: []agent.Content{agent.ToolCall("c1", "read", nil)}}
	result := agent.Message{Role: agent.RoleToolResult, ToolCallID: "c1"}
	tr := []agent.Message{agent.UserText("q"), call, result, call, result}
	for _, tc := range []struct {
		first int
		fits  bool
	}{{1, true}, {2, false}, {3, true}, {4, false}, {5, true}, {6, false}, {0, false}} {
		end := &CompactionEnd{Summary: "s", FirstKeptIndex: tc.first}
		if got := CompactionFits(tr, end); got != tc.fits {
			t.Fatalf("firstKeptIndex %d: fits %v, want %v", tc.first, got, tc.fits)
		}
		if got := CompactedContext(tr, end); !tc.fits && len(got) != len(tr) {
			t.Fatalf("firstKeptIndex %d: context of %d messages, want the transcript", tc.first, len(got))
		}
	}
}
