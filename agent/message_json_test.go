package agent_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/internal/jsonref"
)

// jsonStrings covers every escape encoding/json writes, and what it leaves.
var jsonStrings = []string{"", "plain", "quote \" backslash \\ slash /", "<html> & </html>",
	"\b\f\n\r\t\x00\x01\x1f\x7f", "é ü 中文 🙂", "bad \xff\xfe utf8 \xc3", "line\u2028sep\u2029end",
	"\xed\xa0\x80 surrogate", "\u00a0\ufeff\U0010ffff", "\xf4\x90\x80\x80 past U+10FFFF"}

// jsonFloats are the floats whose formatting encoding/json switches on.
var jsonFloats = []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 0.000001, 0.0000009, 1e-7, -1e-7, 1.5e-300,
	123456789.123, 1e20, 1e21, -1e21, 123456789012345678901234.0, 5e-324, math.MaxFloat64,
	math.SmallestNonzeroFloat64, 0.003702, 1.0 / 3, 100}

// checkMessageJSON fails t unless every encoding of m (and of its blocks)
// is byte for byte its reference encoding, errors included.
func checkMessageJSON(t *testing.T, m *agent.Message) {
	t.Helper()
	if err := messageJSONMismatch(m); err != nil {
		t.Fatal(err)
	}
}

func messageJSONMismatch(m *agent.Message) error {
	want, wantErr := agent.AppendJSON(nil, jsonref.Message(m))
	got, gotErr := agent.AppendMessageJSON([]byte("prefix"), m)
	if (gotErr != nil) != (wantErr != nil) {
		return fmt.Errorf("message %#v: error %v, reference %v", m, gotErr, wantErr)
	}
	if wantErr != nil {
		if string(got) != "prefix" {
			return fmt.Errorf("message %#v: on error wrote %q", m, got)
		}
		// The reference's types have their own names; the rest of the text is the same.
		if want := strings.NewReplacer("*jsonref.message", "*agent.Message", "jsonref.content", "agent.Content").Replace(wantErr.Error()); gotErr.Error() != want {
			return fmt.Errorf("message %#v: error %q, reference %q", m, gotErr, want)
		}
		// (Raw is returned as it is; encoding/json then finds it invalid.)
		if b, err := m.MarshalJSON(); (m.Raw == nil || !m.IsCustom()) && (err == nil || b != nil) {
			return fmt.Errorf("message %#v: Message.MarshalJSON gave %q, %v; want nil and an error", m, b, err)
		}
		// Through the marshaler and json.Marshal it errors too.
		if _, err := agent.MarshalJSON(*m); err == nil {
			return fmt.Errorf("message %#v: MarshalJSON without the error %v", m, wantErr)
		}
		return nil
	}
	if !bytes.Equal(got[len("prefix"):], want) {
		return fmt.Errorf("message %#v:\n got %s\nwant %s", m, got[len("prefix"):], want)
	}
	for name, enc := range map[string]func(v any) ([]byte, error){"AppendJSON": agent.MarshalJSON, "json.Marshal": json.Marshal} {
		got, err := enc(*m)
		want, wantErr := enc(jsonref.Message(m))
		if err != nil || wantErr != nil || !bytes.Equal(got, want) {
			return fmt.Errorf("%s of message %#v:\n got %s (%v)\nwant %s (%v)", name, m, got, err, want, wantErr)
		}
	}
	got, err := m.MarshalJSON()
	want, wantErr = jsonref.Message(m).(json.Marshaler).MarshalJSON()
	if err != nil || wantErr != nil || !bytes.Equal(got, want) {
		return fmt.Errorf("Message.MarshalJSON of %#v:\n got %s (%v)\nwant %s (%v)", m, got, err, want, wantErr)
	}
	for _, c := range m.Content {
		got, err := agent.MarshalJSON(c)
		want, wantErr := agent.MarshalJSON(jsonref.Content(c))
		if (err != nil) != (wantErr != nil) || !bytes.Equal(got, want) {
			return fmt.Errorf("block %#v:\n got %s (%v)\nwant %s (%v)", c, got, err, want, wantErr)
		}
	}
	return nil
}

func TestAppendMessageJSONMatchesReflection(t *testing.T) {
	usage := agent.Usage{Input: 1, Output: 2, CacheRead: 3, CacheWrite: 4, TotalTokens: 10,
		Cost: agent.Cost{Input: 0.1, Output: 1e-7, CacheRead: 123456789.123, CacheWrite: 1e21, Total: 5e-324}}
	var msgs []agent.Message
	for _, s := range jsonStrings {
		blocks := []agent.Content{
			agent.Text(s),
			{Type: agent.ContentText, Text: s, TextSignature: s + "sig"},
			{Type: agent.ContentThinking, Thinking: s},
			{Type: agent.ContentThinking, Thinking: s, ThinkingSignature: "reasoning_content", Redacted: true},
			{Type: agent.ContentThinking, Redacted: true},
			agent.Image(s, "image/png"),
			agent.ToolCall(s, s, nil),
			agent.ToolCall("c1", "calc", map[string]any{}),
			agent.ToolCall("c2", "calc", map[string]any{s: s, "n": 1.5e-7, "deep": map[string]any{"z": []any{nil, true, 1e21, "<&>"}, "a": s}}),
			{Type: agent.ContentToolCall, ID: "c3", Name: "calc", Arguments: map[string]any{"x": 1}, ThoughtSignature: s},
		}
		for _, role := range []string{agent.RoleUser, agent.RoleSystem, agent.RoleDeveloper, "custom", s + "x"} {
			msgs = append(msgs, agent.Message{Role: role, Content: blocks, Timestamp: 1764563458123})
		}
		msgs = append(msgs,
			agent.Message{Role: agent.RoleAssistant, Content: blocks, API: s, Provider: s, Model: s,
				ResponseModel: s, ResponseID: s, Usage: usage, StopReason: agent.StopReason(s), ErrorMessage: s, Timestamp: -1},
			agent.Message{Role: agent.RoleToolResult, ToolCallID: s, ToolName: s, Content: blocks,
				AddedToolNames: []string{s, "b"}, IsError: true, Timestamp: 1},
		)
	}
	for _, f := range jsonFloats {
		u := agent.Usage{Input: math.MaxInt, Output: math.MinInt, Reasoning: 7, Cost: agent.Cost{f, -f, f / 3, f * 7, f}}
		msgs = append(msgs, agent.Message{Role: agent.RoleAssistant, Usage: u})
	}
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		msgs = append(msgs, agent.Message{Role: agent.RoleAssistant, Usage: agent.Usage{Cost: agent.Cost{Total: f}}})
		msgs = append(msgs, agent.Message{Role: agent.RoleUser, Content: []agent.Content{agent.ToolCall("c", "n", map[string]any{"f": f})}})
	}
	for _, role := range []string{agent.RoleUser, agent.RoleSystem, agent.RoleDeveloper, agent.RoleAssistant, agent.RoleToolResult, "custom", ""} {
		msgs = append(msgs,
			agent.Message{Role: role},                             // nil content: []
			agent.Message{Role: role, Content: []agent.Content{}}, // empty
			agent.Message{Role: role, Content: []agent.Content{{Type: "video"}}},
			agent.Message{Role: role, Content: []agent.Content{{}}},
			agent.Message{Role: role, Raw: json.RawMessage(` { "role" : "x",  "v":"<&>\u2028" } `)},
		)
	}
	msgs = append(msgs,
		agent.Message{Role: agent.RoleAssistant, Usage: agent.Usage{Reasoning: -5}},
		agent.Message{Role: agent.RoleAssistant, Usage: usage, StopReason: agent.StopReasonStop},
		agent.Message{Role: agent.RoleToolResult, Details: json.RawMessage(` {"a" : [1, 2 ,"<&>"] }`)},
		agent.Message{Role: agent.RoleToolResult, Details: json.RawMessage(`null`)},
		agent.Message{Role: agent.RoleToolResult, Details: json.RawMessage(`{"bad"`)},
		agent.Message{Role: agent.RoleToolResult, Details: json.RawMessage{}, AddedToolNames: []string{}},
		agent.Message{Role: "custom", Raw: json.RawMessage(`not json`)},
		agent.Message{Role: "custom", Raw: json.RawMessage(`{}`), Content: []agent.Content{agent.Text("ignored")}},
		agent.Message{Role: agent.RoleUser, Content: []agent.Content{agent.ToolCall("c", "n", map[string]any{"ch": make(chan int)})}},
		agent.Message{Role: agent.RoleUser, Content: []agent.Content{agent.ToolCall("c", "n", map[string]any{"m": agent.Message{Role: agent.RoleUser}})}},
		agent.Message{Role: agent.RoleUser, Content: []agent.Content{agent.Text(strings.Repeat("long <text> ", 1000))}},
	)
	for i := range msgs {
		checkMessageJSON(t, &msgs[i])
	}
}

// TestAppendMessageJSONRandom compares a few thousand random messages.
func TestAppendMessageJSONRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(20261201, 1))
	for range 3000 {
		m := randomMessage(r)
		checkMessageJSON(t, &m)
	}
}

func randomMessage(r *rand.Rand) agent.Message {
	roles := []string{agent.RoleUser, agent.RoleSystem, agent.RoleDeveloper, agent.RoleAssistant, agent.RoleAssistant,
		agent.RoleToolResult, agent.RoleToolResult, "custom", ""}
	m := agent.Message{Role: roles[r.IntN(len(roles))], Timestamp: r.Int64() - r.Int64()}
	if r.IntN(8) > 0 {
		m.Content = []agent.Content{}
		for range r.IntN(5) {
			m.Content = append(m.Content, randomContent(r))
		}
	}
	str := func() string {
		if r.IntN(3) == 0 {
			return ""
		}
		return randomString(r)
	}
	m.API, m.Provider, m.Model, m.ResponseModel, m.ResponseID = str(), str(), str(), str(), str()
	m.StopReason, m.ErrorMessage = agent.StopReason(str()), str()
	n := func() int {
		if r.IntN(3) == 0 {
			return 0
		}
		return int(r.Int64() >> r.IntN(64))
	}
	m.Usage = agent.Usage{Input: n(), Output: n(), CacheRead: n(), CacheWrite: n(), Reasoning: n(), TotalTokens: n(),
		Cost: agent.Cost{randomFloat(r), randomFloat(r), randomFloat(r), randomFloat(r), randomFloat(r)}}
	m.ToolCallID, m.ToolName, m.IsError = str(), str(), r.IntN(2) == 0
	if r.IntN(3) == 0 {
		b, _ := json.Marshal(randomJSONValue(r, 2))
		m.Details = b
	}
	for range r.IntN(3) {
		m.AddedToolNames = append(m.AddedToolNames, str())
	}
	if r.IntN(4) == 0 {
		m.Raw, _ = json.Marshal(map[string]any{"role": m.Role, "x": randomJSONValue(r, 2)})
	}
	return m
}

func randomContent(r *rand.Rand) agent.Content {
	types := []string{agent.ContentText, agent.ContentThinking, agent.ContentImage, agent.ContentToolCall}
	c := agent.Content{Type: types[r.IntN(len(types))]}
	if r.IntN(200) == 0 {
		c.Type = "unknown"
	}
	pick := func() string {
		if r.IntN(2) == 0 {
			return ""
		}
		return randomString(r)
	}
	c.Text, c.TextSignature, c.Thinking, c.ThinkingSignature = pick(), pick(), pick(), pick()
	c.Redacted = r.IntN(2) == 0
	c.Data, c.MimeType, c.ID, c.Name, c.ThoughtSignature = pick(), pick(), pick(), pick(), pick()
	switch r.IntN(3) {
	case 1:
		c.Arguments = map[string]any{}
	case 2:
		c.Arguments, _ = randomJSONValue(r, 3).(map[string]any)
	}
	return c
}

// randomJSONValue is a JSON-like value: maps, slices, strings, floats, ints,
// bools and nil, nested up to depth.
func randomJSONValue(r *rand.Rand, depth int) any {
	k := r.IntN(7)
	if depth == 0 {
		k = r.IntN(5)
	}
	switch k {
	case 0:
		return randomString(r)
	case 1:
		return randomFloat(r)
	case 2:
		return r.Int64()
	case 3:
		return r.IntN(2) == 0
	case 4:
		return nil
	case 5:
		var s []any
		for range r.IntN(4) {
			s = append(s, randomJSONValue(r, depth-1))
		}
		return s
	default:
		m := map[string]any{}
		for range r.IntN(4) {
			m[randomString(r)] = randomJSONValue(r, depth-1)
		}
		return m
	}
}

// randomFloat is mostly an ordinary float, sometimes any bit pattern
// (NaN and infinities included), sometimes one of jsonFloats.
func randomFloat(r *rand.Rand) float64 {
	switch r.IntN(10) {
	case 0:
		return math.Float64frombits(r.Uint64())
	case 1, 2:
		return jsonFloats[r.IntN(len(jsonFloats))]
	case 3:
		return math.Ldexp(r.Float64(), r.IntN(200)-100)
	default:
		return float64(r.IntN(1e6)) / 1e6
	}
}

func randomString(r *rand.Rand) string {
	if r.IntN(3) == 0 {
		return jsonStrings[r.IntN(len(jsonStrings))]
	}
	b := make([]byte, r.IntN(24))
	for i := range b {
		switch r.IntN(4) {
		case 0:
			b[i] = byte(r.UintN(256))
		case 1:
			b[i] = byte(r.UintN(0x20))
		default:
			b[i] = byte(' ' + r.UintN(95))
		}
	}
	if r.IntN(5) == 0 {
		return string(b) + "\u2028é" + jsonStrings[r.IntN(len(jsonStrings))]
	}
	return string(b)
}

func FuzzAppendMessageJSON(f *testing.F) {
	for i, s := range jsonStrings {
		f.Add(uint8(i), s, "x", int64(i), jsonFloats[i%len(jsonFloats)], uint8(i*37))
	}
	f.Add(uint8(5), "<&>", `{"a":1}`, int64(-1), math.Inf(1), uint8(255))
	f.Fuzz(func(t *testing.T, role uint8, s1, s2 string, n int64, cost float64, flags uint8) {
		roles := []string{agent.RoleUser, agent.RoleSystem, agent.RoleDeveloper, agent.RoleAssistant, agent.RoleToolResult, "custom", "", s1}
		flag := func(bit int) bool { return flags&(1<<bit) != 0 }
		var args map[string]any
		if flag(0) {
			args = map[string]any{s1: s2, s2: map[string]any{"n": cost, "s": []any{s1, n}}}
		}
		m := agent.Message{Role: roles[int(role)%len(roles)], Timestamp: n,
			Content: []agent.Content{
				{Type: agent.ContentText, Text: s1, TextSignature: s2},
				{Type: agent.ContentThinking, Thinking: s2, ThinkingSignature: s1, Redacted: flag(1)},
				{Type: agent.ContentImage, Data: s1, MimeType: s2},
				{Type: agent.ContentToolCall, ID: s1, Name: s2, Arguments: args, ThoughtSignature: s1},
			},
			API: s1, Provider: s2, Model: s1, ResponseModel: s2, ResponseID: s1,
			Usage: agent.Usage{Input: int(n), Output: int(n >> 3), Reasoning: int(n & 7), TotalTokens: int(-n),
				Cost: agent.Cost{Input: cost, Output: -cost, CacheRead: cost * 1e-9, CacheWrite: cost * 1e15, Total: cost / 7}},
			StopReason: agent.StopReason(s2), ErrorMessage: s1,
			ToolCallID: s1, ToolName: s2, IsError: flag(2),
		}
		if flag(3) {
			m.Content = nil
		}
		if flag(4) {
			m.Details = json.RawMessage(s2)
		}
		if flag(5) {
			m.AddedToolNames = []string{s1, s2}
		}
		if flag(6) {
			m.Raw = json.RawMessage(s2)
		}
		if flag(7) {
			m.Content = append(m.Content, agent.Content{Type: s2})
		}
		checkMessageJSON(t, &m)
	})
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range jsonStrings {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := agent.MarshalJSON(s)
		if got := agent.AppendJSONString([]byte("prefix"), s); !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatalf("%q: got %s want %s", s, got, want)
		}
	})
}

// checkEventMessagesJSON checks the encoding of the messages of a
// conformance scenario's events (see checkMessageJSON).
func checkEventMessagesJSON(t *testing.T, ev agent.Event) {
	t.Helper()
	msgs := slices.Concat(ev.Messages, ev.ToolResults) // a copy: the events share their slices
	if ev.Message != nil {
		msgs = append(msgs, *ev.Message)
	}
	if ev.StreamEvent != nil && ev.StreamEvent.Message != nil {
		msgs = append(msgs, *ev.StreamEvent.Message)
	}
	for i := range msgs {
		if err := messageJSONMismatch(&msgs[i]); err != nil {
			t.Error(err)
		}
	}
}
