package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/internal/logbuf"
)

// A tools config naming an unset variable stops the worker before it
// starts anything (exit 2), naming the variable and never a secret.
func TestToolsConfigRefused(t *testing.T) {
	t.Setenv("AGENTS_DATA_DIR", t.TempDir())
	t.Setenv("AGENTS_METRICS_ADDR", "")
	t.Setenv("MCP_TEST_SECRET", "s3cret-value")
	dir := t.TempDir()
	for _, c := range []struct{ name, config, want string }{
		{"unset", `{"mcpServers":{"gh":{"url":"https://h/mcp","headers":{"Authorization":"Bearer ${MCP_TEST_SECRET}","X":"${MCP_TEST_UNSET}"}}}}`, "environment variable MCP_TEST_UNSET is not set"},
		{"sse", `{"mcpServers":{"old":{"type":"sse","url":"https://h/sse?key=${MCP_TEST_SECRET}"}}}`, "legacy HTTP+SSE transport) is not supported"},
		{"unknown key", `{"mcpServers":{"a":{"command":"x","cmd":"${MCP_TEST_SECRET}"}}}`, "unknown key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, c.name+".json")
			if err := os.WriteFile(path, []byte(c.config), 0o600); err != nil {
				t.Fatal(err)
			}
			var out logbuf.Buffer
			if code := run(context.Background(), []string{"--tools-config", path, "--nats-listen", "127.0.0.1:0"}, &out, nil); code != 2 {
				t.Fatalf("exit %d:\n%s", code, out.String())
			}
			if !strings.Contains(out.String(), c.want) || strings.Contains(out.String(), "s3cret-value") {
				t.Fatalf("output:\n%s", out.String())
			}
		})
	}
	var out logbuf.Buffer
	if code := run(context.Background(), []string{"--tool-services", "bad__name", "--nats-listen", "127.0.0.1:0"}, &out, nil); code != 2 || !strings.Contains(out.String(), "--tool-services") {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
}
