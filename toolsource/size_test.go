package toolsource_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
// text (in blocks of up to 64 bytes when blocks is set); "held" answers "ok" once "release" was called, and "state" says
// whether a "held" call has reached the server ("held" or "idle").
func sizedServer(blocks bool) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "sized", Version: "1"}, nil)
	obj := json.RawMessage(`{"type":"object","properties":{"n":{"type":"number"}}}`)
	var held atomic.Bool
	released := make(chan struct{})
	var release sync.Once
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	srv.AddTool(&mcp.Tool{Name: "big", Description: "A reply of n bytes.", InputSchema: obj},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var a struct{ N int }
			_ = json.Unmarshal(req.Params.Arguments, &a)
			if !blocks {
				return text(strings.Repeat("x", a.N)), nil
			}
			res := &mcp.CallToolResult{}
			for n := a.N; n > 0; n -= 64 {
				res.Content = append(res.Content, &mcp.TextContent{Text: strings.Repeat("x", min(n, 64))})
			}
			return res, nil
		})
	srv.AddTool(&mcp.Tool{Name: "held", Description: "ok, once released.", InputSchema: obj},
		func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			held.Store(true)
			select {
			case <-released:
			case <-ctx.Done():
			}
			return text("ok"), nil
		})
	srv.AddTool(&mcp.Tool{Name: "release", Description: "Ends the held call.", InputSchema: obj},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			release.Do(func() { close(released) })
			return text("released"), nil
		})
	srv.AddTool(&mcp.Tool{Name: "state", Description: "held or idle.", InputSchema: obj},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if held.Load() {
				return text("held"), nil
			}
			return text("idle"), nil
		})
	return srv
}

// indentWriter pretty-prints each message the SDK writes (one Write a
// message) over many lines.
type indentWriter struct{ w io.WriteCloser }

func (i indentWriter) Write(p []byte) (int, error) {
	var b bytes.Buffer
	if err := json.Indent(&b, bytes.TrimSpace(p), "", "  "); err != nil {
		return 0, err
	}
	b.WriteByte('\n')
	if _, err := i.w.Write(b.Bytes()); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (i indentWriter) Close() error { return i.w.Close() }

// testCap is the size cap the test gives the worker: the default (the
// SDK's 16 MiB line cap) takes the same path, but a 17 MiB reply made,
// sent and refused under -race on a loaded machine takes tens of seconds.
const testCap = 1 << 20

// One reply over the size cap fails its own call only: a call running on
// the same session at the time, and the calls after it, are answered, and
// the session is the one it was (no new initialize). Over stdio, and over
// Streamable HTTP with SSE and with JSON replies.
func TestMCPOversizedReplyFailsOnlyItsCall(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cfg  func(t *testing.T) toolsource.ServerConfig
	}{
		{"stdio", func(*testing.T) toolsource.ServerConfig {
			return toolsource.ServerConfig{Command: exe, Env: map[string]string{"TOOLSOURCE_TEST_STDIO_SERVER": "sized", "GORACE": noRaceExitSleep}}
		}},
		// A reply over the cap in many short lines: the cap counts the
		// message, not its lines.
		{"stdio-indented", func(*testing.T) toolsource.ServerConfig {
			return toolsource.ServerConfig{Command: exe, Env: map[string]string{"TOOLSOURCE_TEST_STDIO_SERVER": "sized-indented", "GORACE": noRaceExitSleep}}
		}},
		{"http-sse", func(t *testing.T) toolsource.ServerConfig { return sizedHTTP(t, false) }},
		{"http-json", func(t *testing.T) toolsource.ServerConfig { return sizedHTTP(t, true) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs logbuf.Buffer
			s := toolsource.NewMCPServer("sized", c.cfg(t), toolsource.MCPOptions{Logger: newLogger(&logs),
				MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxMessageBytes: testCap})
			runSource(t, s)
			waitUp(t, s)
			tool := func(name string) *agent.Tool { return find(t, s, "sized", "sized__"+name) }
			text := func(name string, args map[string]any) string {
				res, err := call(t, tool(name), args)
				if err != nil || len(res.Content) != 1 {
					t.Fatalf("%s: %+v %v", name, res, err)
				}
				return res.Content[0].Text
			}

			var wg sync.WaitGroup
			var heldRes agent.ToolResult
			var heldErr error
			wg.Go(func() { heldRes, heldErr = call(t, tool("held"), nil) })
			// The held call is in flight once the server has it.
			for deadline := time.Now().Add(10 * time.Second); text("state", nil) != "held"; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the held call never reached the server")
				}
			}
			_, err := call(t, tool("big"), map[string]any{"n": testCap + 64<<10})
			if err == nil || !strings.Contains(err.Error(), "sized__big failed: the server's reply of ") ||
				!strings.Contains(err.Error(), fmt.Sprintf("was refused: the limit is %d", testCap)) {
				t.Errorf("the oversized call: %v", err)
			}
			text("release", nil)
			wg.Wait()
			if heldErr != nil || len(heldRes.Content) != 1 || heldRes.Content[0].Text != "ok" {
				t.Errorf("the call in flight on the same session: %+v %v", heldRes, heldErr)
			}
			if got := text("big", map[string]any{"n": 10}); got != strings.Repeat("x", 10) {
				t.Errorf("a call after it: %q", got)
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
	srv := sizedServer(false)
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
	t.Parallel()
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
	t.Parallel()
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
	// built-ins and run_agent, the tools taken, the refused ones listed
	// (300-256 each)
	served := len(worker.BuiltinTools()) + 1 + 3*toolsource.MaxSourceTools + 3*(300-toolsource.MaxSourceTools)
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

// A call with more than 1 MiB of arguments is a call like any other: its
// reply over the cap becomes its error (a JSON reply was read whole, an
// SSE one dropped without the call's error), and the session goes on.
func TestMCPOversizedReplyToLargeArgumentsFailsItsCall(t *testing.T) {
	t.Parallel()
	for name, jsonReplies := range map[string]bool{"http-sse": false, "http-json": true} {
		t.Run(name, func(t *testing.T) {
			var logs logbuf.Buffer
			s := toolsource.NewMCPServer("sized", sizedHTTP(t, jsonReplies), toolsource.MCPOptions{Logger: newLogger(&logs),
				MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxMessageBytes: 4 << 20})
			runSource(t, s)
			waitUp(t, s)
			big := find(t, s, "sized", "sized__big")
			pad := strings.Repeat("a", 2<<20)
			start := time.Now()
			_, err := callWithin(time.Minute, big, map[string]any{"n": 4<<20 + 64<<10, "pad": pad})
			if err == nil || !strings.Contains(err.Error(), "was refused: the limit is 4194304") {
				t.Errorf("the oversized reply to a call with 2 MiB of arguments: %v (after %s)", err, time.Since(start).Round(time.Millisecond))
			}
			if res, err := callWithin(time.Minute, big, map[string]any{"n": 10, "pad": pad}); err != nil || len(res.Content) != 1 || res.Content[0].Text != strings.Repeat("x", 10) {
				t.Errorf("a small reply to a call with 2 MiB of arguments: %+v %v", res, err)
			}
			if n := strings.Count(logs.String(), "MCP server connected"); n != 1 {
				t.Errorf("%d sessions, want one:\n%s", n, logs.String())
			}
		})
	}
}
