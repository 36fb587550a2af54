package workerproto

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/internal/jsonref"
)

// hardStrings covers every escape encoding/json writes.
var hardStrings = []string{"", "plain", "quote \" backslash \\ slash /", "<html> & </html>",
	"\b\f\n\r\t\x00\x01\x1f\x7f", "é ü 中文 🙂", "bad \xff\xfe utf8 \xc3", "line\u2028sep\u2029end", "\xed\xa0\x80 surrogate"}

type eventCase struct {
	ev   agent.Event
	refs Refs
}

// checkAgentEvent fails t unless AppendAgentEvent writes what the
// reflection-based encoding of the wire event writes (its messages by
// internal/jsonref), and on error leaves dst as it was.
func checkAgentEvent(t *testing.T, c eventCase) {
	t.Helper()
	w := NewAgentEvent(&c.ev)
	w.MessageSeq, w.ToolResultSeqs, w.MessageSeqs = c.refs.MessageSeq, c.refs.ToolResultSeqs, c.refs.MessageSeqs
	want, wantErr := agent.MarshalJSON(jsonref.AgentEvent(w))
	got, err := AppendAgentEvent([]byte("prefix"), &c.ev, c.refs)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("event %+v: error %v, reference %v", c.ev, err, wantErr)
	}
	if err != nil {
		if string(got) != "prefix" {
			t.Fatalf("event %+v: on error wrote %q", c.ev, got)
		}
		return
	}
	if !bytes.Equal(got[len("prefix"):], want) {
		t.Fatalf("event %+v:\n got %s\nwant %s", c.ev, got[len("prefix"):], want)
	}
}

// eventMessages are messages of every role and block type.
func eventMessages() []agent.Message {
	usage := agent.Usage{Input: 1234, Output: 321, CacheRead: 100, Reasoning: 20, TotalTokens: 1655,
		Cost: agent.Cost{Input: 0.003702, Output: 1e-7, CacheRead: 123456789.123, CacheWrite: 1e21, Total: 5e-324}}
	var msgs []agent.Message
	for _, s := range hardStrings {
		blocks := []agent.Content{
			{Type: agent.ContentText, Text: s, TextSignature: s},
			{Type: agent.ContentThinking, Thinking: s, ThinkingSignature: s, Redacted: true},
			agent.Image(s, "image/png"),
			agent.ToolCall(s, s, nil),
			{Type: agent.ContentToolCall, ID: "c", Name: "n", Arguments: map[string]any{s: []any{s, 1e-7, nil}}, ThoughtSignature: s},
		}
		msgs = append(msgs,
			agent.Message{Role: agent.RoleUser, Content: blocks, Timestamp: 1764563458123},
			agent.Message{Role: agent.RoleSystem, Content: blocks},
			agent.Message{Role: agent.RoleDeveloper},
			agent.Message{Role: agent.RoleAssistant, Content: blocks, API: s, Provider: s, Model: s, ResponseModel: s,
				ResponseID: s, Usage: usage, StopReason: agent.StopReason(s), ErrorMessage: s, Timestamp: 1},
			agent.Message{Role: agent.RoleAssistant, Content: []agent.Content{}},
			agent.Message{Role: agent.RoleToolResult, ToolCallID: s, ToolName: s, Content: blocks,
				Details: json.RawMessage(`{"d" : "<&>"}`), AddedToolNames: []string{s}, IsError: true},
			agent.Message{Role: agent.RoleToolResult},
			agent.Message{Role: s + "custom", Content: blocks},
			agent.Message{Role: "custom", Raw: json.RawMessage(` {"role":"custom", "x": [1, "<&>"]} `)},
		)
	}
	return msgs
}

func TestAppendAgentEventMatchesReflection(t *testing.T) {
	msg := &agent.Message{Role: agent.RoleAssistant, Content: []agent.Content{agent.Text("<hi> & \"you\"")}}
	call := agent.ToolCall("c1", "calculator", map[string]any{"expression": "1<2"})
	type tc = eventCase
	var cases []tc
	for _, s := range hardStrings {
		cases = append(cases,
			tc{ev: agent.Event{Type: agent.EventMessageUpdate, StreamEvent: &agent.StreamEvent{Type: agent.StreamTextDelta, ContentIndex: 2, Delta: s, Message: msg}}},
			tc{ev: agent.Event{Type: agent.EventMessageUpdate, StreamEvent: &agent.StreamEvent{Type: agent.StreamTextEnd, Content: s, Signature: s}}},
			tc{ev: agent.Event{Type: agent.EventMessageUpdate, StreamEvent: &agent.StreamEvent{Type: agent.StreamToolCallStart, ID: s, Name: s}}},
			tc{ev: agent.Event{Type: agent.EventMessageUpdate, StreamEvent: &agent.StreamEvent{Type: agent.StreamToolCallDelta, Delta: s, Arguments: map[string]any{"a": s}}}},
			tc{ev: agent.Event{Type: agent.EventMessageUpdate, StreamEvent: &agent.StreamEvent{Type: agent.StreamDone, Reason: agent.StopReason(s), Message: msg}}},
			tc{ev: agent.Event{Type: agent.EventType(s)}},
		)
	}
	for _, m := range eventMessages() {
		cases = append(cases,
			tc{ev: agent.Event{Type: agent.EventMessageStart, Message: &m}},
			tc{ev: agent.Event{Type: agent.EventMessageEnd, Message: &m}},
			tc{ev: agent.Event{Type: agent.EventTurnEnd, Message: &m, ToolResults: []agent.Message{m}}, refs: Refs{MessageSeq: 7, ToolResultSeqs: []uint64{8}}},
		)
	}
	allRefs := Refs{MessageSeq: 5, ToolResultSeqs: []uint64{3, 4}, MessageSeqs: []uint64{1, 2, 1 << 63}}
	for _, refs := range []Refs{{}, {MessageSeq: 1}, {ToolResultSeqs: []uint64{}}, {MessageSeqs: []uint64{}}, {ToolResultSeqs: []uint64{0}}, allRefs} {
		// Refs are written for every event type, as the wire struct does.
		cases = append(cases,
			tc{ev: agent.Event{Type: agent.EventAgentStart}, refs: refs},
			tc{ev: agent.Event{Type: agent.EventTurnStart}, refs: refs},
			tc{ev: agent.Event{Type: agent.EventMessageStart, Message: msg}, refs: refs},
			tc{ev: agent.Event{Type: agent.EventMessageUpdate, StreamEvent: &agent.StreamEvent{Type: agent.StreamTextDelta, Delta: "d"}}, refs: refs},
			tc{ev: agent.Event{Type: agent.EventTurnEnd, Message: msg}, refs: refs},
			tc{ev: agent.Event{Type: agent.EventAgentEnd}, refs: refs},
			tc{ev: agent.Event{Type: agent.EventAgentEnd, Messages: []agent.Message{}}, refs: refs},
			tc{ev: agent.Event{Type: agent.EventAgentEnd, Messages: []agent.Message{*msg, *msg}}, refs: refs},
			tc{ev: agent.Event{Type: agent.EventToolExecutionEnd, ToolCallID: "c1", Result: &agent.ToolResult{}}, refs: refs},
		)
	}
	cases = append(cases,
		tc{ev: agent.Event{Type: agent.EventAgentStart}},
		tc{ev: agent.Event{Type: agent.EventTurnStart}},
		tc{ev: agent.Event{Type: agent.EventMessageUpdate}},
		tc{ev: agent.Event{Type: agent.EventMessageStart}},
		tc{ev: agent.Event{Type: agent.EventMessageEnd}},
		// Errors: both paths fail, dst is kept.
		tc{ev: agent.Event{Type: agent.EventMessageEnd, Message: &agent.Message{}}},
		tc{ev: agent.Event{Type: agent.EventMessageEnd, Message: &agent.Message{Role: agent.RoleAssistant, Usage: agent.Usage{Cost: agent.Cost{Total: math.NaN()}}}}},
		tc{ev: agent.Event{Type: agent.EventMessageStart, Message: &agent.Message{Role: agent.RoleUser, Content: []agent.Content{{Type: "video"}}}}},
		tc{ev: agent.Event{Type: agent.EventMessageStart, Message: &agent.Message{Role: "custom", Raw: json.RawMessage(`{`)}}},
		// The fallback.
		tc{ev: agent.Event{Type: agent.EventMessageUpdate, StreamEvent: &agent.StreamEvent{Type: agent.StreamToolCallEnd, ToolCall: &call}}},
		tc{ev: agent.Event{Type: agent.EventToolExecutionStart, ToolCallID: "c1", ToolName: "calculator", Args: map[string]any{"x": "<"}}},
		tc{ev: agent.Event{Type: agent.EventToolExecutionEnd, ToolCallID: "c1", ToolName: "calculator", Result: &agent.ToolResult{}, IsError: true}},
		tc{ev: agent.Event{Type: "some_future_event", ToolCallID: "x"}},
	)
	for _, c := range cases {
		checkAgentEvent(t, c)
	}
}

// TestAppendAgentEventRandom compares the message events of random
// messages and refs.
func TestAppendAgentEventRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(20261201, 2))
	msgs := eventMessages()
	types := []agent.EventType{agent.EventMessageStart, agent.EventMessageEnd, agent.EventTurnEnd, agent.EventAgentEnd}
	seqs := func() []uint64 {
		var s []uint64
		for range r.IntN(4) {
			s = append(s, r.Uint64()>>r.IntN(64))
		}
		return s
	}
	for range 2000 {
		m := msgs[r.IntN(len(msgs))]
		m.Timestamp = r.Int64()
		m.Usage.Cost.Output = math.Ldexp(r.Float64(), r.IntN(160)-80)
		ev := agent.Event{Type: types[r.IntN(len(types))], Message: &m, Messages: msgs[:r.IntN(3)]}
		var refs Refs
		if r.IntN(2) == 0 {
			refs = Refs{MessageSeq: r.Uint64() >> r.IntN(64), ToolResultSeqs: seqs(), MessageSeqs: seqs()}
		}
		checkAgentEvent(t, eventCase{ev, refs})
	}
}

func BenchmarkEncodeDelta(b *testing.B) {
	benchEncode(b, &agent.Event{Type: agent.EventMessageUpdate, StreamEvent: &agent.StreamEvent{Type: agent.StreamTextDelta, ContentIndex: 0, Delta: "lorem ipsum dolo"}})
}

// benchEncode encodes ev through the reflection path and the direct one.
func benchEncode(b *testing.B, ev *agent.Event) {
	var buf []byte
	b.Run("reflection", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			we := NewAgentEvent(ev)
			buf, _ = agent.AppendJSON(buf[:0], we)
		}
	})
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = AppendAgentEvent(buf[:0], ev, Refs{})
		}
	})
}

// BenchmarkEncodeMessageEnd is the worker's encoding of an assistant's
// message_end: one text block of about 320 characters, usage with costs.
func BenchmarkEncodeMessageEnd(b *testing.B) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8)[:320]
	msg := &agent.Message{Role: agent.RoleAssistant, Content: []agent.Content{agent.Text(text)},
		API: "faux", Provider: "faux", Model: "faux-1", ResponseID: "resp-123",
		Usage: agent.Usage{Input: 1234, Output: 321, CacheRead: 100, TotalTokens: 1655,
			Cost: agent.Cost{Input: 0.003702, Output: 0.004815, CacheRead: 0.00003, Total: 0.008547}},
		StopReason: agent.StopReasonStop, Timestamp: 1764563458123}
	benchEncode(b, &agent.Event{Type: agent.EventMessageEnd, Message: msg})
}
