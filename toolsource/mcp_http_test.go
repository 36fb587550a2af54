package toolsource_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/toolsource"
)

var objectSchema = json.RawMessage(`{"type":"object","properties":{"x":{"type":"number"}}}`)

// goServer is an in-process Streamable HTTP MCP server from the Go SDK
// whose tools return each kind of content.
func goServer(t *testing.T) (*mcp.Server, string) {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "go-test", Version: "1"}, nil)
	add := func(name string, res func(*mcp.CallToolRequest) *mcp.CallToolResult) {
		srv.AddTool(&mcp.Tool{Name: name, Description: "the " + name + " tool", InputSchema: objectSchema},
			func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) { return res(req), nil })
	}
	add("text", func(*mcp.CallToolRequest) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "hello"}}}
	})
	add("image", func(*mcp.CallToolRequest) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.ImageContent{Data: []byte("PNG!"), MIMEType: "image/png"}}}
	})
	add("fail", func(*mcp.CallToolRequest) *mcp.CallToolResult {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "the disk is full"}}}
	})
	add("structured", func(*mcp.CallToolRequest) *mcp.CallToolResult {
		return &mcp.CallToolResult{StructuredContent: map[string]any{"n": 1}}
	})
	add("resource", func(*mcp.CallToolRequest) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///a.txt", Text: "contents"}},
			&mcp.ResourceLink{URI: "file:///b.txt", Name: "b"},
			&mcp.AudioContent{Data: []byte("x"), MIMEType: "audio/wav"},
		}}
	})
	add("headers", func(req *mcp.CallToolRequest) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: req.Extra.Header.Get("Authorization")}}}
	})
	add("has.dot", func(*mcp.CallToolRequest) *mcp.CallToolResult { return &mcp.CallToolResult{} })
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return srv, hs.URL
}

func call(t *testing.T, tool *agent.Tool, args map[string]any) (agent.ToolResult, error) {
	t.Helper()
	return callWithin(10*time.Second, tool, args)
}

// callWithin bounds a call by d: calls moving megabytes under -race on a
// loaded machine need more than the usual 10 s (one took 10 s at load 27).
func callWithin(d time.Duration, tool *agent.Tool, args map[string]any) (agent.ToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return tool.Execute(ctx, "call-1", args, nil)
}

func find(t *testing.T, s toolsource.Source, ns, name string) *agent.Tool {
	t.Helper()
	tools, ok := s.Resolve(context.Background(), ns)
	if !ok {
		t.Fatalf("namespace %s not served", ns)
	}
	for _, tool := range tools {
		if tool.Name == name {
			return tool
		}
	}
	t.Fatalf("no tool %s in %v", name, names(tools))
	return nil
}

func names(tools []*agent.Tool) []string {
	var out []string
	for _, t := range tools {
		out = append(out, t.Name)
	}
	return out
}

func TestMCPStreamableHTTP(t *testing.T) {
	t.Parallel()
	srv, url := goServer(t)
	s := toolsource.NewMCPServer("go", toolsource.ServerConfig{URL: url, Headers: map[string]string{"Authorization": "Bearer s3cret"}}, toolsource.MCPOptions{})
	runSource(t, s)
	waitUp(t, s)

	tools, _ := s.Resolve(context.Background(), "go")
	want := []string{"go__fail", "go__headers", "go__image", "go__resource", "go__structured", "go__text"}
	if got := names(tools); !slices.Equal(got, want) {
		t.Fatalf("tools %v, want %v (go__has.dot skipped)", got, want)
	}
	if tools[0].Description != "the fail tool" || !strings.Contains(string(tools[0].Parameters), `"x"`) {
		t.Errorf("description/schema not from the server: %q %s", tools[0].Description, tools[0].Parameters)
	}
	_, status := s.Status()
	if i := slices.IndexFunc(status, func(ts toolsource.ToolStatus) bool { return ts.Name == "go__has.dot" }); i < 0 || status[i].Available {
		t.Errorf("the skipped tool is not listed unavailable: %+v", status)
	}

	res, err := call(t, find(t, s, "go", "go__text"), map[string]any{"x": 1})
	if err != nil || len(res.Content) != 1 || res.Content[0].Text != "hello" {
		t.Errorf("text: %+v %v", res, err)
	}
	res, err = call(t, find(t, s, "go", "go__image"), nil)
	if err != nil || len(res.Content) != 1 || res.Content[0].Type != agent.ContentImage || res.Content[0].Data != "UE5HIQ==" || res.Content[0].MimeType != "image/png" {
		t.Errorf("image: %+v %v", res, err)
	}
	_, err = call(t, find(t, s, "go", "go__fail"), nil)
	if err == nil || err.Error() != "the disk is full" {
		t.Errorf("isError: %v", err)
	}
	res, err = call(t, find(t, s, "go", "go__structured"), nil)
	if err != nil || len(res.Content) != 1 || res.Content[0].Text != `{"n":1}` || res.Details.(map[string]any)["n"] != 1.0 {
		t.Errorf("structured: %+v %v", res, err)
	}
	res, err = call(t, find(t, s, "go", "go__resource"), nil)
	var texts []string
	for _, c := range res.Content {
		texts = append(texts, c.Text)
	}
	if err != nil || !slices.Equal(texts, []string{"file:///a.txt\ncontents", "file:///b.txt (b)", "[unsupported audio content]"}) {
		t.Errorf("resource: %q %v", texts, err)
	}
	res, err = call(t, find(t, s, "go", "go__headers"), nil)
	if err != nil || res.Content[0].Text != "Bearer s3cret" {
		t.Errorf("configured header: %+v %v", res, err)
	}

	// tools/list_changed refreshes the list.
	srv.AddTool(&mcp.Tool{Name: "late", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "late"}}}, nil
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		tools, _ := s.Resolve(context.Background(), "go")
		if slices.Contains(names(tools), "go__late") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("go__late not listed after list_changed: %v", names(tools))
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err = call(t, find(t, s, "go", "go__late"), nil)
	if err != nil || res.Content[0].Text != "late" {
		t.Errorf("late: %+v %v", res, err)
	}
}

// A server that is not there: its namespace is still served, and its
// tools fail with the reason.
func TestMCPServerDown(t *testing.T) {
	t.Parallel()
	s := toolsource.NewMCPServer("gone", toolsource.ServerConfig{Command: "/nonexistent/mcp-server"}, toolsource.MCPOptions{MinBackoff: time.Hour})
	runSource(t, s)
	tools, ok := s.Resolve(context.Background(), "gone")
	if !ok || len(tools) != 0 {
		t.Fatalf("Resolve: %v %v", tools, ok)
	}
	_, err := call(t, s.Missing("gone__anything"), nil)
	if err == nil || !strings.HasPrefix(err.Error(), "MCP server gone is unavailable: ") || !strings.Contains(err.Error(), "/nonexistent/mcp-server") {
		t.Fatalf("call: %v", err)
	}
	if parts, _ := s.Status(); len(parts) != 1 || parts[0].Up || parts[0].Name != "mcp:gone" {
		t.Fatalf("status: %+v", parts)
	}
}
