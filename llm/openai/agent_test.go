package openai

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
)

// The agent runs a tool through the provider: a tool-call turn streamed in
// fragments, then the final answer; the second request carries the call
// and its result.
func TestAgentEndToEnd(t *testing.T) {
	var mu sync.Mutex
	var requests []map[string]any
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		raw, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Errorf("request body: %v", err)
		}
		mu.Lock()
		requests = append(requests, body)
		n := len(requests)
		mu.Unlock()
		if n == 1 {
			sse(w,
				`{"id":"r1","choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"I should add."}}]}`,
				`{"id":"r1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_add","type":"function","function":{"name":"add","arguments":""}}]}}]}`,
				`{"id":"r1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\": 2, "}}]}}]}`,
				`{"id":"r1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"b\": 3}"}}]}}]}`,
				`{"id":"r1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
				`{"id":"r1","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":40}}}`,
				"[DONE]")
			return
		}
		sse(w, textChunk("2 + 3 = "), textChunk("5"), stopChunk,
			`{"id":"c1","choices":[],"usage":{"prompt_tokens":150,"completion_tokens":5}}`, "[DONE]")
	})
	p := newProvider(t, srv, func(c *Config) {
		c.Models = []ModelInfo{{ID: "calc-model", Reasoning: true, Cost: agent.ModelCost{Input: 1, Output: 2, CacheRead: 0.5}}}
	})
	type addArgs struct {
		A float64 `json:"a"`
		B float64 `json:"b"`
	}
	var partials []map[string]any
	add := agent.NewTool("add", "Add two numbers", func(_ context.Context, args addArgs, _ agent.UpdateFunc) (agent.ToolResult, error) {
		return agent.TextResult(js(args.A + args.B)), nil
	})
	a := agent.New(agent.Options{
		SystemPrompt: "You add.",
		Model:        p.Model("calc-model"),
		Tools:        []*agent.Tool{add},
		StreamFn:     p.Stream,
	})
	a.Subscribe(func(_ context.Context, ev agent.Event) error {
		if ev.Type == agent.EventMessageUpdate && ev.StreamEvent.Type == agent.StreamToolCallDelta {
			partials = append(partials, ev.StreamEvent.Arguments)
		}
		return nil
	})
	if err := a.Prompt(context.Background(), "What is 2 + 3?"); err != nil {
		t.Fatal(err)
	}
	msgs := a.Messages()
	roles := []string{}
	for _, m := range msgs {
		roles = append(roles, m.Role)
	}
	if js(roles) != `["user","assistant","toolResult","assistant"]` {
		t.Fatalf("transcript roles %v:\n%s", roles, js(msgs))
	}
	call := msgs[1]
	if call.StopReason != agent.StopReasonToolUse || call.ThinkingOf() != "I should add." || call.ResponseID != "r1" {
		t.Errorf("tool turn %s", js(call))
	}
	calls := call.ToolCalls()
	if len(calls) != 1 || calls[0].ID != "call_add" || js(calls[0].Arguments) != `{"a":2,"b":3}` {
		t.Errorf("tool calls %s", js(calls))
	}
	if u := call.Usage; u.Input != 60 || u.CacheRead != 40 || u.Output != 20 || u.Cost.Total != (60*1+20*2+40*0.5)/1e6 {
		t.Errorf("usage %+v", u)
	}
	if res := msgs[2]; res.ToolCallID != "call_add" || res.IsError || res.Content[0].Text != "5" {
		t.Errorf("tool result %s", js(res))
	}
	if final := msgs[3]; final.TextOf() != "2 + 3 = 5" || final.StopReason != agent.StopReasonStop || final.Usage.Input != 150 {
		t.Errorf("final answer %s", js(final))
	}
	if js(partials) != `[{},{"a":2},{"a":2,"b":3}]` {
		t.Errorf("partial arguments %s", js(partials))
	}

	// The second request replays the turn: reasoning, call and result.
	if len(requests) != 2 {
		t.Fatalf("%d requests", len(requests))
	}
	got, _ := json.MarshalIndent(requests[1]["messages"], "", "  ")
	want := `[
  {
    "content": "You add.",
    "role": "system"
  },
  {
    "content": "What is 2 + 3?",
    "role": "user"
  },
  {
    "reasoning_content": "I should add.",
    "role": "assistant",
    "tool_calls": [
      {
        "function": {
          "arguments": "{\"a\":2,\"b\":3}",
          "name": "add"
        },
        "id": "call_add",
        "type": "function"
      }
    ]
  },
  {
    "content": "5",
    "role": "tool",
    "tool_call_id": "call_add"
  }
]`
	if string(got) != want {
		t.Errorf("second request messages:\n%s", got)
	}
}

func TestModelTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "models.json")
	table := `{"models":[{"id":"gpt-4o","name":"GPT-4o","contextWindow":128000,"maxTokens":16384,"input":["text","image"],
		"cost":{"input":2.5,"output":10,"cacheRead":1.25,"cacheWrite":0}},{"id":"qwen3","reasoning":true,"thinkingFormat":"chat-template"}]}`
	if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	models, err := LoadModels(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Models: models, BaseURL: "http://localhost:8000/v1", Provider: "vllm"})
	if err != nil {
		t.Fatal(err)
	}
	m := p.Model("gpt-4o")
	if m.Name != "GPT-4o" || m.ContextWindow != 128000 || m.MaxTokens != 16384 || m.Cost.Output != 10 || m.API != API ||
		m.Provider != "vllm" || len(m.Input) != 2 {
		t.Errorf("model %+v", m)
	}
	if bare := p.Model("unknown"); bare.ID != "unknown" || bare.API != API || bare.Cost.Input != 0 {
		t.Errorf("bare model %+v", bare)
	}
	body, err := p.requestBody(p.Model("qwen3"), userContext("hi"), agent.StreamOptions{})
	if err != nil || !json.Valid(body) || !strings.Contains(string(body), `"chat_template_kwargs":{"enable_thinking":false}`) {
		t.Errorf("qwen3 body %s %v", body, err)
	}
	for _, bad := range []string{`[{"id":""}]`, `[{"id":"a"},{"id":"a"}]`, `[{"id":"a","maxTokensField":"tokens"}]`, `{`} {
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadModels(path); err == nil {
			t.Errorf("LoadModels accepted %s", bad)
		}
	}
	if _, err := New(Config{BaseURL: "localhost:8000"}); err == nil {
		t.Errorf("New accepted a base URL without a scheme")
	}
}
