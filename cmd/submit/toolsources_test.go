package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// A faux-scripted run through the worker and submit binaries calls an MCP
// tool and a tool service in one parallel batch; submit tools lists them.
func TestToolSourcesEndToEnd(t *testing.T) {
	t.Parallel()
	// An MCP server (Streamable HTTP, from the Go SDK) in this process.
	srv := mcp.NewServer(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "echo", Description: "Echo the text back.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var args struct{ Text string }
			_ = json.Unmarshal(req.Params.Arguments, &args)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo: " + args.Text}}}, nil
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	defer hs.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "tools.json")
	if err := os.WriteFile(cfgPath, []byte(`{"mcpServers":{"e2e":{"url":"${E2E_MCP_URL}"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}

	stop, url, err := startWorkerProcess(filepath.Join(dir, "worker.log"), []string{"E2E_MCP_URL=" + hs.URL + "/mcp"},
		"--nats-listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--worker-id", "e2e-tools",
		"--tools-config", cfgPath, "--tool-services", "calc")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("worker: %v", err)
		}
	}()

	// A tool service on the worker's NATS.
	c := fleettest.Connect(t, url)
	svc, err := micro.AddService(c.Conn(), micro.Config{Name: "calc", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()
	if err := svc.AddGroup("agents.tools.calc").AddEndpoint("add", micro.HandlerFunc(func(r micro.Request) {
		var a struct{ A, B float64 }
		_ = json.Unmarshal(r.Data(), &a)
		_ = r.RespondJSON(map[string]any{"content": []map[string]any{{"type": "text", "text": "sum " + jsonNumber(a.A+a.B)}}})
	}), micro.WithEndpointMetadata(map[string]string{"description": "Add two numbers.",
		"schema": `{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]}`})); err != nil {
		t.Fatal(err)
	}

	env := func(args ...string) []string { return append([]string{"--nats", url}, args...) }
	req := `{"model":"faux/x","tools":["e2e__*","calc__add"],"toolExecution":"parallel","faux":{"responses":[
 {"content":[{"type":"toolCall","id":"m1","name":"e2e__echo","arguments":{"text":"hi"}},{"type":"toolCall","id":"s1","name":"calc__add","arguments":{"a":2,"b":3}}],"stopReason":"toolUse"},
 {"content":[{"type":"text","text":"Both answered."}]}]}}`
	id := "e2e-tools-" + strings.ToLower(t.Name()[:4])
	out, errOut, code := submit(t, env("--id", id, "--request", request(t, req), "use both tools")...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	expect(t, out, "e2e__echo", "calc__add", "Both answered.", "✓ succeeded")
	tr, err := c.LoadTranscript(fleettest.Context(t), id)
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]string{}
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult && !m.IsError {
			results[m.ToolName] = m.TextOf()
		}
	}
	if results["e2e__echo"] != "echo: hi" || results["calc__add"] != "sum 5" {
		t.Errorf("tool results %v", results)
	}
	if want := []string{"calc__add", "e2e__echo"}; !slices.Equal(tr.Started.Tools, want) {
		t.Errorf("run_started.tools %v, want %v", tr.Started.Tools, want)
	}

	// submit tools: every tool of the fleet, with its source and workers.
	// Presence follows the worker's state within a second: wait for the
	// service found during the run.
	deadline := time.Now().Add(15 * time.Second)
	for {
		js, errOut, code := submit(t, env("tools", "--json")...)
		if code != 0 {
			t.Fatalf("tools: exit %d %s", code, errOut)
		}
		var tools []fleetTool
		if err := json.Unmarshal([]byte(js), &tools); err != nil {
			t.Fatalf("%v\n%s", err, js)
		}
		has := func(name, source string) bool {
			return slices.ContainsFunc(tools, func(ft fleetTool) bool {
				return ft.Name == name && ft.Source == source && slices.Equal(ft.Workers, []string{"e2e-tools"}) && ft.Description != ""
			})
		}
		if has("e2e__echo", "mcp:e2e") && has("calc__add", "service:calc") && has("calculator", "builtin") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("submit tools --json:\n%s", js)
		}
		time.Sleep(100 * time.Millisecond)
	}
	table, _, code := submit(t, env("tools")...)
	if code != 0 {
		t.Fatalf("tools: exit %d", code)
	}
	expect(t, table, "TOOL", "SOURCE", "e2e__echo", "mcp:e2e", "calc__add", "service:calc")

	// New command words do not take prompts away: after a run-only flag,
	// and after "--", "tools" is the prompt.
	for _, args := range [][]string{{"--model", "faux/demo", "tools"}, {"--", "tools"}} {
		out, errOut, code := submit(t, env(args...)...)
		if code != 0 || !strings.Contains(out, "run ") || strings.Contains(out, "SOURCE") {
			t.Errorf("submit %v: exit %d\n%s\n%s", args, code, out, errOut)
		}
	}
}

func jsonNumber(f float64) string {
	b, _ := json.Marshal(f)
	return string(b)
}
