package toolsource_test

import (
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/toolsource"
)

func TestParseConfig(t *testing.T) {
	t.Parallel()
	env := map[string]string{"GITHUB_TOKEN": "ghp_secret123", "HOME": "/home/w"}
	getenv := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := toolsource.ParseConfig([]byte(`{"mcpServers": {
		"github": {"command": "gh-mcp", "args": ["--token", "${GITHUB_TOKEN}"], "env": {"TOKEN": "${GITHUB_TOKEN}"}},
		"remote-1": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"}},
		"local": {"type": "stdio", "command": "srv"}}}`), getenv)
	if err != nil {
		t.Fatal(err)
	}
	gh := cfg.MCPServers["github"]
	if !gh.Stdio() || gh.Args[1] != "ghp_secret123" || gh.Env["TOKEN"] != "ghp_secret123" {
		t.Errorf("github: %+v", gh)
	}
	if r := cfg.MCPServers["remote-1"]; r.Stdio() || r.Headers["Authorization"] != "Bearer ghp_secret123" {
		t.Errorf("remote-1: %+v", r)
	}
	if len(cfg.MCPServers) != 3 {
		t.Errorf("servers: %v", cfg.MCPServers)
	}

	for _, c := range []struct{ name, config, want string }{
		{"both", `{"mcpServers":{"a":{"command":"x","url":"http://h"}}}`, `both "command" and "url"`},
		{"neither", `{"mcpServers":{"a":{"args":["x"]}}}`, `neither "command" nor "url"`},
		{"sse", `{"mcpServers":{"a":{"type":"sse","url":"http://h/sse"}}}`, `"type": "sse"`},
		{"type stdio with url", `{"mcpServers":{"a":{"type":"stdio","url":"http://h"}}}`, `"type": "stdio" with a "url"`},
		{"type http with command", `{"mcpServers":{"a":{"type":"http","command":"x"}}}`, `"type": "http" with a "command"`},
		{"unknown type", `{"mcpServers":{"a":{"type":"ws","url":"http://h"}}}`, `"type" "ws"`},
		{"unknown server key", `{"mcpServers":{"a":{"command":"x","cwd":"/"}}}`, `unknown key "cwd"`},
		{"unknown top key", `{"mcpServers":{},"servers":{}}`, `unknown key "servers"`},
		{"unset variable", `{"mcpServers":{"a":{"command":"x","env":{"T":"${NOPE_TOKEN}"}}}}`, `environment variable NOPE_TOKEN is not set`},
		{"bad reference", `{"mcpServers":{"a":{"url":"http://h/${1x}"}}}`, `not a variable reference`},
		{"underscores", `{"mcpServers":{"my__server":{"command":"x"}}}`, `cannot prefix tool names`},
		{"dot", `{"mcpServers":{"my.server":{"command":"x"}}}`, `cannot prefix tool names`},
		{"headers on stdio", `{"mcpServers":{"a":{"command":"x","headers":{"A":"b"}}}}`, `"headers" are for HTTP servers`},
		{"not http", `{"mcpServers":{"a":{"url":"ftp://h"}}}`, `not an http:// or https:// URL`},
		{"trailing", `{"mcpServers":{}} {}`, `trailing data`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := toolsource.ParseConfig([]byte(c.config), getenv)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
			if strings.Contains(err.Error(), "ghp_secret123") {
				t.Fatalf("error leaks a secret: %v", err)
			}
		})
	}
	// A secret is never quoted, even when its value is what is wrong.
	_, err = toolsource.ParseConfig([]byte(`{"mcpServers":{"a":{"url":"${GITHUB_TOKEN}"}}}`), getenv)
	if err == nil || strings.Contains(err.Error(), "ghp_secret123") {
		t.Fatalf("error %v", err)
	}
}
