package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
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

func (ts *toolSources) sources(nc *nats.Conn, prefix string, log *slog.Logger) ([]toolsource.Source, error) {
	var out []toolsource.Source
	if ts.mcp != nil {
		for _, s := range toolsource.NewMCPServers(ts.mcp, toolsource.MCPOptions{Logger: log, Version: version}) {
			// Names only: commands, URLs and headers may hold secrets.
			log.Info("MCP server configured", "server", s.Name())
			out = append(out, s)
		}
	}
	if len(ts.services) > 0 {
		svc, err := toolsource.NewServices(nc, toolsource.ServiceOptions{Logger: log, Allowed: ts.services, Prefix: prefix})
		if err != nil {
			return nil, err
		}
		log.Info("tool services allowed", "services", ts.services)
		out = append(out, svc)
	}
	return out, nil
}

// toolsAuth is the NATS identity tool service discovery and calls use, on
// a connection of their own: a user that may publish only agents.tools.>
// and $SRV.INFO (toolcaller in deploy/nats/accounts.conf), so that no bug
// of the worker's tool code can reach records or the JetStream API with
// the worker's permissions.
type toolsAuth struct {
	user, password, creds, nkey string
}

func (a *toolsAuth) register(fs *flag.FlagSet) {
	fs.StringVar(&a.user, "tools-user", env("AGENTS_TOOLS_USER", ""), "NATS user of tool service discovery and calls, on a connection of their own (user toolcaller of deploy/nats/accounts.conf, which may publish only agents.tools.> and $SRV.INFO); its password from AGENTS_TOOLS_PASSWORD. Without --tools-user, --tools-creds or --tools-nkey tool services are called with the worker's own connection [AGENTS_TOOLS_USER]")
	fs.StringVar(&a.password, "tools-password", "", "password of --tools-user (prefer the environment: flags show in ps) [AGENTS_TOOLS_PASSWORD]")
	fs.StringVar(&a.creds, "tools-creds", env("AGENTS_TOOLS_CREDS", ""), "NATS credentials (.creds) file of the tool calls' connection (see --tools-user) [AGENTS_TOOLS_CREDS]")
	fs.StringVar(&a.nkey, "tools-nkey", env("AGENTS_TOOLS_NKEY", ""), "file with the NKey user seed of the tool calls' connection (see --tools-user) [AGENTS_TOOLS_NKEY]")
}

// fromEnv reads the password after parsing, so --help never prints it.
func (a *toolsAuth) fromEnv() {
	if a.password == "" {
		a.password = os.Getenv("AGENTS_TOOLS_PASSWORD")
	}
}

func (a *toolsAuth) set() bool { return a.user != "" || a.creds != "" || a.nkey != "" }

// connectTools connects as the tool caller: the worker's servers, TLS and
// prefix, none of its credentials (a password in --nats URLs included).
func connectTools(ctx context.Context, o *options) (*bus.Client, error) {
	co := o.conn
	co.URL = withoutUserInfo(co.URL)
	co.User, co.Password, co.Token = o.toolsAuth.user, o.toolsAuth.password, ""
	co.CredsFile, co.NKeySeedFile = o.toolsAuth.creds, o.toolsAuth.nkey
	co.Name = "agentfleet-worker-tools"
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return bus.Connect(cctx, co)
}

// withoutUserInfo drops credentials from comma-separated server URLs.
func withoutUserInfo(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err == nil && u.User != nil {
			u.User = nil
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
