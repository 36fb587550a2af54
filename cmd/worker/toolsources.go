package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/toolsource"
)

// toolSources is what --tools-config and --tool-services configure.
type toolSources struct {
	mcp      *toolsource.Config // nil: no MCP servers
	services []string
}

// loadToolSources reads and checks the tools config before anything
// starts: a bad one (an unset ${VAR} included) stops the worker (exit 2).
func loadToolSources(o *options) (*toolSources, error) {
	ts := &toolSources{}
	if o.toolsConfig != "" {
		data, err := os.ReadFile(o.toolsConfig)
		if err != nil {
			return nil, fmt.Errorf("--tools-config: %w", err)
		}
		if ts.mcp, err = toolsource.ParseConfig(data, os.LookupEnv); err != nil {
			return nil, fmt.Errorf("--tools-config %s: %w", o.toolsConfig, err)
		}
	}
	for n := range strings.SplitSeq(o.toolServices, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if n != "*" {
			if err := toolsource.CheckNamespace(n); err != nil {
				return nil, fmt.Errorf("--tool-services: %w", err)
			}
		}
		ts.services = append(ts.services, n)
	}
	return ts, nil
}

func (ts *toolSources) sources(nc *nats.Conn, log *slog.Logger) ([]toolsource.Source, error) {
	var out []toolsource.Source
	if ts.mcp != nil {
		for _, s := range toolsource.NewMCPServers(ts.mcp, toolsource.MCPOptions{Logger: log, Version: version}) {
			// Names only: commands, URLs and headers may hold secrets.
			log.Info("MCP server configured", "server", s.Name())
			out = append(out, s)
		}
	}
	if len(ts.services) > 0 {
		svc, err := toolsource.NewServices(nc, toolsource.ServiceOptions{Logger: log, Allowed: ts.services})
		if err != nil {
			return nil, err
		}
		log.Info("tool services allowed", "services", ts.services)
		out = append(out, svc)
	}
	return out, nil
}
