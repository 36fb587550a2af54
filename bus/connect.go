package bus

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultURL is where clients connect when nothing else is configured.
const DefaultURL = "nats://127.0.0.1:4222"

// Errors of the client operations.
var (
	ErrRunNotFound = errors.New("run not found")
	// ErrEventsGone ends a Follow of a run whose record says it finished
	// but none of whose events is stored any more (past the events
	// stream's max age or byte limit): there is nothing to replay.
	ErrEventsGone  = errors.New("its events are no longer stored")
	ErrRunFinished = errors.New("run has finished")
)

// ConnectOptions say how to reach NATS. Empty fields are filled from the
// environment by FromEnv (NATS_URL, NATS_USER, NATS_PASSWORD, NATS_TOKEN,
// NATS_NKEY, NATS_CREDS, NATS_CA, NATS_CERT, NATS_KEY, as the nats CLI).
type ConnectOptions struct {
	URL      string // comma-separated server URLs
	Prefix   string // subject prefix; "" is "agents"
	Name     string // connection name shown in server monitoring
	User     string
	Password string
	Token    string
	// NKeySeedFile is a file holding an NKey user seed (SU...).
	NKeySeedFile string
	// CredsFile is a JWT + seed .creds file.
	CredsFile string
	// TLS: CA to trust, and a client certificate and key (mutual TLS).
	TLSCA   string
	TLSCert string
	TLSKey  string
	// InProcess connects to an embedded server without a socket.
	InProcess nats.InProcessConnProvider
	Timeout   time.Duration // connect timeout; default 5s
	Logger    *slog.Logger
	// NATSOptions are appended to the options bus builds.
	NATSOptions []nats.Option
	// JetStreamOptions configure the client's JetStream context.
	JetStreamOptions []jetstream.JetStreamOpt
}

// FromEnv fills empty fields from the environment.
func (o *ConnectOptions) FromEnv() {
	set := func(p *string, env string) {
		if *p == "" {
			*p = os.Getenv(env)
		}
	}
	set(&o.URL, "NATS_URL")
	set(&o.User, "NATS_USER")
	set(&o.Password, "NATS_PASSWORD")
	set(&o.Token, "NATS_TOKEN")
	set(&o.NKeySeedFile, "NATS_NKEY")
	set(&o.CredsFile, "NATS_CREDS")
	set(&o.TLSCA, "NATS_CA")
	set(&o.TLSCert, "NATS_CERT")
	set(&o.TLSKey, "NATS_KEY")
}

// RedactURL hides passwords and tokens in server URLs, for logs.
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil || u.User == nil {
			continue
		}
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "REDACTED")
		} else {
			u.User = url.User("REDACTED")
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

func (o *ConnectOptions) natsOptions() ([]nats.Option, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	opts := []nats.Option{
		nats.Timeout(timeout),
		// Reconnect forever, with a capped exponential backoff plus
		// jitter, so a fleet does not stampede a restarting server.
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(reconnectDelay),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "url", RedactURL(nc.ConnectedUrlRedacted()))
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Error("nats async error", "subject", subj, "err", err)
		}),
	}
	if o.Name != "" {
		opts = append(opts, nats.Name(o.Name))
	}
	if o.User != "" || o.Password != "" {
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	}
	if o.Token != "" {
		opts = append(opts, nats.Token(o.Token))
	}
	if o.NKeySeedFile != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nkey seed file: %w", err)
		}
		opts = append(opts, opt)
	}
	if o.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	if o.TLSCert != "" || o.TLSKey != "" {
		if o.TLSCert == "" || o.TLSKey == "" {
			return nil, errors.New("TLS client certificate needs both a certificate and a key file")
		}
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	if o.InProcess != nil {
		opts = append(opts, nats.InProcessServer(o.InProcess))
	}
	return append(opts, o.NATSOptions...), nil
}

// reconnectDelay is the wait before reconnect attempt n (after every
// server was tried once): 100ms doubling up to 5s, plus up to 25% jitter.
func reconnectDelay(attempts int) time.Duration {
	d := 100 * time.Millisecond
	for i := 1; i < attempts && d < 5*time.Second; i++ {
		d *= 2
	}
	d = min(d, 5*time.Second)
	var b [1]byte
	_, _ = rand.Read(b[:])
	return d + d*time.Duration(b[0])/1024
}

// DefaultStaleAfter is how old a running record's heartbeat may be before
// Status and List report it stale.
const DefaultStaleAfter = 3 * time.Minute

// Client speaks the protocol over one NATS connection.
type Client struct {
	nc         *nats.Conn
	js         jetstream.JetStream
	names      Names
	own        bool
	staleAfter time.Duration

	followStall      time.Duration
	wrapFollow       func(jetstream.MessagesContext) jetstream.MessagesContext // tests: stall a follower
	stallLooks       atomic.Int64                                              // tests: times a stall watch asked the stream
	stallTicks       atomic.Int64                                              // tests: stall watch ticks
	lookLast         func(ctx context.Context, runID string) (uint64, error)   // tests: answer for lastEventSeq
	beforeEnd        func(runID string)                                        // tests: a stall watch is about to end a follower
	afterListRange   func(from uint64)                                         // tests: a listing read a window
	beforeListQueued func()                                                    // tests: a listing read the records' top, not yet the queued runs

	mu      sync.Mutex
	kv      jetstream.KeyValue
	obs     jetstream.ObjectStore // transcript snapshots (snapshot.go)
	streams map[string]jetstream.Stream
}

// Connect connects to NATS and returns a client that owns the connection.
// The URL defaults to DefaultURL; call FromEnv first to honour the
// environment.
func Connect(ctx context.Context, o ConnectOptions) (*Client, error) {
	names, err := NewNames(o.Prefix)
	if err != nil {
		return nil, err
	}
	opts, err := o.natsOptions()
	if err != nil {
		return nil, err
	}
	u := o.URL
	if u == "" && o.InProcess == nil {
		u = DefaultURL
	}
	type result struct {
		nc  *nats.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		nc, err := nats.Connect(u, opts...)
		ch <- result{nc, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, ctx.Err()
	}
	if r.err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", RedactURL(u), r.err)
	}
	c, err := NewClient(r.nc, names.Prefix(), o.JetStreamOptions...)
	if err != nil {
		r.nc.Close()
		return nil, err
	}
	c.own = true
	return c, nil
}

// NewClient wraps an existing connection; Close does not close it.
func NewClient(nc *nats.Conn, prefix string, jsOpts ...jetstream.JetStreamOpt) (*Client, error) {
	names, err := NewNames(prefix)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jsOpts...)
	if err != nil {
		return nil, err
	}
	return &Client{nc: nc, js: js, names: names, streams: map[string]jetstream.Stream{}, staleAfter: DefaultStaleAfter, followStall: defaultFollowStall}, nil
}

// SetStaleAfter sets how old a running record's heartbeat may be before
// Status and List mark it stale (default DefaultStaleAfter). Keep it well
// above the workers' heartbeat interval (AckWait/4). Call it before use.
func (c *Client) SetStaleAfter(d time.Duration) {
	if d > 0 {
		c.staleAfter = d
	}
}

// defaultFollowStall is how long a follower waits in vain before it checks
// the stream for events its consumer did not deliver.
const defaultFollowStall = 5 * time.Second

// SetFollowStall sets the follow-stall interval (see Follow). Call it
// before use.
func (c *Client) SetFollowStall(d time.Duration) {
	if d > 0 {
		c.followStall = d
	}
}

// Close closes the connection if the client owns it.
func (c *Client) Close() {
	if c.own {
		c.nc.Close()
	}
}

// Conn returns the NATS connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// JetStream returns the client's JetStream context.
func (c *Client) JetStream() jetstream.JetStream { return c.js }

// Names returns the protocol names of the client's prefix.
func (c *Client) Names() Names { return c.names }
