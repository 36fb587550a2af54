package main

import (
	"context"
	"errors"
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
	// tlsCert and tlsKey are the connection's client certificate: never
	// the worker's, which under verify_and_map is the worker's identity.
	tlsCert, tlsKey string
}

func (a *toolsAuth) register(fs *flag.FlagSet) {
	fs.StringVar(&a.user, "tools-user", env("AGENTS_TOOLS_USER", ""), "NATS user of tool service discovery and calls, on a connection of their own (user toolcaller of deploy/nats/accounts.conf, which may publish only agents.tools.> and $SRV.INFO); its password from AGENTS_TOOLS_PASSWORD. Without --tools-user, --tools-creds, --tools-nkey or --tools-tlscert tool services are called with the worker's own connection [AGENTS_TOOLS_USER]")
	fs.StringVar(&a.password, "tools-password", "", "password of --tools-user (prefer the environment: flags show in ps) [AGENTS_TOOLS_PASSWORD]")
	fs.StringVar(&a.creds, "tools-creds", env("AGENTS_TOOLS_CREDS", ""), "NATS credentials (.creds) file of the tool calls' connection (see --tools-user) [AGENTS_TOOLS_CREDS]")
	fs.StringVar(&a.nkey, "tools-nkey", env("AGENTS_TOOLS_NKEY", ""), "file with the NKey user seed of the tool calls' connection (see --tools-user) [AGENTS_TOOLS_NKEY]")
	fs.StringVar(&a.tlsCert, "tools-tlscert", env("AGENTS_TOOLS_CERT", ""), "client certificate file of the tool calls' connection (mutual TLS; with verify_and_map on the server, its identity): the worker's --tlscert is never used for it [AGENTS_TOOLS_CERT]")
	fs.StringVar(&a.tlsKey, "tools-tlskey", env("AGENTS_TOOLS_KEY", ""), "key file of --tools-tlscert [AGENTS_TOOLS_KEY]")
}

// fromEnv reads the password after parsing, so --help never prints it.
func (a *toolsAuth) fromEnv() {
	if a.password == "" {
		a.password = os.Getenv("AGENTS_TOOLS_PASSWORD")
	}
}

func (a *toolsAuth) set() bool {
	return a.user != "" || a.creds != "" || a.nkey != "" || a.tlsCert != ""
}

// toolsConnectOptions are the tool caller's: the worker's servers, CA and
// prefix, none of its credentials (a password in --nats URLs, its client
// certificate included).
func toolsConnectOptions(o *options) (bus.ConnectOptions, error) {
	co := o.conn
	var err error
	if co.URL, err = withoutUserInfo(co.URL); err != nil {
		return bus.ConnectOptions{}, fmt.Errorf("--nats: %w", err)
	}
	co.User, co.Password, co.Token = o.toolsAuth.user, o.toolsAuth.password, ""
	co.CredsFile, co.NKeySeedFile = o.toolsAuth.creds, o.toolsAuth.nkey
	co.TLSCert, co.TLSKey = o.toolsAuth.tlsCert, o.toolsAuth.tlsKey
	co.Name = "agentfleet-worker-tools"
	return co, nil
}

// connectTools connects as the tool caller (toolsConnectOptions).
func connectTools(ctx context.Context, o *options) (*bus.Client, error) {
	co, err := toolsConnectOptions(o)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return bus.Connect(cctx, co)
}

// withoutUserInfo drops credentials from comma-separated server URLs, each
// read as nats.go reads it: one without "://" is host[:port] with the
// client's scheme, so "worker:pw@host:4222" is user worker at host (to
// url.Parse alone it is scheme "worker", and its credentials stayed). A URL
// that does not parse is an error (which never shows the URL: it may hold
// a password).
func withoutUserInfo(urls string) (string, error) {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			continue // nats.go skips empty entries
		}
		schemeless := !strings.Contains(p, "://")
		if schemeless {
			p = "nats://" + p
		}
		u, err := url.Parse(p)
		if err != nil {
			if ue, ok := errors.AsType[*url.Error](err); ok {
				err = ue.Err
			}
			return "", fmt.Errorf("server URL %d does not parse: %v", i+1, err)
		}
		u.User = nil
		p = u.String()
		if schemeless {
			p = strings.TrimPrefix(p, "nats://")
		}
		parts[i] = p
	}
	return strings.Join(parts, ","), nil
}
