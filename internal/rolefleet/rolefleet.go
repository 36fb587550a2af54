// Package rolefleet runs an in-process nats-server loaded with an accounts
// file (deploy/nats/accounts.conf) and connects to it as the file's roles:
// the harness of the deploy tests and of the adversarial suite, which must
// send every message as the role that would send it.
package rolefleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/logbuf"
)

// passwordEnv names, per user of accounts.conf, the environment variable
// the file reads its password from.
var passwordEnv = map[string]string{
	"worker": "AGENTS_WORKER_PASSWORD", "submitter": "AGENTS_SUBMITTER_PASSWORD",
	"observer": "AGENTS_OBSERVER_PASSWORD", "toolservice": "AGENTS_TOOLSERVICE_PASSWORD",
	"console": "AGENTS_CONSOLE_PASSWORD", "approver": "AGENTS_APPROVER_PASSWORD",
	"toolcaller":       "AGENTS_TOOLCALLER_PASSWORD",
	"toolservice-text": "AGENTS_TOOLSERVICE_TEXT_PASSWORD", "toolservice-calc": "AGENTS_TOOLSERVICE_CALC_PASSWORD",
	"other": "OTHER_PASSWORD", "sys": "SYS_PASSWORD",
	// Not in accounts.conf: a second submitter a test's copy of the file
	// may add (adversarial: two submitters limited to different queues).
	"submitter-b": "AGENTS_SUBMITTER_B_PASSWORD",
}

// Server is a running nats-server with an accounts file.
type Server struct {
	t testing.TB
	// URL is the server's client URL (loopback, a free port).
	URL string
	// Passwords holds each user's password, random per server.
	Passwords map[string]string
	// Log is the server's log: permission violations are logged there
	// with the user.
	Log *Log
}

// Start runs a server with the accounts file conf (a path). The file reads
// its passwords from the environment ($AGENTS_WORKER_PASSWORD, ...); the
// server reads a copy that defines them first, as variables of the file,
// so that the environment is left alone and tests may run in parallel.
func Start(t testing.TB, conf string) *Server {
	t.Helper()
	text, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	pw := map[string]string{}
	var defs strings.Builder
	for user, env := range passwordEnv {
		if !strings.Contains(string(text), "$"+env) {
			continue // the server refuses a variable the file does not use
		}
		var b [12]byte
		_, _ = rand.Read(b[:])
		pw[user] = hex.EncodeToString(b[:])
		fmt.Fprintf(&defs, "%s: %q\n", env, pw[user])
	}
	withPasswords := filepath.Join(t.TempDir(), filepath.Base(conf))
	if err := os.WriteFile(withPasswords, append([]byte(defs.String()), text...), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(withPasswords)
	if err != nil {
		t.Fatalf("%s: %v", conf, err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = t.TempDir()
	opts.JetStreamMaxMemory, opts.JetStreamMaxStore = 64<<20, 1<<30
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	log := &Log{}
	s.SetLoggerV2(serverLogger{log}, false, false, false)
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatalf("nats-server with %s did not start", conf)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return &Server{t: t, URL: s.ClientURL(), Passwords: pw, Log: log}
}

// Client is a bus client connected as one role, with its own log (the
// server's refusals reach a client asynchronously; bus logs them).
type Client struct {
	*bus.Client
	Role string
	Log  *Log
}

// Connect connects as user with its password; closed at the test's end.
func (s *Server) Connect(t testing.TB, user string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lb := &Log{}
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: s.URL, User: user, Password: s.Passwords[user], Name: user,
		Logger: slog.New(slog.NewTextHandler(lb, nil))})
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(c.Close)
	return &Client{Client: c, Role: user, Log: lb}
}

// NATS connects as user with the plain nats.go client: what an attacker
// holding that role's credentials would use. Its async errors (permission
// violations) go to the returned log.
func (s *Server) NATS(t testing.TB, user string) (*nats.Conn, *Log) {
	t.Helper()
	lb := &Log{}
	nc, err := nats.Connect(s.URL, nats.UserInfo(user, s.Passwords[user]), nats.Name(user),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { fmt.Fprintf(lb, "async error: %v\n", err) }))
	if err != nil {
		t.Fatalf("nats connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc, lb
}

// Log keeps log lines written from many goroutines.
type Log struct{ logbuf.Buffer }

// Lines returns the lines that contain every one of parts.
func (l *Log) Lines(parts ...string) []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		ok := line != ""
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// Violation waits, up to 1 s, for a logged permissions violation on
// subject (by user, when user is set: the server logs the user as
// "AGENTS/user:NAME"); a client's log names no user.
func (l *Log) Violation(user, subject string) bool {
	deadline := time.Now().Add(time.Second)
	for {
		parts := []string{"Violation", subject}
		if user != "" {
			parts = append(parts, `user:`+user+`"`)
		}
		if len(l.Lines(parts...)) > 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type serverLogger struct{ l *Log }

func (s serverLogger) logf(level, format string, v ...any) {
	fmt.Fprintf(s.l, level+" "+format+"\n", v...)
}
func (s serverLogger) Noticef(format string, v ...any) { s.logf("[INF]", format, v...) }
func (s serverLogger) Warnf(format string, v ...any)   { s.logf("[WRN]", format, v...) }
func (s serverLogger) Fatalf(format string, v ...any)  { s.logf("[FTL]", format, v...) }
func (s serverLogger) Errorf(format string, v ...any)  { s.logf("[ERR]", format, v...) }
func (s serverLogger) Debugf(format string, v ...any)  { s.logf("[DBG]", format, v...) }
func (s serverLogger) Tracef(format string, v ...any)  { s.logf("[TRC]", format, v...) }
