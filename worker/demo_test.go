package worker

import (
	"context"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
)

// The demo model uses the calculator when it can, so the offline demo
// shows a tool call; otherwise it says it is a demo and echoes the prompt.
func TestDemoModel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, prompt string
		tools        []*agent.Tool
		want         string
	}{
		{"with calculator", "What is 6*7?", BuiltinTools(), "The calculator says: 42"},
		{"no calculator", "What is 6*7?", nil, "You said: What is 6*7?"},
		{"no arithmetic", "hello", BuiltinTools(), "You said: hello"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := DemoProvider()
			a := agent.New(agent.Options{StreamFn: p.Stream, Model: p.Model("demo"), Tools: tc.tools})
			if err := a.Prompt(context.Background(), tc.prompt); err != nil {
				t.Fatal(err)
			}
			msgs := a.Messages()
			last := msgs[len(msgs)-1]
			if last.StopReason != agent.StopReasonStop {
				t.Fatalf("last message %+v", last)
			}
			if got := last.TextOf(); !strings.Contains(got, tc.want) {
				t.Fatalf("reply %q lacks %q", got, tc.want)
			}
		})
	}
}
