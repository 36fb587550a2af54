package callkey

import (
	"context"
	"encoding/json"
	"iter"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
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
	for ev := range Stream(model, nil)(context.Background(), agent.Model{}, llm, agent.StreamOptions{}) {
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

// A key asked for in events the recovery does not restore (here after a
// gap) is not given to a call of the re-asked turn: an answer to the old
// request (other arguments) would name the new call.
func TestCallKeysOfUnrestoredRequestsAreNotReused(t *testing.T) {
	var envs []*bus.Envelope
	add := func(seq uint64, ev any) {
		b, _ := json.Marshal(ev)
		e, err := bus.DecodeEnvelope((&bus.Envelope{Run: "r", Seq: seq, Attempt: 1, Worker: "w", TS: 99, Event: b}).AppendJSON(nil))
		if err != nil {
			t.Fatal(err)
		}
		envs = append(envs, e)
	}
	user := agent.UserText("deploy")
	old := agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonToolUse,
		Content: []agent.Content{agent.ToolCall("call_0", "deploy", map[string]any{"target": "staging"})}}
	add(1, bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1})
	add(2, bus.AgentEvent{Type: "message_end", Message: &user})
	// seq 3 lost (a gap): what follows is not restored.
	add(4, bus.AgentEvent{Type: "message_end", Message: &old})
	add(5, bus.ToolApproval{Type: bus.EventToolApprovalRequested, ToolCallID: "call_0", ToolName: "deploy",
		Args: map[string]any{"target": "staging"}, AnswersAfter: 10})
	rc := workerproto.Recover(envs, 1000)
	if len(rc.Messages) != 1 || len(rc.Pending) != 0 || rc.Resolved["call_0"] != "" {
		t.Fatalf("restored %d messages, pending %v, resolved %v: want only the prompt", len(rc.Messages), rc.Pending, rc.Resolved)
	}
	again := agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonToolUse,
		Content: []agent.Content{agent.ToolCall("call_0", "deploy", map[string]any{"target": "prod"})}}
	model := func(ctx context.Context, _ agent.Model, _ agent.Context, _ agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			c := again.Content[0]
			_ = yield(agent.StreamEvent{Type: agent.StreamToolCallStart, ContentIndex: 0, ID: c.ID}) &&
				yield(agent.StreamEvent{Type: agent.StreamToolCallEnd, ContentIndex: 0, ToolCall: &c}) &&
				yield(agent.StreamEvent{Type: agent.StreamDone, Message: &again})
		}
	}
	used := func() map[string]bool { return rc.UsedKeys }
	var keys []string
	for ev := range Stream(model, func() Prior { return Prior{Used: used()} })(context.Background(), agent.Model{}, agent.Context{Messages: rc.Messages}, agent.StreamOptions{}) {
		switch ev.Type {
		case agent.StreamToolCallStart:
			keys = append(keys, ev.ID)
		case agent.StreamToolCallEnd:
			keys = append(keys, ev.ToolCall.ID)
		case agent.StreamDone:
			keys = append(keys, keysOf(ev.Message))
		}
	}
	if s := strings.Join(keys, ","); s != "call_0-t1-1,call_0-t1-1,call_0-t1-1" {
		t.Fatalf("the re-asked call (target prod) got keys %s (streamed, final); call_0 is the key of a stored, unanswered request (target staging)", s)
	}
}

// A provider may give a call's id only after its toolcall_start (the
// openai assembler does): the streamed keys are computed as the final
// message's, so each toolcall_end carries the key the message keeps.
func TestKeyStreamStreamedKeysMatchTheFinalMessage(t *testing.T) {
	call := func(id string, n float64) agent.Content { return agent.ToolCall(id, "t", map[string]any{"n": n}) }
	for _, c := range []struct {
		name  string
		final []agent.Content
		// starts are the toolcall_starts streamed: content index, id.
		starts [][2]any
	}{
		{"the first id late", []agent.Content{call("a", 0), call("a", 1)}, [][2]any{{0, ""}, {1, "a"}}},
		{"after text, ids late", []agent.Content{agent.Text("x"), call("b", 0), call("", 1), call("b", 2)},
			[][2]any{{1, ""}, {2, ""}, {3, "b"}}},
		{"an id that changes", []agent.Content{call("c", 0), call("c-t1-1", 1), call("c", 2)},
			[][2]any{{0, "c-t1-1"}, {1, "c-t1-1"}, {2, "c"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			final := agent.Message{Role: agent.RoleAssistant, Content: c.final}
			model := func(ctx context.Context, _ agent.Model, _ agent.Context, _ agent.StreamOptions) iter.Seq[agent.StreamEvent] {
				return func(yield func(agent.StreamEvent) bool) {
					var evs []agent.StreamEvent
					for _, s := range c.starts {
						evs = append(evs, agent.StreamEvent{Type: agent.StreamToolCallStart, ContentIndex: s[0].(int), ID: s[1].(string)})
					}
					for i := range c.final {
						if c.final[i].Type == agent.ContentToolCall {
							evs = append(evs, agent.StreamEvent{Type: agent.StreamToolCallEnd, ContentIndex: i, ToolCall: &c.final[i]})
						}
					}
					evs = append(evs, agent.StreamEvent{Type: agent.StreamDone, Message: &final})
					for _, ev := range evs {
						if !yield(ev) {
							return
						}
					}
				}
			}
			ends := map[int]string{}
			var got *agent.Message
			for ev := range Stream(model, nil)(context.Background(), agent.Model{}, agent.Context{}, agent.StreamOptions{}) {
				switch ev.Type {
				case agent.StreamToolCallEnd:
					ends[ev.ContentIndex] = ev.ToolCall.ID
				case agent.StreamDone:
					got = ev.Message
				}
			}
			for i, b := range got.Content {
				if b.Type == agent.ContentToolCall && ends[i] != b.ID {
					t.Fatalf("toolcall_end keys %v, final message keys %s", ends, keysOf(got))
				}
			}
		})
	}
}
