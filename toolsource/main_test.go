package toolsource_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/testpar"
	"github.com/agentfleet/agentfleet/toolsource"
)

func TestMain(m *testing.M) {
	// The test binary doubles as a no-op MCP stdio server (benchmarks).
	switch os.Getenv("TOOLSOURCE_TEST_STDIO_SERVER") {
	case "1":
		serveNoopStdio()
		return
	case "sized":
		if err := sizedServer(false).Run(context.Background(), &mcp.StdioTransport{MaxLineLength: -1}); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	case "sized-indented":
		// Every message pretty-printed over many lines, big replies as
		// many short blocks: no line comes near the cap.
		t := &mcp.IOTransport{Reader: os.Stdin, Writer: indentWriter{os.Stdout}, MaxLineLength: -1}
		if err := sizedServer(true).Run(context.Background(), t); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	testpar.Default(4) // the tests wait (on servers, processes) more than they compute
	goleak.VerifyTestMain(m)
}

func serveNoopStdio() {
	srv := mcp.NewServer(&mcp.Implementation{Name: "noop", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "noop", Description: "Does nothing.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
		})
	if err := srv.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

// noRaceExitSleep is the GORACE of this test binary run as a server: a
// race-built one would sleep a second at its exit (a race it found still
// makes it exit 66).
const noRaceExitSleep = "atexit_sleep_ms=0"

// noopStdioConfig runs this test binary as a no-op MCP stdio server.
func noopStdioConfig(t testing.TB) toolsource.ServerConfig {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return toolsource.ServerConfig{Command: exe, Env: map[string]string{"TOOLSOURCE_TEST_STDIO_SERVER": "1", "GORACE": noRaceExitSleep}}
}

// everythingDir is where `npm install @modelcontextprotocol/server-everything`
// put the package (AGENTFLEET_MCP_EVERYTHING); .ci/run installs it. Without
// it the tests skip locally and fail in CI.
func everythingDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("AGENTFLEET_MCP_EVERYTHING")
	if dir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("AGENTFLEET_MCP_EVERYTHING is not set: CI must install @modelcontextprotocol/server-everything (see .ci/run)")
		}
		t.Skip("AGENTFLEET_MCP_EVERYTHING is not set (npm install --prefix DIR @modelcontextprotocol/server-everything@2026.8.31; then DIR/node_modules/@modelcontextprotocol/server-everything)")
	}
	if _, err := os.Stat(filepath.Join(dir, "dist", "index.js")); err != nil {
		t.Fatalf("AGENTFLEET_MCP_EVERYTHING=%s: %v", dir, err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("the MCP test server needs node: %v", err)
	}
	return dir
}

func everythingConfig(t *testing.T, env map[string]string) toolsource.ServerConfig {
	return toolsource.ServerConfig{Command: "node", Args: []string{filepath.Join(everythingDir(t), "dist", "index.js"), "stdio"}, Env: env}
}

// watcher wraps a source's transports: it records the methods the client
// sends and keeps the last stdio command (to kill its process).
type watcher struct {
	mu      sync.Mutex
	methods []string
	proc    *os.Process // the server process of the last connect
	changed chan struct{}
}

func newWatcher() *watcher { return &watcher{changed: make(chan struct{}, 1)} }

func (w *watcher) wrap(_ string, t mcp.Transport) mcp.Transport {
	return &watchTransport{t, w}
}

func (w *watcher) sent(method string) {
	w.mu.Lock()
	w.methods = append(w.methods, method)
	w.mu.Unlock()
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *watcher) count(method string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.methods {
		if m == method {
			n++
		}
	}
	return n
}

// waitSent waits until the client has sent method n times.
func (w *watcher) waitSent(t *testing.T, method string, n int) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for w.count(method) < n {
		select {
		case <-w.changed:
		case <-deadline:
			t.Fatalf("the client did not send %s (%d times) within 20s", method, n)
		}
	}
}

func (w *watcher) process() *os.Process {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.proc
}

type watchTransport struct {
	mcp.Transport
	w *watcher
}

func (t *watchTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	// The process exists once Connect has started it; read it only then
	// (the SDK writes the Cmd while it starts).
	if ct, ok := t.Transport.(*toolsource.CommandTransport); ok {
		t.w.mu.Lock()
		t.w.proc = ct.Command.Process
		t.w.mu.Unlock()
	}
	return &watchConn{c, t.w}, nil
}

type watchConn struct {
	mcp.Connection
	w *watcher
}

func (c *watchConn) Write(ctx context.Context, m jsonrpc.Message) error {
	if r, ok := m.(*jsonrpc.Request); ok {
		c.w.sent(r.Method)
	}
	return c.Connection.Write(ctx, m)
}

// runSource runs a source until the test ends and waits for its first
// connection attempt.
func runSource(t testing.TB, s toolsource.Source) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-s.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("source not ready after 30s")
	}
}

// waitUp waits until every part of a source is up.
func waitUp(t testing.TB, s toolsource.Source) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		parts, _ := s.Status()
		up := len(parts) > 0
		for _, p := range parts {
			up = up && p.Up
		}
		if up {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("source not up within 20s: %+v", parts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func newLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }
