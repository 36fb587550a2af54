// Package natsembed runs a nats-server with JetStream inside the current
// process: the worker's default when no --nats URL is given, tests, and
// programs that embed a fleet. Clients never need it; they import bus.
package natsembed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configure an embedded nats-server with JetStream.
type Options struct {
	// Host and Port to listen on. Port 0 means 4222 (the NATS default);
	// -1 picks a free port (tests).
	Host string // default 127.0.0.1
	Port int
	// StoreDir is where JetStream keeps its data ("jetstream/" under it).
	// Required: an empty store dir would be shared with other processes.
	StoreDir string
	// MaxMemory and MaxStore bound JetStream memory and file storage.
	// Defaults: 256 MiB and 10 GiB.
	MaxMemory int64
	MaxStore  int64
	// MaxPayload is the largest message; default 1 MiB (the NATS default).
	MaxPayload int32
	// Logger receives the server's log at notice level and above; nil
	// keeps the server quiet.
	Logger *slog.Logger
	// Name is the server name; default "agentfleet-embedded".
	Name string
	// Sync is how JetStream syncs its files to disk: "always" (fsync after
	// every write: an acknowledged message survives a power cut) or an
	// interval such as "2m" (the nats-server default: a power cut can lose
	// the last interval's acknowledged writes). Empty means "2m".
	Sync string
	// StreamMaxBufferedMsgs bounds each stream's queue of messages
	// received and not yet stored (nats-server's max_buffered_msgs;
	// default 0: the server's, 100,000 in the version go.mod requires);
	// past it the server
	// drops messages and answers 429, as an overloaded server does.
	StreamMaxBufferedMsgs int
}

// DefaultSync is the sync setting of an embedded server that names none.
const DefaultSync = "2m"

// ParseSync checks a Sync setting: "always" or a positive duration.
func ParseSync(v string) (interval time.Duration, always bool, err error) {
	if v == "" {
		v = DefaultSync
	}
	if v == "always" {
		return 0, true, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, false, fmt.Errorf("sync %q must be \"always\" or a positive duration such as 2m or 10s", v)
	}
	return d, false, nil
}

// Server is an embedded nats-server.
type Server struct {
	s *server.Server
}

// ErrPortBusy is returned by Start when the port is taken.
var ErrPortBusy = errors.New("port is already in use")

// Start starts an embedded nats-server with JetStream and waits until
// it accepts connections.
func Start(o Options) (*Server, error) { return StartContext(context.Background(), o) }

// StartContext is Start that gives up when ctx ends (a stop signal while
// a large store recovers): the server then shuts down in the background
// once its start returns.
func StartContext(ctx context.Context, o Options) (*Server, error) {
	if o.StoreDir == "" {
		return nil, errors.New("embedded NATS: a JetStream store directory is required")
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.Port == 0 {
		o.Port = 4222
	}
	if o.MaxMemory == 0 {
		o.MaxMemory = 256 << 20
	}
	if o.MaxStore == 0 {
		o.MaxStore = 10 << 30
	}
	if o.MaxPayload == 0 {
		o.MaxPayload = 1 << 20
	}
	if o.Name == "" {
		o.Name = "agentfleet-embedded"
	}
	syncEvery, syncAlways, err := ParseSync(o.Sync)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	if o.Port > 0 {
		addr := net.JoinHostPort(o.Host, strconv.Itoa(o.Port))
		if err := portFree(addr); err != nil {
			if errors.Is(err, ErrPortBusy) {
				return nil, fmt.Errorf("%w; is another worker or nats-server running? connect to it with --nats nats://%s", err, addr)
			}
			return nil, err
		}
	}
	opts := &server.Options{
		ServerName:             o.Name,
		Host:                   o.Host,
		Port:                   o.Port,
		JetStream:              true,
		StoreDir:               o.StoreDir,
		JetStreamMaxMemory:     o.MaxMemory,
		JetStreamMaxStore:      o.MaxStore,
		MaxPayload:             o.MaxPayload,
		NoSigs:                 true,
		NoLog:                  o.Logger == nil,
		DisableJetStreamBanner: true,
		SyncInterval:           syncEvery,
		SyncAlways:             syncAlways,
		StreamMaxBufferedMsgs:  o.StreamMaxBufferedMsgs,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	if err := listen(ctx, s, o, startSlow); err != nil {
		return nil, err
	}
	return &Server{s: s}, nil
}

const startSlow = 10 * time.Second

// listen starts s and waits until its Start returns: with the client
// listener bound, or after a failure (JetStream could not start in the
// store, or the bind failed), so a port taken after the check above is
// known at once. It never shuts a server down while Start runs: streams
// that JetStream recovers after a Shutdown are never stopped (their file
// stores' goroutines outlive the server), and recovering a large store
// has no deadline. After slow it says why it still waits; when ctx ends
// it returns, and the server shuts down once Start returns.
func listen(ctx context.Context, s *server.Server, o Options, slow time.Duration) error {
	log := &serverLog{}
	if o.Logger != nil {
		log.l = o.Logger.With("component", "nats-server")
	}
	s.SetLoggerV2(log, false, false, false)
	started := make(chan struct{})
	go func() {
		s.Start()
		close(started)
	}()
	timer := time.NewTimer(slow)
	defer timer.Stop()
	for waiting := true; waiting; {
		select {
		case <-started:
			waiting = false
		case <-timer.C:
			s.Warnf("Still starting after %v: recovering JetStream's store in %s", slow, o.StoreDir)
		case <-ctx.Done():
			go func() {
				<-started
				s.Shutdown()
				s.WaitForShutdown()
			}()
			return fmt.Errorf("embedded NATS: start abandoned: %w", ctx.Err())
		}
	}
	if s.Addr() != nil {
		return nil
	}
	s.Shutdown()
	s.WaitForShutdown()
	why := log.fatal()
	if o.Port > 0 && (why == "" || strings.HasPrefix(why, "Error listening on port")) {
		if err := portFree(net.JoinHostPort(o.Host, strconv.Itoa(o.Port))); errors.Is(err, ErrPortBusy) {
			return err // taken since the check above
		}
	}
	if why != "" {
		return fmt.Errorf("embedded NATS did not start: %s", why)
	}
	return fmt.Errorf("embedded NATS did not start on %s:%d", o.Host, o.Port)
}

// portFree tells whether addr can be listened on; taken by another
// process, the error is ErrPortBusy.
func portFree(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("embedded NATS cannot listen on %s: %w", addr, ErrPortBusy)
	}
	if err != nil {
		return fmt.Errorf("embedded NATS cannot listen on %s: %w", addr, err)
	}
	return ln.Close()
}

// URL is the client URL of the server.
func (s *Server) URL() string { return s.s.ClientURL() }

// NATS returns the underlying server (also an in-process connection
// provider for bus.ConnectOptions.InProcess).
func (s *Server) NATS() *server.Server { return s.s }

// Shutdown stops the server and waits until it is down. It first lets
// the JetStream API requests already received finish (up to settleAPIMax):
// nats-server (the version go.mod requires) tears JetStream down before it
// stops serving its API queue, and a stream created in between is never
// stopped (its file store's goroutines outlive the server). The wait is
// best effort: a request read by a connection's goroutine that is not
// scheduled for longer than the quiet spell is counted too late, and
// connections may still be accepted and send during it; close clients
// first.
func (s *Server) Shutdown() {
	settleAPI(s.apiLoad, settleAPIMax, s.s.Warnf)
	s.s.Shutdown()
	s.s.WaitForShutdown()
}

const settleAPIMax = 10 * time.Second

// apiLoad is what settleAPI reads of the server.
type apiLoad struct {
	inflight uint64 // API requests received and not yet served
	done     bool   // no JetStream: nothing to wait for
}

func (s *Server) apiLoad() apiLoad {
	info, err := s.s.Jsz(&server.JSzOptions{})
	if err != nil || info.Disabled {
		return apiLoad{done: true}
	}
	return apiLoad{inflight: info.API.Inflight}
}

// settleAPI waits until no JetStream API request has been in flight for a
// quiet spell (settleQuiet and settlePolls polls in a row finding none),
// or max passed (then it warns). The spell covers a request read from a
// socket right after a zero: the count only shows it once the reading
// goroutine handed it to the API queue. No count of clients can stand in
// for it: nats-server removes a client whose write failed while its read
// goroutine may still be parsing what it read.
func settleAPI(load func() apiLoad, max time.Duration, warnf func(string, ...any)) {
	deadline := time.Now().Add(max)
	var quietSince time.Time // of the first of quietPolls
	quietPolls := 0
	for {
		l := load()
		switch {
		case l.done:
			return
		case l.inflight != 0:
			quietPolls = 0
		case quietPolls == 0:
			quietSince, quietPolls = time.Now(), 1
		default:
			// Both: wall time alone passes while this goroutine is not
			// scheduled, and polls alone can be too quick.
			if quietPolls++; quietPolls >= settlePolls && time.Since(quietSince) >= settleQuiet {
				return
			}
		}
		if time.Now().After(deadline) {
			warnf("Shutting down while JetStream API requests keep coming (waited %v): a stream created now may outlive the server", max)
			return
		}
		time.Sleep(5 * time.Millisecond) // polls the queue's count
	}
}

const (
	settleQuiet = 20 * time.Millisecond
	settlePolls = 4
)

// serverLog passes the server's log to l (nil: nowhere) and keeps its
// first fatal line: why a start failed.
type serverLog struct {
	l  *slog.Logger
	mu sync.Mutex
	f  string
}

func (g *serverLog) fatal() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.f
}

func (g *serverLog) Fatalf(f string, v ...any) {
	msg := fmt.Sprintf(f, v...)
	g.mu.Lock()
	if g.f == "" {
		g.f = msg
	}
	g.mu.Unlock()
	if g.l != nil {
		g.l.Error(msg)
	}
}

// logf formats only what is logged.
func (g *serverLog) logf(level slog.Level, f string, v []any) {
	if g.l != nil && g.l.Enabled(context.Background(), level) {
		g.l.Log(context.Background(), level, fmt.Sprintf(f, v...))
	}
}

func (g *serverLog) Noticef(f string, v ...any) { g.logf(slog.LevelInfo, f, v) }
func (g *serverLog) Warnf(f string, v ...any)   { g.logf(slog.LevelWarn, f, v) }
func (g *serverLog) Errorf(f string, v ...any)  { g.logf(slog.LevelError, f, v) }
func (g *serverLog) Debugf(string, ...any)      {}
func (g *serverLog) Tracef(string, ...any)      {}
