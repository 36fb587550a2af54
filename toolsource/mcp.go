package toolsource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentfleet/agentfleet/agent"
)

// MCPOptions shape the MCP sources.
type MCPOptions struct {
	Logger *slog.Logger
	// Version is the client version sent to servers.
	Version string
	// WrapTransport, when set, wraps each new transport (tests watch the
	// messages through it).
	WrapTransport func(server string, t mcp.Transport) mcp.Transport
	// MinBackoff and MaxBackoff bound the wait before a restart; defaults
	// 500ms and 30s.
	MinBackoff, MaxBackoff time.Duration
	// ConnectTimeout bounds starting a session and listing its tools;
	// default 30s.
	ConnectTimeout time.Duration
	// MaxMessageBytes bounds one message from a server (default 16 MiB,
	// the SDK's own cap). A larger reply fails its call only: the
	// session and the other calls on it go on.
	MaxMessageBytes int
}

// MCPServer is the source of one configured MCP server: one client
// session shared by every run, restarted with backoff when it ends.
type MCPServer struct {
	name    string
	cfg     ServerConfig
	o       MCPOptions
	log     *slog.Logger
	ready   chan struct{}
	refresh chan struct{}

	// progress routes a call's progress notifications to its run, by
	// progress token.
	progMu    sync.Mutex
	progress  map[string]chan agent.ToolResult
	nextToken uint64

	mu      sync.Mutex
	session *mcp.ClientSession // nil while down
	cause   string             // why it is down
	tools   []*agent.Tool
	refused []refusal
	over    bool              // it lists more than MaxSourceTools tools
	logged  map[string]string // what the last listing logged (toolBounds)
}

// NewMCPServers returns one source per configured server, sorted by name.
func NewMCPServers(cfg *Config, o MCPOptions) []*MCPServer {
	var out []*MCPServer
	for name, sc := range cfg.MCPServers {
		out = append(out, NewMCPServer(name, sc, o))
	}
	slices.SortFunc(out, func(a, b *MCPServer) int { return cmpString(a.name, b.name) })
	return out
}

// NewMCPServer returns the source of one server; Run starts it.
func NewMCPServer(name string, cfg ServerConfig, o MCPOptions) *MCPServer {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 500 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 30 * time.Second
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = mcp.DefaultMaxLineLength
	}
	return &MCPServer{
		name: name, cfg: cfg, o: o,
		log:      o.Logger.With("mcpServer", name),
		ready:    make(chan struct{}),
		refresh:  make(chan struct{}, 1),
		cause:    "not started yet",
		progress: map[string]chan agent.ToolResult{},
	}
}

// Name returns the server's key in the config.
func (s *MCPServer) Name() string { return s.name }

// Ready is closed after the first connection attempt.
func (s *MCPServer) Ready() <-chan struct{} { return s.ready }

// Run keeps a session to the server until ctx is cancelled, starting a new
// one (a new process for stdio) with backoff whenever it ends.
func (s *MCPServer) Run(ctx context.Context) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = s.o.MinBackoff, s.o.MaxBackoff
	first := true
	for {
		sess, err := s.connect(ctx)
		if err != nil {
			s.setDown(err.Error())
			if ctx.Err() == nil {
				s.log.Warn("MCP server did not start", "err", s.cfg.Redact(err.Error()))
			}
		}
		if first {
			close(s.ready)
			first = false
		}
		if sess != nil {
			s.log.Info("MCP server connected", "tools", len(s.toolNames()))
			start := time.Now()
			cause := s.serve(ctx, sess)
			s.setDown(cause)
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("MCP server session ended; restarting", "cause", s.cfg.Redact(cause))
			if time.Since(start) > time.Minute {
				b.Reset()
			}
		}
		t := time.NewTimer(b.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// serve follows the session until it ends or ctx is cancelled, refreshing
// the tool list when the server says it changed.
func (s *MCPServer) serve(ctx context.Context, sess *mcp.ClientSession) string {
	dead := make(chan error, 1)
	go func() { dead <- sess.Wait() }()
	for {
		select {
		case <-ctx.Done():
			_ = sess.Close()
			<-dead
			return "the worker is stopping"
		case err := <-dead:
			if err != nil {
				return "the session ended: " + err.Error()
			}
			return "the session ended"
		case <-s.refresh:
			lctx, cancel := context.WithTimeout(ctx, s.o.ConnectTimeout)
			err := s.listTools(lctx, sess)
			cancel()
			if err != nil {
				s.log.Warn("MCP server: listing tools after list_changed failed", "err", s.cfg.Redact(err.Error()))
				continue
			}
			tools := s.toolNames()
			s.log.Info("MCP server tool list changed", "tools", len(tools))
		}
	}
}

func (s *MCPServer) connect(ctx context.Context) (*mcp.ClientSession, error) {
	var t mcp.Transport
	if s.cfg.Stdio() {
		// Not CommandContext: the process lives as long as its session.
		cmd := exec.Command(s.cfg.Command, s.cfg.Args...)
		cmd.Env = s.stdioEnv()
		t = &CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second, MaxMessageBytes: s.o.MaxMessageBytes, Logger: s.log}
	} else {
		rt := &capTransport{next: headerTransport{s.cfg.Headers, http.DefaultTransport}, max: s.o.MaxMessageBytes, log: s.log}
		// Our cap comes first: the SDK's own (an event over it ends the
		// stream, and after retries the session) never fires.
		t = &mcp.StreamableClientTransport{Endpoint: s.cfg.URL, HTTPClient: &http.Client{Transport: rt},
			MaxEventSize: withSlack(s.o.MaxMessageBytes)}
	}
	if s.o.WrapTransport != nil {
		t = s.o.WrapTransport(s.name, t)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "agentfleet-worker", Version: s.o.Version}, &mcp.ClientOptions{
		// No roots, no sampling, no elicitation: the worker offers none.
		Capabilities:                &mcp.ClientCapabilities{},
		ProgressNotificationHandler: s.onProgress,
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case s.refresh <- struct{}{}:
			default:
			}
		},
	})
	cctx, cancel := context.WithTimeout(ctx, s.o.ConnectTimeout)
	defer cancel()
	sess, err := client.Connect(cctx, t, nil)
	if err != nil {
		return nil, err
	}
	if err := s.listTools(cctx, sess); err != nil {
		_ = sess.Close()
		return nil, fmt.Errorf("listing its tools: %w", err)
	}
	s.mu.Lock()
	s.session, s.cause = sess, ""
	s.mu.Unlock()
	return sess, nil
}

// stdioEnv is all a stdio server gets: PATH, HOME and what its config
// names; never the worker's own environment (API keys, NATS passwords).
func (s *MCPServer) stdioEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME"} {
		if _, set := s.cfg.Env[k]; !set {
			if v, ok := os.LookupEnv(k); ok {
				env = append(env, k+"="+v)
			}
		}
	}
	for k, v := range s.cfg.Env {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	return env
}

// listTools lists the session's tools, within the bounds (bounds.go), and
// keeps them.
func (s *MCPServer) listTools(ctx context.Context, sess *mcp.ClientSession) error {
	var listed []*mcp.Tool
	cut := false
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			return err
		}
		if len(listed) == 4*MaxSourceTools {
			cut = true // past the bound either way; do not page on forever
			break
		}
		listed = append(listed, t)
	}
	slices.SortFunc(listed, func(a, b *mcp.Tool) int { return cmpString(a.Name, b.Name) })
	s.mu.Lock()
	logged := s.logged
	s.mu.Unlock()
	b := newToolBounds(s.log, "MCP tool", logged)
	var tools []*agent.Tool
	for _, t := range listed {
		full := s.name + Separator + t.Name
		if !ValidToolName(full) {
			b.refuse(full, "its name is not ^[A-Za-z0-9_-]{1,64}$")
			continue
		}
		schema, err := json.Marshal(t.InputSchema)
		if err != nil || t.InputSchema == nil {
			schema = []byte(`{"type":"object"}`)
		}
		if !b.schema(full, len(schema)) || !b.admit(full) {
			continue
		}
		tools = append(tools, &agent.Tool{
			Name: full, Label: clip(t.Title, 256), Description: b.description(full, t.Description), Parameters: schema,
			Execute: s.execute(t.Name, full),
		})
	}
	b.done("mcp:" + s.name)
	s.mu.Lock()
	s.tools, s.refused, s.logged, s.over = tools, b.refused, b.now, cut || b.over > 0
	s.mu.Unlock()
	return nil
}

func (s *MCPServer) execute(remote, full string) agent.ExecuteFunc {
	return func(ctx context.Context, _ string, args map[string]any, update agent.UpdateFunc) (agent.ToolResult, error) {
		s.mu.Lock()
		sess, cause := s.session, s.cause
		s.mu.Unlock()
		if sess == nil {
			return agent.ToolResult{}, s.unavailable(cause)
		}
		if args == nil {
			args = map[string]any{} // a typed nil would go out as null
		}
		params := &mcp.CallToolParams{Name: remote, Arguments: args}
		if update != nil {
			token, stop := s.followProgress(update)
			defer stop()
			params.SetProgressToken(token)
		}
		res, err := sess.CallTool(ctx, params)
		if err != nil {
			if ctx.Err() != nil {
				return agent.ToolResult{}, ctx.Err()
			}
			var werr *jsonrpc.Error
			if errors.As(err, &werr) {
				return agent.ToolResult{}, fmt.Errorf("%s failed: %s", full, s.cfg.Redact(werr.Message))
			}
			return agent.ToolResult{}, s.unavailable(err.Error())
		}
		return mcpResult(res)
	}
}

// followProgress passes a call's progress notifications to update (as
// tool_execution_update) from a goroutine of its own: the session's reader
// never waits for a run's event publishing.
func (s *MCPServer) followProgress(update agent.UpdateFunc) (token string, stop func()) {
	ch := make(chan agent.ToolResult, 16)
	s.progMu.Lock()
	s.nextToken++
	token = fmt.Sprintf("%s-%d", s.name, s.nextToken)
	s.progress[token] = ch
	s.progMu.Unlock()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case u := <-ch:
				update(u)
			case <-done:
				return
			}
		}
	})
	return token, func() {
		s.progMu.Lock()
		delete(s.progress, token)
		s.progMu.Unlock()
		close(done)
		wg.Wait()
	}
}

func (s *MCPServer) onProgress(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	p := req.Params
	token, _ := p.ProgressToken.(string)
	text := fmt.Sprintf("progress %g", p.Progress)
	if p.Total > 0 {
		text += fmt.Sprintf("/%g", p.Total)
	}
	if p.Message != "" {
		text += ": " + p.Message
	}
	u := agent.ToolResult{Content: []agent.Content{agent.Text(text)},
		Details: map[string]any{"progress": p.Progress, "total": p.Total}}
	s.progMu.Lock()
	defer s.progMu.Unlock()
	if ch := s.progress[token]; ch != nil {
		select {
		case ch <- u:
		default: // a run that cannot keep up misses progress, not results
		}
	}
}

func (s *MCPServer) unavailable(cause string) error {
	return fmt.Errorf("MCP server %s is unavailable: %s", s.name, s.cfg.Redact(cause))
}

func (s *MCPServer) setDown(cause string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session != nil {
		_ = s.session.Close()
	}
	s.session, s.cause = nil, s.cfg.Redact(cause)
}

func (s *MCPServer) toolNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, len(s.tools))
	for i, t := range s.tools {
		names[i] = t.Name
	}
	return names
}

// Resolve returns the server's tools now (none while it is down).
func (s *MCPServer) Resolve(_ context.Context, namespace string) ([]*agent.Tool, bool) {
	if namespace != s.name {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session == nil {
		return nil, true
	}
	return slices.Clone(s.tools), true
}

// Missing returns a tool whose calls fail: the server is down, or does
// not serve that tool.
func (s *MCPServer) Missing(name string) *agent.Tool {
	_, remote, _ := SplitName(name)
	s.mu.Lock()
	why, refused := reason(s.refused, name)
	if !refused && s.over {
		// Not among the tools listed: one past the bound.
		why, refused = fmt.Sprintf("its source has more than %d tools", MaxSourceTools), true
	}
	s.mu.Unlock()
	if refused {
		return failingTool(name, "", func() error { return fmt.Errorf("tool %s is refused: %s", clip(name, 80), why) })
	}
	// While the server is up the call goes to it anyway: it is the judge
	// of its tools (its list may have changed), and it says what is wrong.
	return &agent.Tool{Name: name, Parameters: []byte(`{"type":"object"}`), Execute: s.execute(remote, name)}
}

// Status reports the server and its tools.
func (s *MCPServer) Status() ([]SourceStatus, []ToolStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	src := "mcp:" + s.name
	up := s.session != nil
	var tools []ToolStatus
	if up {
		for _, t := range s.tools {
			tools = append(tools, ToolStatus{Name: t.Name, Source: src, Description: t.Description, Available: true})
		}
	}
	for _, n := range refusedNames(s.refused) {
		tools = append(tools, ToolStatus{Name: n, Source: src, Available: false})
	}
	return []SourceStatus{{Name: src, Up: up}}, tools
}

// headerTransport adds a server's configured headers to every request.
type headerTransport struct {
	headers map[string]string
	next    http.RoundTripper
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(h.headers) > 0 {
		r = r.Clone(r.Context())
		for k, v := range h.headers {
			r.Header.Set(k, v)
		}
	}
	return h.next.RoundTrip(r)
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
