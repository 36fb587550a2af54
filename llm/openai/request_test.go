package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
)

var update = flag.Bool("update", false, "rewrite testdata/request.golden.json")

// fullTranscript has every kind of message the provider converts.
func fullTranscript(model agent.Model) agent.Context {
	same := func(m agent.Message) agent.Message {
		m.Role, m.API, m.Provider, m.Model = agent.RoleAssistant, model.API, model.Provider, model.ID
		if m.StopReason == "" {
			m.StopReason = agent.StopReasonToolUse
		}
		return m
	}
	result := func(id, name string, content ...agent.Content) agent.Message {
		return agent.Message{Role: agent.RoleToolResult, ToolCallID: id, ToolName: name, Content: content}
	}
	longID := "toolu|01ABCdef/ghi.jkl+mno=pqr|stu_vwx-yz0123456789abcdef"
	return agent.Context{
		SystemPrompt: "You are a careful assistant.",
		Tools: []*agent.Tool{
			{Name: "read", Description: "Read a file", Parameters: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)},
			{Name: "now", Description: "Current time"},
		},
		Messages: []agent.Message{
			agent.UserText("Hello"),
			agent.UserText("What is in this picture?", agent.Image("aGVsbG8=", "image/png")),
			same(agent.Message{Content: []agent.Content{
				{Type: agent.ContentThinking, Thinking: "The user wants a file.", ThinkingSignature: "reasoning_content"},
				agent.Text("Let me look."),
				agent.Text("  "),
				agent.ToolCall("call_1", "read", map[string]any{"path": "a.txt"}),
				agent.ToolCall(longID, "read", map[string]any{"path": "b.png"}),
			}}),
			result("call_1", "read", agent.Text("line 1"), agent.Text("line 2")),
			result(longID, "read", agent.Image("cG5n", "image/png")),
			// An errored turn and its result are left out.
			same(agent.Message{StopReason: agent.StopReasonError, ErrorMessage: "boom", Content: []agent.Content{
				agent.Text("partial"), agent.ToolCall("call_err", "read", map[string]any{}),
			}}),
			result("call_err", "read", agent.Text("never sent")),
			// A call without a result gets "No result provided".
			same(agent.Message{Content: []agent.Content{agent.ToolCall("call_lost", "now", nil)}}),
			{Role: agent.RoleDeveloper, Content: []agent.Content{agent.Text("Be brief.")}},
			agent.UserText("Continue"),
			// Thinking of another model becomes text.
			{Role: agent.RoleAssistant, API: "anthropic-messages", Provider: "anthropic", Model: "claude", StopReason: agent.StopReasonStop,
				Content: []agent.Content{{Type: agent.ContentThinking, Thinking: "Other model thought.", ThinkingSignature: "sig=="}, agent.Text("Other answer.")}},
			agent.UserText("And now?"),
			// Reasoning goes back in the field it came from; an empty result.
			same(agent.Message{Content: []agent.Content{
				{Type: agent.ContentThinking, Thinking: "Use the clock.", ThinkingSignature: "reasoning"},
				agent.ToolCall("", "now", map[string]any{}),
			}}),
			result("", "now"),
			same(agent.Message{StopReason: agent.StopReasonAborted, ErrorMessage: "Request was aborted", Content: []agent.Content{agent.Text("cut")}}),
			{Role: "notification", Content: []agent.Content{agent.Text("custom")}, Raw: json.RawMessage(`{"role":"notification"}`)},
			agent.UserText("Thanks"),
		},
	}
}

func TestRequestGolden(t *testing.T) {
	var body []byte
	var header http.Header
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ = io.ReadAll(r.Body)
		header = r.Header.Clone()
		if r.URL.Path != "/v1/chat/completions" {
			t.Errorf("path %s", r.URL.Path)
		}
		sse(w, textChunk("ok"), stopChunk, "[DONE]")
	})
	on := true
	p := newProvider(t, srv, func(c *Config) {
		c.APIKey = "sk-config-key"
		c.Headers = map[string]string{"X-Extra": "1"}
		c.PromptCacheKey = &on
		c.Models = []ModelInfo{{ID: "gpt-test", Reasoning: true, Input: []string{"text", "image"}, MaxTokens: 64000,
			Cost: agent.ModelCost{Input: 1, Output: 2}}}
	})
	model := p.Model("gpt-test")
	temp := 0.0
	_, msg := run(t, context.Background(), p, model, fullTranscript(model), agent.StreamOptions{
		APIKey: "sk-call-key", Reasoning: agent.ThinkingHigh, SessionID: "session-42", Temperature: &temp, MaxTokens: 1000,
	})
	if msg.StopReason != agent.StopReasonStop || msg.TextOf() != "ok" {
		t.Fatalf("message %s", js(msg))
	}
	if got := header.Get("Authorization"); got != "Bearer sk-call-key" {
		t.Errorf("Authorization = %q", got)
	}
	if header.Get("X-Extra") != "1" || !strings.Contains(header.Get("Accept"), "text/event-stream") {
		t.Errorf("headers %v", header)
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, body, "", "  "); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, body)
	}
	pretty.WriteByte('\n')
	golden := filepath.Join("testdata", "request.golden.json")
	if *update {
		if err := os.WriteFile(golden, pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if !bytes.Equal(pretty.Bytes(), want) {
		t.Errorf("request body differs from %s (run with -update to accept):\n%s", golden, pretty.String())
	}
}

// A text-only model gets placeholders instead of images; no key, no header.
func TestRequestTextOnlyModel(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	model := p.Model("local")
	body, err := p.requestBody(model, fullTranscript(model), agent.StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := string(body)
	for _, want := range []string{imageOmitted, toolImageOmitted} {
		if !strings.Contains(s, want) {
			t.Errorf("body lacks %q:\n%s", want, s)
		}
	}
	for _, absent := range []string{"image_url", "temperature", "reasoning_effort", "prompt_cache_key", "max_tokens"} {
		if strings.Contains(s, absent) {
			t.Errorf("body has %q:\n%s", absent, s)
		}
	}
	if strings.Contains(s, attachedImages) {
		t.Errorf("tool images attached for a text-only model")
	}
}

func TestRequestHeadersWithoutKey(t *testing.T) {
	var header http.Header
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		header = r.Header.Clone()
		sse(w, textChunk("ok"), stopChunk, "[DONE]")
	})
	p := newProvider(t, srv, nil)
	run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if v, ok := header["Authorization"]; ok {
		t.Errorf("Authorization sent without a key: %q", v)
	}
}

// Azure and organisation settings go through go-openai's client config.
func TestAzureAndOrgHeaders(t *testing.T) {
	var path, query string
	var header http.Header
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		path, query, header = r.URL.Path, r.URL.RawQuery, r.Header.Clone()
		okStream(w)
	})
	p := newProvider(t, srv, func(c *Config) {
		c.BaseURL = srv.URL
		c.APIKey = "azure-key"
		c.AzureAPIVersion = "2024-10-21"
		c.OrgID = "org-1"
	})
	_, msg := run(t, context.Background(), p, agent.Model{ID: "gpt-4o"}, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonStop {
		t.Fatalf("%s", js(msg))
	}
	if path != "/openai/deployments/gpt-4o/chat/completions" || query != "api-version=2024-10-21" {
		t.Errorf("url %s?%s", path, query)
	}
	if header.Get("api-key") != "azure-key" || header.Get("Authorization") != "" || header.Get("OpenAI-Organization") != "org-1" {
		t.Errorf("headers %v", header)
	}
}

// In Azure mode the model id names a deployment in the URL path, next to
// the api-key header: an id that would leave that path is refused before
// any request, and every request stays under the deployment's path.
func TestAzureDeploymentPath(t *testing.T) {
	var paths []string
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.EscapedPath())
		if r.URL.EscapedPath() != "/openai/deployments/gpt-35-turbo/chat/completions" {
			http.Error(w, "wrong path", http.StatusNotFound)
			return
		}
		okStream(w)
	})
	p := newProvider(t, srv, func(c *Config) {
		c.BaseURL = srv.URL
		c.APIKey = "azure-key"
		c.AzureAPIVersion = "2024-10-21"
		c.MaxRetries = -1
	})
	_, msg := run(t, context.Background(), p, agent.Model{ID: "gpt-3.5-turbo"}, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonStop || len(paths) != 1 {
		t.Fatalf("valid deployment: %v %s", paths, js(msg))
	}
	for _, id := range []string{"../../../admin/keys?x=", "..", ".", "a/b", "a%2Fb", "x?y", "x#y", "a b", "\x1b[2J", ""} {
		paths = nil
		_, msg := run(t, context.Background(), p, agent.Model{ID: id}, userContext("hi"), agent.StreamOptions{})
		if msg.StopReason != agent.StopReasonError || !strings.Contains(msg.ErrorMessage, "not a valid Azure deployment name") {
			t.Errorf("model %q: %s %q", id, msg.StopReason, msg.ErrorMessage)
		}
		if len(paths) != 0 {
			t.Errorf("model %q reached %v", id, paths)
		}
		if strings.Contains(msg.ErrorMessage, "\x1b") {
			t.Errorf("model %q: control characters in %q", id, msg.ErrorMessage)
		}
	}
}

// The escaping of the deployment name holds on its own: go-openai's mapper
// output is one path segment whatever the id.
func TestAzureDeploymentEscaped(t *testing.T) {
	p, err := New(Config{BaseURL: "https://example.invalid", AzureAPIVersion: "2024-10-21"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := p.clientConfig("k", nil)
	if got := cfg.GetAzureDeploymentByModel("../../admin/keys?x="); got != "..%2F..%2Fadmin%2Fkeys%3Fx=" {
		t.Errorf("deployment %q", got)
	}
}

// The request carries "<", ">" and "&" as written, in tool-call arguments
// sent back to the model and everywhere else, not as \u003c escapes.
func TestRequestKeepsHTMLCharacters(t *testing.T) {
	p, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	llm := agent.Context{
		SystemPrompt: "Answer in <b>bold</b> & brief.",
		Tools: []*agent.Tool{{Name: "grep", Description: "Search for <pattern> & print",
			Parameters: json.RawMessage(`{"type":"object","properties":{"q":{"type":"string","description":"a <regexp> & more"}}}`)}},
		Messages: []agent.Message{
			agent.UserText("find <a&b>"),
			{Role: agent.RoleAssistant, API: API, Provider: "openai", Model: testModel.ID, StopReason: agent.StopReasonToolUse,
				Content: []agent.Content{agent.ToolCall("call_1", "grep", map[string]any{"q": "<a&b>"})}},
			{Role: agent.RoleToolResult, ToolCallID: "call_1", ToolName: "grep", Content: []agent.Content{agent.Text("x <a&b> y")}},
		},
	}
	body, err := p.requestBody(testModel, llm, agent.StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, esc := range []string{`\u003c`, `\u003e`, `\u0026`} {
		if bytes.Contains(body, []byte(esc)) {
			t.Errorf("body holds %s: %s", esc, body)
		}
	}
	for _, want := range []string{`"arguments":"{\"q\":\"<a&b>\"}"`, `"content":"x <a&b> y"`, `"Search for <pattern> & print"`, `a <regexp> & more`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("body lacks %s: %s", want, body)
		}
	}
}

// Taking the HTML escapes out keeps every string as it was, including text
// that spells an escape.
func TestMarshalJSONKeepsStrings(t *testing.T) {
	for _, s := range []string{`<a&b>`, `\u003c`, `\\u003c`, `\<`, "\\\u003c&", `"<"`, "\u2028<\u2029", "\xff<", `\`, `u003c`} {
		raw, err := marshalJSON(map[string]any{"s": s, "args": s})
		if err != nil {
			t.Fatal(err)
		}
		var back map[string]string
		if err := json.Unmarshal(raw, &back); err != nil {
			t.Fatalf("%q: %s: %v", s, raw, err)
		}
		want := strings.ToValidUTF8(s, "\uFFFD")
		if back["s"] != want || back["args"] != want {
			t.Errorf("%q came back as %q from %s", s, back["s"], raw)
		}
		if bytes.Contains(raw, []byte(`\u003c`)) && !bytes.Contains(raw, []byte(`\\u003c`)) {
			t.Errorf("%q: escaped: %s", s, raw)
		}
	}
}
