package agent_test

import (
	"testing"

	"github.com/agentfleet/agentfleet/agent"
)

// JSON keeps <, > and & as JavaScript writes them, also inside messages.
func TestJSONWithoutHTMLEscapes(t *testing.T) {
	got, err := agent.AppendJSON([]byte("x="), map[string]any{"q": "<a>&</a>"})
	if err != nil || string(got) != `x={"q":"<a>&</a>"}` {
		t.Fatalf("AppendJSON: %s, %v", got, err)
	}
	m := agent.Message{Role: agent.RoleAssistant, Content: []agent.Content{agent.Text("a<b"),
		agent.ToolCall("c1", "t", map[string]any{"e": "1&2"})}, StopReason: agent.StopReasonToolUse}
	raw, err := agent.MarshalJSON(m)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"role":"assistant","content":[{"type":"text","text":"a<b"},{"type":"toolCall","id":"c1","name":"t","arguments":{"e":"1&2"}}],` +
		`"api":"","provider":"","model":"","usage":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"totalTokens":0,"cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}},"stopReason":"toolUse","timestamp":0}`
	if string(raw) != want {
		t.Fatalf("message JSON\n got %s\nwant %s", raw, want)
	}
}
