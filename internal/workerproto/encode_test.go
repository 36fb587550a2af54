package workerproto

import (
	"bytes"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
)

// hardStrings covers every escape encoding/json writes.
var hardStrings = []string{"", "plain", "quote \" backslash \\ slash /", "<html> & </html>",
	"\b\f\n\r\t\x00\x01\x1f\x7f", "é ü 中文 🙂", "bad \xff\xfe utf8 \xc3", "line\u2028sep\u2029end", "\xed\xa0\x80 surrogate"}

func TestAppendAgentEventMatchesReflection(t *testing.T) {
	msg := &agent.Message{Role: agent.RoleAssistant, Content: []agent.Content{agent.Text("<hi> & \"you\"")}}
	call := agent.ToolCall("c1", "calculator", map[string]any{"expression": "1<2"})
	type tc struct {
		ev   agent.Event
		refs Refs
	}
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
	cases = append(cases,
		tc{ev: agent.Event{Type: agent.EventAgentStart}},
		tc{ev: agent.Event{Type: agent.EventTurnStart}},
		tc{ev: agent.Event{Type: agent.EventMessageUpdate}},
		// The fallback.
		tc{ev: agent.Event{Type: agent.EventMessageUpdate, StreamEvent: &agent.StreamEvent{Type: agent.StreamToolCallEnd, ToolCall: &call}}},
		tc{ev: agent.Event{Type: agent.EventMessageStart, Message: msg}},
		tc{ev: agent.Event{Type: agent.EventMessageEnd, Message: msg}},
		tc{ev: agent.Event{Type: agent.EventToolExecutionStart, ToolCallID: "c1", ToolName: "calculator", Args: map[string]any{"x": "<"}}},
		tc{ev: agent.Event{Type: agent.EventToolExecutionEnd, ToolCallID: "c1", ToolName: "calculator", Result: &agent.ToolResult{}, IsError: true}},
		tc{ev: agent.Event{Type: agent.EventTurnEnd, Message: msg}, refs: Refs{MessageSeq: 5, ToolResultSeqs: []uint64{3, 4}}},
		tc{ev: agent.Event{Type: agent.EventAgentEnd, Messages: []agent.Message{*msg}}, refs: Refs{MessageSeqs: []uint64{1, 2}}},
		tc{ev: agent.Event{Type: "some_future_event", ToolCallID: "x"}},
	)
	for _, c := range cases {
		w := NewAgentEvent(&c.ev)
		w.MessageSeq, w.ToolResultSeqs, w.MessageSeqs = c.refs.MessageSeq, c.refs.ToolResultSeqs, c.refs.MessageSeqs
		want, err := agent.MarshalJSON(w)
		if err != nil {
			t.Fatal(err)
		}
		got, err := AppendAgentEvent([]byte("prefix"), &c.ev, c.refs)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[len("prefix"):], want) {
			t.Errorf("event %+v:\n got %s\nwant %s", c.ev, got[len("prefix"):], want)
		}
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range hardStrings {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := agent.MarshalJSON(s)
		if got := appendString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("%q: got %s want %s", s, got, want)
		}
	})
}

func BenchmarkEncodeDelta(b *testing.B) {
	ev := agent.Event{Type: agent.EventMessageUpdate, StreamEvent: &agent.StreamEvent{Type: agent.StreamTextDelta, ContentIndex: 0, Delta: "lorem ipsum dolo"}}
	var buf []byte
	b.Run("reflection", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			we := NewAgentEvent(&ev)
			buf, _ = agent.AppendJSON(buf[:0], we)
		}
	})
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = AppendAgentEvent(buf[:0], &ev, Refs{})
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
	ev := agent.Event{Type: agent.EventMessageEnd, Message: msg}
	var buf []byte
	b.Run("reflection", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			we := NewAgentEvent(&ev)
			buf, _ = agent.AppendJSON(buf[:0], we)
		}
	})
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = AppendAgentEvent(buf[:0], &ev, Refs{})
		}
	})
}
