package callkey

import (
	"context"
	"iter"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

func assistantWith(ids ...string) agent.Message {
	m := agent.Message{Role: agent.RoleAssistant}
	for _, id := range ids {
		m.Content = append(m.Content, agent.ToolCall(id, "t", map[string]any{}))
	}
	return m
}

func keysOf(m *agent.Message) string {
	var ids []string
	for _, c := range m.ToolCalls() {
		ids = append(ids, c.ID)
	}
	return strings.Join(ids, ",")
}

// Invariant 2 of callkey.go, case by case.
func TestCallKeys(t *testing.T) {
	long := strings.Repeat("x", 200)
	for _, c := range []struct {
		name    string
		context []agent.Message
		ids     []string
		want    string
	}{
		{"unique ids stay", nil, []string{"call_a", "call_b"}, "call_a,call_b"},
		{"repeated in the message", nil, []string{"c1", "c1", "c1"}, "c1,c1-t1-2,c1-t1-3"},
		{"repeated across turns", []agent.Message{agent.UserText("hi"), assistantWith("c1"), agent.UserText("go"), assistantWith("c2")},
			[]string{"c1", "c2", "c3"}, "c1-t3-1,c2-t3-2,c3"},
		{"a hostile id taking the suffixed form", []agent.Message{assistantWith("c1", "c1-t2-1")}, []string{"c1"}, "c1-t2-1-2"},
		{"empty", nil, []string{"", ""}, "call-t1-1,call-t1-2"},
		{"control bytes and spaces", nil, []string{"a b\r\nX-Evil: 1", "ünï"}, "a_b__X-Evil:_1-t1-1,__n__-t1-2"},
		{"too long", nil, []string{long}, strings.Repeat("x", maxKeyBase) + "-t1-1"},
		{"longest kept", nil, []string{long[:maxKeptCallID]}, long[:maxKeptCallID]},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := assistantWith(c.ids...)
			got := newCallKeys(c.context).keyMessage(&m)
			if keysOf(got) != c.want {
				t.Fatalf("keys %s, want %s", keysOf(got), c.want)
			}
			if strings.Join(c.ids, ",") != keysOf(&m) {
				t.Fatalf("the provider's message was changed: %s", keysOf(&m))
			}
		})
	}
}

// Stream renames what streams and the final message alike, without
// touching the provider's events.
func TestKeyStreamRenamesStreamedAndFinalCalls(t *testing.T) {
	final := assistantWith("c1", "c1")
	model := func(ctx context.Context, _ agent.Model, _ agent.Context, _ agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			for i, c := range final.Content {
				tc := c
				for _, ev := range []agent.StreamEvent{
					{Type: agent.StreamToolCallStart, ContentIndex: i, ID: c.ID, Name: c.Name},
					{Type: agent.StreamToolCallEnd, ContentIndex: i, ToolCall: &tc},
				} {
					if !yield(ev) {
						return
					}
				}
			}
			yield(agent.StreamEvent{Type: agent.StreamDone, Message: &final})
		}
	}
	llm := agent.Context{Messages: []agent.Message{agent.UserText("go"), assistantWith("c1")}}
	var streamed []string
	var got *agent.Message
	for ev := range Stream(model)(context.Background(), agent.Model{}, llm, agent.StreamOptions{}) {
		switch ev.Type {
		case agent.StreamToolCallStart:
			streamed = append(streamed, ev.ID)
		case agent.StreamToolCallEnd:
			streamed = append(streamed, ev.ToolCall.ID)
		case agent.StreamDone:
			got = ev.Message
		}
	}
	if s := strings.Join(streamed, ","); s != "c1-t2-1,c1-t2-1,c1-t2-2,c1-t2-2" {
		t.Fatalf("streamed %s", s)
	}
	if keysOf(got) != "c1-t2-1,c1-t2-2" || keysOf(&final) != "c1,c1" {
		t.Fatalf("final %s, provider's %s", keysOf(got), keysOf(&final))
	}
}

// Whatever the ids, keys are unique in the run, valid answer ids (and
// NATS header values), and the same for the same context and message.
func FuzzCallKeys(f *testing.F) {
	f.Add("c1", "c1", "c1-t2-1", "")
	f.Add("a\nb", strings.Repeat("é", 100), " ", "call-t1-1")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		ctx := []agent.Message{assistantWith(a, b), agent.UserText("x"), assistantWith(c)}
		m := assistantWith(a, b, c, d, a)
		got := newCallKeys(ctx).keyMessage(&m)
		again := newCallKeys(ctx).keyMessage(&m)
		if keysOf(got) != keysOf(again) {
			t.Fatalf("keys %s then %s", keysOf(got), keysOf(again))
		}
		seen := map[string]bool{a: true, b: true, c: true}
		for _, tc := range got.ToolCalls() {
			answer := bus.ApprovalAnswer{ToolCallID: tc.ID, Decision: bus.DecisionApprove}
			if seen[tc.ID] || len(answer.Problems()) > 0 || strings.ContainsAny(tc.ID, "\r\n") {
				t.Fatalf("key %q: taken, or not a valid answer id (%v)", tc.ID, answer.Problems())
			}
			seen[tc.ID] = true
		}
	})
}
