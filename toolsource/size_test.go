package toolsource_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/toolsource"
	"github.com/agentfleet/agentfleet/worker"
)

// sizedServer is an MCP server whose tool "big" answers with n bytes of
// text and "slow" with "ok" after ms milliseconds.
func sizedServer() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "sized", Version: "1"}, nil)
	var args struct{ N, MS int }
	srv.AddTool(&mcp.Tool{Name: "big", Description: "A reply of n bytes.", InputSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"number"}}}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			a := args
			_ = json.Unmarshal(req.Params.Arguments, &a)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", a.N)}}}, nil
		})
	srv.AddTool(&mcp.Tool{Name: "slow", Description: "ok, after ms.", InputSchema: json.RawMessage(`{"type":"object","properties":{"ms":{"type":"number"}}}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			a := args
			_ = json.Unmarshal(req.Params.Arguments, &a)
			select {
			case <-time.After(time.Duration(a.MS) * time.Millisecond):
			case <-ctx.Done():
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
		})
	return srv
}

// overCap is a reply over the SDK's 16 MiB line cap, the worker's default.
const overCap = 17 << 20

// One reply over the size cap fails its own call only: a call running on
// the same session at the time, and the calls after it, are answered, and
// the session is the one it was (no new initialize). Over stdio, and over
// Streamable HTTP with SSE and with JSON replies.
func TestMCPOversizedReplyFailsOnlyItsCall(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cfg  func(t *testing.T) toolsource.ServerConfig
	}{
		{"stdio", func(*testing.T) toolsource.ServerConfig {
			return toolsource.ServerConfig{Command: exe, Env: map[string]string{"TOOLSOURCE_TEST_STDIO_SERVER": "sized"}}
		}},
		{"http-sse", func(t *testing.T) toolsource.ServerConfig { return sizedHTTP(t, false) }},
		{"http-json", func(t *testing.T) toolsource.ServerConfig { return sizedHTTP(t, true) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs logbuf.Buffer
			s := toolsource.NewMCPServer("sized", c.cfg(t), toolsource.MCPOptions{Logger: newLogger(&logs),
				MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
			runSource(t, s)
			waitUp(t, s)
			slow, big := find(t, s, "sized", "sized__slow"), find(t, s, "sized", "sized__big")

			var wg sync.WaitGroup
			var slowRes agent.ToolResult
			var slowErr error
			wg.Go(func() { slowRes, slowErr = call(t, slow, map[string]any{"ms": 1500}) })
			time.Sleep(200 * time.Millisecond) // the slow call is in flight
			start := time.Now()
			_, err := call(t, big, map[string]any{"n": overCap})
			if err == nil || !strings.Contains(err.Error(), "sized__big failed: the server's reply of ") ||
				!strings.Contains(err.Error(), fmt.Sprintf("was refused: the limit is %d", 16<<20)) {
				t.Errorf("the oversized call: %v", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the oversized call failed after %s, not at once", d)
			}
			wg.Wait()
			if slowErr != nil || len(slowRes.Content) != 1 || slowRes.Content[0].Text != "ok" {
				t.Errorf("the call in flight on the same session: %+v %v", slowRes, slowErr)
			}
			res, err := call(t, big, map[string]any{"n": 10})
			if err != nil || res.Content[0].Text != strings.Repeat("x", 10) {
				t.Errorf("a call after it: %+v %v", res, err)
			}
			if n := strings.Count(logs.String(), "MCP server connected"); n != 1 || strings.Contains(logs.String(), "session ended") {
				t.Errorf("%d sessions, want the first one only:\n%s", n, logs.String())
			}
			if !strings.Contains(logs.String(), "MCP server reply over the size limit refused") {
				t.Errorf("not logged:\n%s", logs.String())
			}
		})
	}
}

func sizedHTTP(t *testing.T, jsonReplies bool) toolsource.ServerConfig {
	srv := sizedServer()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{JSONResponse: jsonReplies})
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return toolsource.ServerConfig{URL: hs.URL}
}

// manyTools is an MCP server with n tools t0000.., the first with a
// description of desc bytes, the second with a schema of schema bytes.
func manyTools(t *testing.T, n, desc, schema int) string {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "many", Version: "1"}, nil)
	for i := range n {
		tool := &mcp.Tool{Name: fmt.Sprintf("t%04d", i), Description: fmt.Sprintf("Tool number %d.", i), InputSchema: json.RawMessage(`{"type":"object"}`)}
		switch i {
		case 0:
			tool.Description = strings.Repeat("d", desc)
		case 1:
			tool.InputSchema = json.RawMessage(`{"type":"object","description":"` + strings.Repeat("s", schema) + `"}`)
		}
		srv.AddTool(tool, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ran"}}}, nil
		})
	}
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	return hs.URL
}

// An MCP server listing 5,000 tools, one with a 1 MiB description and one
// with a 100 KiB schema: the worker takes the first 256 tools, cuts the
// description, refuses the schema, each with a logged reason; a refused
// tool's call fails saying why, and does not reach the server.
func TestMCPToolListIsBounded(t *testing.T) {
	url := manyTools(t, 5000, 1<<20, 100<<10)
	var logs logbuf.Buffer
	s := toolsource.NewMCPServer("many", toolsource.ServerConfig{URL: url}, toolsource.MCPOptions{Logger: newLogger(&logs)})
	runSource(t, s)
	waitUp(t, s)
	tools, _ := s.Resolve(context.Background(), "many")
	if len(tools) != toolsource.MaxSourceTools {
		t.Fatalf("%d tools, want %d", len(tools), toolsource.MaxSourceTools)
	}
	if d := tools[0].Description; tools[0].Name != "many__t0000" || len(d) > toolsource.MaxToolDescriptionBytes+len("…") || !strings.HasSuffix(d, "…") {
		t.Errorf("the 1 MiB description: %s, %d bytes", tools[0].Name, len(d))
	}
	if slices.Contains(names(tools), "many__t0001") {
		t.Error("the tool with a 100 KiB schema is served")
	}
	_, status := s.Status()
	if i := slices.IndexFunc(status, func(st toolsource.ToolStatus) bool { return st.Name == "many__t0001" }); i < 0 || status[i].Available {
		t.Errorf("the refused tool is not listed unavailable")
	}
	if len(status) > toolsource.MaxSourceTools+64 {
		t.Errorf("status lists %d tools", len(status))
	}
	for _, c := range []struct{ tool, why string }{
		{"many__t0001", "tool many__t0001 is refused: its input schema is "},
		{"many__t4999", "tool many__t4999 is refused: its source has more than 256 tools"},
	} {
		if _, err := call(t, s.Missing(c.tool), nil); err == nil || !strings.HasPrefix(err.Error(), c.why) {
			t.Errorf("%s: %v", c.tool, err)
		}
	}
	for _, want := range []string{"MCP tool description cut", "MCP tool refused: its input schema is", "MCP tools past the first 256 of a source refused"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q", want)
		}
	}
}

// Presence is written whatever the sources list: three MCP servers of 300
// tools each (one with a 1 MiB description) make an entry of at most
// bus.MaxPresenceTools tools, descriptions cut, that says so; submit tools
// and the console still see the worker.
func TestPresenceWithHugeToolLists(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{})
	var sources []toolsource.Source
	for _, name := range []string{"a", "b", "c"} {
		s := toolsource.NewMCPServer(name, toolsource.ServerConfig{URL: manyTools(t, 300, 1<<20, 10)}, toolsource.MCPOptions{})
		sources = append(sources, s)
	}
	f.StartWorker(worker.Config{ToolSources: sources, WorkerID: "many-tools"})
	for _, s := range sources {
		waitUp(t, s)
	}
	ctx := fleettest.Context(t)
	// built-ins, the tools taken, the refused ones listed (300-256 each)
	served := 3 + 3*toolsource.MaxSourceTools + 3*(300-toolsource.MaxSourceTools)
	deadline := time.Now().Add(15 * time.Second)
	for {
		ws, err := f.Client.ListWorkers(ctx)
		var p bus.WorkerPresence
		if err == nil && len(ws) == 1 {
			p = ws[0]
		}
		if len(p.Tools) <= bus.MaxPresenceTools && p.ToolsTruncated && p.ToolsOmitted == served-len(p.Tools) {
			for _, tool := range p.Tools {
				if len(tool.Description) > bus.MaxPresenceDescription+len("…") {
					t.Errorf("%s: a description of %d bytes", tool.Name, len(tool.Description))
				}
			}
			if b, _ := json.Marshal(p); len(b) > 512<<10 {
				t.Errorf("the entry is %d bytes", len(b))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no presence with the tools bounded within 15s (err %v, %d workers): %d tools listed, truncated %v, %d omitted; want at most %d, %d omitted",
				err, len(ws), len(p.Tools), p.ToolsTruncated, p.ToolsOmitted, bus.MaxPresenceTools, served-len(p.Tools))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
