// Command console serves agentfleet's web console: the runs of the fleet,
// each run's conversation as it streams, the queues and workers, and (with
// --allow-control) forms to submit, steer, follow up and abort runs. The
// browser never talks to NATS: the console reads the fleet with bus and
// streams to the page with Server-Sent Events. See console --help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/tracing/otlp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil)
	stop()
	os.Exit(code)
}

const usageText = `console serves agentfleet's web console.

Usage: console [flags]

It listens on --addr (default 127.0.0.1:8080) and connects to NATS with the
same flags and environment as the worker and submit. It is read-only unless
started with --allow-control. Binding to an address other than loopback
needs --basic-auth-file or --auth-token-file (or --insecure). It answers
only requests for localhost, a loopback address, --addr or a --public-host
name, from its own pages (DNS rebinding and other sites are refused).

Flags (environment in brackets):
`

// options are the console's flags.
type options struct {
	conn          bus.ConnectOptions
	addr          string
	allowControl  bool
	basicAuthFile string
	authTokenFile string
	insecure      bool
	publicHosts   listFlag
	maxStreams    int
	maxPerClient  int
	approverName  string
	logFormat     string
	logLevel      string
	otel          bool
}

func envOr(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

func envBool(getenv func(string) string, name string) bool {
	b, _ := strconv.ParseBool(getenv(name))
	return b
}

// envInt is a whole number from the environment; a bad one is kept in
// errs, reported after parsing.
func envInt(getenv func(string) string, name string, def int, errs *[]error) int {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s=%q is not a whole number", name, clip(v)))
		return def
	}
	return n
}

// listFlag is a flag that may be repeated, each value comma-separated.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// parseFlags parses the command line. Secrets get no default from the
// environment here (they are filled after parsing), so --help never shows
// them.
func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("console", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}
	c := &o.conn
	fs.StringVar(&c.URL, "nats", envOr(getenv, "NATS_URL", bus.DefaultURL), "NATS server URL(s), comma-separated [NATS_URL]")
	fs.StringVar(&c.User, "user", envOr(getenv, "NATS_USER", ""), "NATS user [NATS_USER]")
	fs.StringVar(&c.Password, "password", "", "NATS password (prefer the environment: flags show in ps) [NATS_PASSWORD]")
	fs.StringVar(&c.Token, "token", "", "NATS auth token (prefer the environment) [NATS_TOKEN]")
	fs.StringVar(&c.NKeySeedFile, "nkey", envOr(getenv, "NATS_NKEY", ""), "file with an NKey user seed [NATS_NKEY]")
	fs.StringVar(&c.CredsFile, "creds", envOr(getenv, "NATS_CREDS", ""), "NATS credentials (.creds) file [NATS_CREDS]")
	fs.StringVar(&c.TLSCA, "tlsca", envOr(getenv, "NATS_CA", ""), "CA certificate file to verify the server [NATS_CA]")
	fs.StringVar(&c.TLSCert, "tlscert", envOr(getenv, "NATS_CERT", ""), "client certificate file (mutual TLS) [NATS_CERT]")
	fs.StringVar(&c.TLSKey, "tlskey", envOr(getenv, "NATS_KEY", ""), "client key file (mutual TLS) [NATS_KEY]")
	fs.StringVar(&c.Prefix, "prefix", envOr(getenv, "AGENTS_PREFIX", bus.DefaultPrefix), "subject prefix [AGENTS_PREFIX]")
	fs.StringVar(&o.addr, "addr", envOr(getenv, "AGENTS_CONSOLE_ADDR", "127.0.0.1:8080"), "HTTP address to listen on [AGENTS_CONSOLE_ADDR]")
	fs.BoolVar(&o.allowControl, "allow-control", envBool(getenv, "AGENTS_CONSOLE_ALLOW_CONTROL"), "allow submitting runs, steering, follow-ups, aborts and answering tool approvals from the page [AGENTS_CONSOLE_ALLOW_CONTROL]")
	fs.StringVar(&o.basicAuthFile, "basic-auth-file", envOr(getenv, "AGENTS_CONSOLE_BASIC_AUTH_FILE", ""), "htpasswd file (bcrypt) of the console's users [AGENTS_CONSOLE_BASIC_AUTH_FILE]")
	fs.StringVar(&o.authTokenFile, "auth-token-file", envOr(getenv, "AGENTS_CONSOLE_AUTH_TOKEN_FILE", ""), "file holding a bearer token the console requires [AGENTS_CONSOLE_AUTH_TOKEN_FILE]")
	fs.BoolVar(&o.insecure, "insecure", false, "allow a non-loopback --addr without authentication")
	fs.Var(&o.publicHosts, "public-host", "a name the console is also served as (host, host:port or https://host[:port]: https marks cookies Secure); requests for any other name than localhost, a loopback address or --addr are refused (DNS rebinding), as are pages of other origins; repeatable or comma-separated [AGENTS_CONSOLE_PUBLIC_HOST]")
	var envErrs []error
	fs.IntVar(&o.maxStreams, "max-streams", envInt(getenv, "AGENTS_CONSOLE_MAX_STREAMS", defaultMaxStreams, &envErrs), "open event streams at most (each is a consumer on the NATS server); past it a 503; 0: no bound [AGENTS_CONSOLE_MAX_STREAMS]")
	fs.IntVar(&o.maxPerClient, "max-streams-per-client", envInt(getenv, "AGENTS_CONSOLE_MAX_STREAMS_PER_CLIENT", defaultMaxStreamsPerClient, &envErrs), "open event streams of one client at most (the basic-auth user, else the client's address, an IPv6 address's /64); past it a 503; 0: no bound [AGENTS_CONSOLE_MAX_STREAMS_PER_CLIENT]")
	fs.StringVar(&o.approverName, "approver-name", envOr(getenv, "AGENTS_CONSOLE_APPROVER_NAME", ""), "the \"by\" of approvals answered from the page when no basic-auth user answers (with basic auth, the user); default \"console\" [AGENTS_CONSOLE_APPROVER_NAME]")
	fs.BoolVar(&o.otel, "otel", envBool(getenv, "AGENTS_OTEL"), "export OpenTelemetry spans of submits and controls over OTLP/HTTP as the OTEL_* variables say; the messages carry their context to the workers [AGENTS_OTEL]")
	fs.StringVar(&o.logFormat, "log-format", envOr(getenv, "AGENTS_LOG_FORMAT", "text"), "log format: text or json [AGENTS_LOG_FORMAT]")
	fs.StringVar(&o.logLevel, "log-level", envOr(getenv, "AGENTS_LOG_LEVEL", "info"), "log level: debug, info, warn, error [AGENTS_LOG_LEVEL]")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := errors.Join(envErrs...); err != nil {
		return nil, err
	}
	if len(o.publicHosts) == 0 {
		_ = o.publicHosts.Set(getenv("AGENTS_CONSOLE_PUBLIC_HOST"))
	}
	if _, err := parsePublicHosts(o.publicHosts); err != nil {
		return nil, err
	}
	if o.maxStreams < 0 || o.maxPerClient < 0 {
		return nil, errors.New("--max-streams and --max-streams-per-client take 0 (no bound) or more")
	}
	if c.Password == "" {
		c.Password = getenv("NATS_PASSWORD")
	}
	if c.Token == "" {
		c.Token = getenv("NATS_TOKEN")
	}
	if o.basicAuthFile != "" && o.authTokenFile != "" {
		return nil, errors.New("--basic-auth-file and --auth-token-file exclude each other: pick one")
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		return nil, fmt.Errorf("--log-format %q: use text or json", o.logFormat)
	}
	return o, nil
}

func newLogger(o *options, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	ho := &slog.HandlerOptions{Level: level}
	if o.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	}
	return slog.New(slog.NewTextHandler(w, ho)), nil
}

// isLoopback reports whether a listen address only accepts local clients.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// run is main without the process. ready, when not nil, receives the
// listening address once the console serves.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready chan<- string) int {
	o, err := parseFlags(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "console: %v\n", err)
		return 2
	}
	log, err := newLogger(o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "console: %v\n", err)
		return 2
	}
	auth, err := loadAuth(o.basicAuthFile, o.authTokenFile)
	if err != nil {
		fmt.Fprintf(stderr, "console: %v\n", err)
		return 2
	}
	if auth == nil && !isLoopback(o.addr) && !o.insecure {
		fmt.Fprintf(stderr, "console: refusing to listen on %s without authentication: anyone who can reach it could read every run.\n"+
			"Use --basic-auth-file or --auth-token-file, listen on 127.0.0.1, or pass --insecure.\n", o.addr)
		return 2
	}
	o.conn.Name = "agentfleet-console"
	o.conn.Logger = log
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cl, err := bus.Connect(cctx, o.conn)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "console: %v\n", err)
		return 4
	}
	defer cl.Close()
	tr, err := otlp.New(ctx, o.otel, "agentfleet-console", getenv)
	if err != nil {
		fmt.Fprintf(stderr, "console: tracing: %v\n", err)
		return 2
	}
	if tr.Warning != "" {
		log.Warn("OpenTelemetry: " + tr.Warning)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tr.Shutdown(sctx)
	}()
	public, _ := parsePublicHosts(o.publicHosts) // checked by parseFlags
	srv, err := newServer(serverConfig{Client: cl, Logger: log, AllowControl: o.allowControl, Auth: auth, TracerProvider: tr.Provider,
		ListenAddr: o.addr, PublicHosts: public, MaxStreams: noBound(o.maxStreams), MaxStreamsPerClient: noBound(o.maxPerClient), ApproverName: o.approverName})
	if err != nil {
		fmt.Fprintf(stderr, "console: %v\n", err)
		return 1
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		fmt.Fprintf(stderr, "console: %v\n", err)
		return 1
	}
	if err := serve(ctx, srv, ln, log, ready); err != nil {
		fmt.Fprintf(stderr, "console: %v\n", err)
		return 1
	}
	return 0
}

// serve runs the console on ln until ctx is done, then shuts it down.
func serve(ctx context.Context, srv *server, ln net.Listener, log *slog.Logger, ready chan<- string) error {
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		srv.background(wctx)
	}()
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	// Streams end with the server's base context.
	sctx, stopStreams := context.WithCancel(context.Background())
	hs.BaseContext = func(net.Listener) context.Context { return sctx }
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("console started", "addr", "http://"+ln.Addr().String(), "allowControl", srv.allowControl,
		"auth", srv.auth.kind(), "publicHosts", srv.hosts.names(), "maxStreams", srv.streams.total, "maxStreamsPerClient", srv.streams.perClient, "nats", bus.RedactURL(srv.client.Conn().ConnectedUrlRedacted()))
	if ready != nil {
		ready <- ln.Addr().String()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	stopStreams()
	shctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = hs.Shutdown(shctx)
	cancel()
	stopWatch()
	<-watched
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// background keeps the record watch and the fleet history's sampler
// going until ctx is done.
func (s *server) background(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { s.records.run(ctx) })
	wg.Go(func() { s.samples.run(ctx) })
	wg.Wait()
}

// noBound maps a flag's 0 (no bound) to serverConfig's -1.
func noBound(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// strip trims a file's content for a secret.
func strip(b []byte) string { return strings.TrimSpace(string(b)) }
