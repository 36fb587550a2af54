package protocol_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const regenerate = "go generate ./protocol"

// The checked-in schemas are what the generator writes now: a wire type
// or bus.ProtocolVersion that changed without regenerating fails here.
func TestSchemasAreUpToDate(t *testing.T) {
	files, err := protocol.Generate()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range protocol.Files() {
		have, err := os.ReadFile(name)
		if err != nil {
			t.Errorf("protocol/%s: %v: run `%s` and commit the file", name, err, regenerate)
			continue
		}
		if want := files[name]; !bytes.Equal(have, want) {
			t.Errorf("protocol/%s is not what the generator writes from the wire types (first difference: %s): run `%s` and commit the result",
				name, firstDiff(have, want), regenerate)
		}
	}
	onDisk, _ := filepath.Glob("*.schema.json")
	for _, name := range onDisk {
		if !slices.Contains(protocol.Files(), name) {
			t.Errorf("protocol/%s is not a file the generator writes: remove it", name)
		}
	}
}

// firstDiff names the first line where two files differ.
func firstDiff(have, want []byte) string {
	h, w := strings.Split(string(have), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(h), len(w)) {
		var a, b string
		if i < len(h) {
			a = h[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if a != b {
			return "line " + itoa(i+1) + ": checked in " + quote(a) + ", generated " + quote(b)
		}
	}
	return "none"
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
func quote(s string) string {
	b, _ := json.Marshal(strings.TrimSpace(s))
	return string(b)
}

// Every file says the version it describes, bus.ProtocolVersion, in its
// $id and in x-protocol-version.
func TestSchemasNameTheProtocolVersion(t *testing.T) {
	for _, name := range protocol.Files() {
		s := readSchema(t, name)
		if s["x-protocol-version"] != bus.ProtocolVersion {
			t.Errorf("%s: x-protocol-version %v, want %s", name, s["x-protocol-version"], bus.ProtocolVersion)
		}
		if id, _ := s["$id"].(string); id != protocol.SchemaID(name) || !strings.Contains(id, "/"+bus.ProtocolVersion+"/") {
			t.Errorf("%s: $id %q, want %q", name, id, protocol.SchemaID(name))
		}
		if s["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
			t.Errorf("%s: $schema %v", name, s["$schema"])
		}
	}
}

func readSchema(t *testing.T, name string) map[string]any {
	t.Helper()
	b, err := protocol.Schema(name)
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return s
}

// defs returns a schema file's definitions.
func defs(t *testing.T, file string) map[string]any {
	t.Helper()
	d, _ := readSchema(t, file)["$defs"].(map[string]any)
	return d
}

// propsOf lists a definition's properties.
func propsOf(t *testing.T, file, def string) []string {
	t.Helper()
	d := readSchema(t, file) // "" is the root
	if def != "" {
		d, _ = defs(t, file)[def].(map[string]any)
	}
	p, _ := d["properties"].(map[string]any)
	if p == nil {
		t.Fatalf("%s: no definition %s with properties", file, def)
	}
	var out []string
	for k := range p {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// variants lists the definitions a union (oneOf of $refs) is made of,
// with the type const of each.
func variants(t *testing.T, file, union string) map[string]string {
	t.Helper()
	all := defs(t, file)
	u, _ := all[union].(map[string]any)
	refs, _ := u["oneOf"].([]any)
	if len(refs) == 0 {
		t.Fatalf("%s: %s is not a oneOf", file, union)
	}
	out := map[string]string{}
	for _, r := range refs {
		name := strings.TrimPrefix(r.(map[string]any)["$ref"].(string), "#/$defs/")
		d := all[name].(map[string]any)
		typ := d["properties"].(map[string]any)["type"].(map[string]any)["const"].(string)
		out[typ] = name
	}
	return out
}

// The hand-written JSON of messages and blocks (agent/message_json.go)
// writes exactly the properties of their definitions: each role and
// block type with every field set is marshalled, its keys compared with
// the definition's, and the message validated strictly in an envelope.
func TestMessageShapes(t *testing.T) {
	v, err := protocol.NewValidator(protocol.Strict())
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string]agent.Content{
		"TextContent":     {Type: agent.ContentText, Text: "hi", TextSignature: "sig"},
		"ThinkingContent": {Type: agent.ContentThinking, Thinking: "hmm", ThinkingSignature: "reasoning_content", Redacted: true},
		"ImageContent":    agent.Image("iVBORw0KGgo=", "image/png"),
		"ToolCallContent": {Type: agent.ContentToolCall, ID: "c1", Name: "calculator", Arguments: map[string]any{"expression": "1+1"}, ThoughtSignature: "ts"},
	}
	for def, c := range blocks {
		b, err := c.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := keys(t, b), propsOf(t, protocol.EventFile, def); !slices.Equal(got, want) {
			t.Errorf("%s: the marshaller writes %v, the schema has %v: fix protocol/messages.go and run `%s`", def, got, want, regenerate)
		}
	}
	usage := agent.Usage{Input: 1, Output: 2, CacheRead: 3, CacheWrite: 4, Reasoning: 1, TotalTokens: 10,
		Cost: agent.Cost{Input: 0.1, Output: 0.2, CacheRead: 0.3, CacheWrite: 0.4, Total: 1}}
	messages := map[string]agent.Message{
		"UserMessage": {Role: agent.RoleUser, Content: []agent.Content{blocks["TextContent"], blocks["ImageContent"]}, Timestamp: 1},
		"AssistantMessage": {Role: agent.RoleAssistant, Content: []agent.Content{blocks["ThinkingContent"], blocks["TextContent"], blocks["ToolCallContent"]},
			API: "openai-completions", Provider: "openai", Model: "m", ResponseModel: "m-1", ResponseID: "r", Usage: usage,
			StopReason: agent.StopReasonError, ErrorMessage: "boom", Timestamp: 2},
		"ToolResultMessage": {Role: agent.RoleToolResult, ToolCallID: "c1", ToolName: "calculator", Content: []agent.Content{blocks["TextContent"]},
			Details: json.RawMessage(`{"x":1}`), AddedToolNames: []string{"t"}, IsError: true, Timestamp: 3},
		"SystemMessage": {Role: agent.RoleSystem, Content: []agent.Content{blocks["TextContent"]}, Timestamp: 4},
	}
	for def, m := range messages {
		b, err := agent.MarshalJSON(m)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := keys(t, b), propsOf(t, protocol.EventFile, def); !slices.Equal(got, want) {
			t.Errorf("%s: the marshaller writes %v, the schema has %v: fix protocol/messages.go and run `%s`", def, got, want, regenerate)
		}
		env := `{"run":"r1","seq":3,"attempt":1,"worker":"w","ts":5,"event":{"type":"message_end","message":` + string(b) + `}}`
		if err := v.Validate(protocol.Envelope, []byte(env)); err != nil {
			t.Errorf("%s: %v", def, err)
		}
	}
	if got, want := keys(t, mustJSON(t, usage)), propsOf(t, protocol.EventFile, "Usage"); !slices.Equal(got, want) {
		t.Errorf("Usage: %v, the schema has %v", got, want)
	}
}

// A request with every field set, as the Go client marshals it, is one
// the worker accepts and one the schema accepts (strictly: the schema
// names every field the client writes).
func TestFullRequestValidates(t *testing.T) {
	v, err := protocol.NewValidator(protocol.Strict())
	if err != nil {
		t.Fatal(err)
	}
	temp := 0.5
	req := &bus.RunRequest{
		ID: "r1", Model: &bus.ModelRef{Provider: "faux", ID: "scripted"}, SystemPrompt: "be terse", Prompt: "look",
		Images: []agent.Content{agent.Image("iVBORw0KGgo=", "image/png")},
		Messages: []agent.Message{
			agent.UserText("hi"),
			{Role: agent.RoleAssistant, Content: []agent.Content{{Type: agent.ContentThinking, Thinking: "t"}, agent.ToolCall("c1", "calculator", map[string]any{"expression": "1"})},
				API: "faux", Provider: "faux", Model: "scripted", StopReason: agent.StopReasonToolUse, Timestamp: 2},
			{Role: agent.RoleToolResult, ToolCallID: "c1", ToolName: "calculator", Content: []agent.Content{agent.Text("1")}, Timestamp: 3},
		},
		Tools: []string{"calculator", "everything__*"}, ThinkingLevel: agent.ThinkingHigh, ToolExecution: agent.ExecutionSequential,
		SteeringMode: agent.QueueAll, FollowUpMode: agent.QueueOneAtATime,
		Limits:      &bus.Limits{MaxTurns: 5, TimeoutSeconds: 60, MaxTotalTokens: 1000, MaxCostUsd: 0.5},
		Temperature: &temp, MaxTokens: 100, ContinueFrom: "r0", Metadata: map[string]string{"team": "docs"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{{Content: []agent.Content{agent.Text("ok")}, StopReason: agent.StopReasonError, ErrorMessage: "e"}},
			TokenSize: 4, TokensPerSecond: 10, FixedPace: true},
		Approval:    &bus.Approval{Tools: []string{"calculator"}, TimeoutSeconds: 60, OnTimeout: bus.OnTimeoutAbort},
		Priority:    bus.PriorityHigh,
		Concurrency: &bus.Concurrency{Key: "customer-42", Limit: 2},
		Compaction: &bus.Compaction{ReserveTokens: 2000, KeepRecentTokens: 4000, Model: &bus.ModelRef{Provider: "openai", ID: "gpt-4o-mini"},
			Instructions: "keep file names"},
		Children: &bus.Children{MaxDepth: 2, Max: 10},
		Child:    &bus.ChildOf{ParentRunID: "parent-1", RootRunID: "root-1", Depth: 1, Proof: bus.ProofPlaceholder},
	}
	b, err := agent.MarshalJSON(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.DecodeRunRequest(b, "r1"); err != nil {
		t.Fatalf("the worker refuses the test's request: %v", err)
	}
	if err := v.Validate(protocol.RunRequest, b); err != nil {
		t.Fatal(err)
	}
	if got, want := keys(t, b), propsOf(t, protocol.RunRequestFile, ""); !slices.Equal(got, want) {
		t.Errorf("the request sets %v, the schema has %v", got, want)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := agent.MarshalJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// keys lists the keys of a JSON object, sorted.
func keys(t *testing.T, b []byte) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// docs/protocol.md describes the version the schemas describe, links
// them, and names every value the schemas allow for an enum or a type
// constant (event types, statuses, reasons, decisions, states, roles,
// block types, stop reasons, ...), in backquotes or as a JSON string: a
// value added to the wire types and regenerated, but not documented,
// fails here.
func TestDocNamesTheSchemasValues(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if want := "this page describes **" + bus.ProtocolVersion + "**"; !strings.Contains(doc, want) {
		t.Errorf("docs/protocol.md does not say %q (the schemas' x-protocol-version)", want)
	}
	if !strings.Contains(doc, "(../protocol/README.md)") {
		t.Error("docs/protocol.md does not link protocol/README.md")
	}
	for _, name := range protocol.Files() {
		values := map[string]bool{}
		collectValues(readSchema(t, name), values)
		for _, v := range slices.Sorted(mapKeysBool(values)) {
			if !strings.Contains(doc, "`"+v+"`") && !strings.Contains(doc, `"`+v+`"`) {
				t.Errorf("%s allows %q, which docs/protocol.md does not name", name, v)
			}
		}
	}
}

// collectValues gathers the string values of every enum and const of a
// schema document.
func collectValues(v any, into map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			switch k {
			case "const":
				if s, ok := x.(string); ok && s != "" {
					into[s] = true
				}
			case "enum":
				for _, e := range x.([]any) {
					if s, ok := e.(string); ok && s != "" {
						into[s] = true
					}
				}
			default:
				collectValues(x, into)
			}
		}
	case []any:
		for _, x := range v {
			collectValues(x, into)
		}
	}
}

func mapKeysBool(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
