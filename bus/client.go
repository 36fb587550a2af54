package bus

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
)

// DefaultURL is where clients connect when nothing else is configured.
const DefaultURL = "nats://127.0.0.1:4222"

// Errors of the client operations.
var (
	ErrRunNotFound = errors.New("run not found")
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
		nats.CustomReconnectDelay(ReconnectDelay),
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

// ReconnectDelay is the wait before reconnect attempt n (after every
// server was tried once): 100ms doubling up to 5s, plus up to 25% jitter.
func ReconnectDelay(attempts int) time.Duration {
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

	mu      sync.Mutex
	kv      jetstream.KeyValue
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
	return &Client{nc: nc, js: js, names: names, streams: map[string]jetstream.Stream{}, staleAfter: DefaultStaleAfter}, nil
}

// SetStaleAfter sets how old a running record's heartbeat may be before
// Status and List mark it stale (default DefaultStaleAfter). Keep it well
// above the workers' heartbeat interval (AckWait/4). Call it before use.
func (c *Client) SetStaleAfter(d time.Duration) {
	if d > 0 {
		c.staleAfter = d
	}
}

// markStale sets Stale on a running record whose heartbeat is too old.
func (c *Client) markStale(r *RunRecord, now time.Time) {
	if r.State != StateRunning {
		return
	}
	hb := r.HeartbeatAt
	if hb.IsZero() {
		hb = r.StartedAt
	}
	r.Stale = !hb.IsZero() && now.Sub(hb) > c.staleAfter
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

// StreamsConfig shapes the streams, consumers and bucket EnsureStreams
// creates or updates. Zero fields take the defaults in brackets.
type StreamsConfig struct {
	Queues   []string              // consumers to ensure [default]
	Replicas int                   // [1]
	Storage  jetstream.StorageType // [file]
	// RequestsMaxAge drops requests no worker took in time [7 days].
	RequestsMaxAge time.Duration
	// MaxPendingRequests caps the work queue; Submit then fails [1,000,000].
	MaxPendingRequests int64
	// DuplicateWindow is the dedupe window of requests (by run id) [1h].
	DuplicateWindow time.Duration
	EventsMaxAge    time.Duration // [7 days]
	ControlMaxAge   time.Duration // [7 days]
	RecordsTTL      time.Duration // [7 days]
	// DeadMaxAge keeps dead-lettered requests (AGENTS_DEAD) [RequestsMaxAge].
	DeadMaxAge time.Duration
	// Consumer settings.
	AckWait       time.Duration // [60s]
	MaxDeliver    int           // [5]
	MaxAckPending int           // [10,000]; keep it above the fleet's slots
}

const week = 7 * 24 * time.Hour

func (s *StreamsConfig) defaults() {
	if len(s.Queues) == 0 {
		s.Queues = []string{DefaultQueue}
	}
	if s.Replicas == 0 {
		s.Replicas = 1
	}
	if s.RequestsMaxAge == 0 {
		s.RequestsMaxAge = week
	}
	if s.MaxPendingRequests == 0 {
		s.MaxPendingRequests = 1_000_000
	}
	if s.DuplicateWindow == 0 {
		s.DuplicateWindow = time.Hour
	}
	s.DuplicateWindow = min(s.DuplicateWindow, s.RequestsMaxAge)
	if s.EventsMaxAge == 0 {
		s.EventsMaxAge = week
	}
	if s.ControlMaxAge == 0 {
		s.ControlMaxAge = week
	}
	if s.RecordsTTL == 0 {
		s.RecordsTTL = week
	}
	if s.AckWait == 0 {
		s.AckWait = 60 * time.Second
	}
	if s.MaxDeliver == 0 {
		s.MaxDeliver = 5
	}
	if s.MaxAckPending == 0 {
		s.MaxAckPending = 10_000
	}
	if s.DeadMaxAge == 0 {
		s.DeadMaxAge = s.RequestsMaxAge
	}
}

// keepReplicas never lowers the replicas of an existing stream: a worker
// started without --stream-replicas must not strip a cluster's redundancy.
func (c *Client) keepReplicas(ctx context.Context, stream string, want int) int {
	s, err := c.js.Stream(ctx, stream)
	if err != nil {
		return want
	}
	return max(want, s.CachedInfo().Config.Replicas)
}

// EnsureStreams creates or updates AGENTS_RUNS, AGENTS_EVENTS,
// AGENTS_CONTROL, the durable consumer workers-<queue> of each queue and the
// KV bucket agents_runs. It never lowers the replicas of what exists.
func (c *Client) EnsureStreams(ctx context.Context, cfg StreamsConfig) error {
	cfg.defaults()
	n := c.names
	for _, q := range cfg.Queues {
		if err := CheckQueue(q); err != nil {
			return err
		}
	}
	streams := []jetstream.StreamConfig{{
		Name:        n.RunsStream(),
		Description: "agentfleet run requests (work queue)",
		Subjects:    []string{n.SubmitAll()},
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardNew,
		MaxMsgs:     cfg.MaxPendingRequests,
		MaxAge:      cfg.RequestsMaxAge,
		MaxMsgSize:  MaxRequestBytes + 64<<10,
		Duplicates:  cfg.DuplicateWindow,
		Storage:     cfg.Storage,
		Replicas:    cfg.Replicas,
	}, {
		Name:        n.EventsStream(),
		Description: "agentfleet run events",
		Subjects:    []string{n.Events("*")},
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      cfg.EventsMaxAge,
		// A worker re-sends unacknowledged events after a reconnect for
		// up to AckWait; the window must cover that so re-sent events are
		// dropped, not stored twice.
		Duplicates: min(max(2*time.Minute, 2*cfg.AckWait), cfg.EventsMaxAge),
		Storage:    cfg.Storage,
		Replicas:   cfg.Replicas,
	}, {
		Name:        n.ControlStream(),
		Description: "agentfleet steering, follow-ups and aborts",
		Subjects: []string{n.Control("*", KindSteer), n.Control("*", KindFollowUp),
			n.Control("*", KindAbort)},
		Retention:  jetstream.LimitsPolicy,
		MaxAge:     cfg.ControlMaxAge,
		MaxMsgSize: MaxControlBytes + 16<<10,
		Storage:    cfg.Storage,
		Replicas:   cfg.Replicas,
		// Each stored control message is republished with its stream
		// sequence, so workers need no consumer per run.
		RePublish: &jetstream.RePublish{Source: n.Prefix() + ".run.>", Destination: n.Prefix() + ".ctl.>"},
	}, {
		Name:        n.DeadStream(),
		Description: "agentfleet dead-lettered run requests (given up after MaxDeliver)",
		Subjects:    []string{n.DeadAll()},
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      cfg.DeadMaxAge,
		MaxMsgSize:  MaxRequestBytes + 64<<10,
		Duplicates:  min(time.Hour, cfg.DeadMaxAge),
		Storage:     cfg.Storage,
		Replicas:    cfg.Replicas,
	}, {
		Name:        n.AdvisoriesStream(),
		Description: "agentfleet MAX_DELIVERIES advisories of the request consumers, for the give-up path",
		Subjects:    []string{n.MaxDeliveriesAdvisories()},
		Retention:   jetstream.WorkQueuePolicy,
		MaxAge:      cfg.RequestsMaxAge,
		Storage:     cfg.Storage,
		Replicas:    cfg.Replicas,
	}}
	for _, sc := range streams {
		sc.Replicas = c.keepReplicas(ctx, sc.Name, sc.Replicas)
		if _, err := c.js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("stream %s: %w", sc.Name, err)
		}
	}
	runsReplicas := c.keepReplicas(ctx, n.RunsStream(), cfg.Replicas)
	for _, q := range cfg.Queues {
		if _, err := c.js.CreateOrUpdateConsumer(ctx, n.RunsStream(), jetstream.ConsumerConfig{
			Durable:       n.Consumer(q),
			Description:   "agentfleet workers of queue " + q,
			FilterSubject: n.SubmitFilter(q),
			AckPolicy:     jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckWait:       cfg.AckWait,
			MaxDeliver:    cfg.MaxDeliver,
			MaxAckPending: cfg.MaxAckPending,
			Replicas:      runsReplicas,
		}); err != nil {
			return fmt.Errorf("consumer %s: %w", n.Consumer(q), err)
		}
	}
	if _, err := c.js.CreateOrUpdateConsumer(ctx, n.AdvisoriesStream(), jetstream.ConsumerConfig{
		Durable:       n.GiveUpConsumer(),
		Description:   "agentfleet workers giving up runs that reached MaxDeliver",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 1000,
		Replicas:      c.keepReplicas(ctx, n.AdvisoriesStream(), cfg.Replicas),
	}); err != nil {
		return fmt.Errorf("consumer %s: %w", n.GiveUpConsumer(), err)
	}
	if _, err := c.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:       n.RecordsBucket(),
		Description:  "agentfleet run records",
		History:      1,
		TTL:          cfg.RecordsTTL,
		MaxValueSize: 64 << 10,
		Storage:      cfg.Storage,
		Replicas:     c.keepReplicas(ctx, "KV_"+n.RecordsBucket(), cfg.Replicas),
	}); err != nil {
		return fmt.Errorf("kv bucket %s: %w", n.RecordsBucket(), err)
	}
	return nil
}

// Records returns the KV bucket of run records.
func (c *Client) Records(ctx context.Context) (jetstream.KeyValue, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kv != nil {
		return c.kv, nil
	}
	kv, err := c.js.KeyValue(ctx, c.names.RecordsBucket())
	if err != nil {
		return nil, fmt.Errorf("kv bucket %s: %w (has a worker or EnsureStreams created it?)", c.names.RecordsBucket(), err)
	}
	c.kv = kv
	return kv, nil
}

// Stream returns a stream handle, cached.
func (c *Client) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	c.mu.Lock()
	s := c.streams[name]
	c.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s, err := c.js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	c.mu.Lock()
	c.streams[name] = s
	c.mu.Unlock()
	return s, nil
}

// NewRunID returns a fresh random run id (26 characters).
func NewRunID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// SubmitResult says where a request was stored.
type SubmitResult struct {
	ID    string
	Queue string
	// Seq is the AGENTS_RUNS sequence of the request.
	Seq uint64
	// Duplicate is true when a request with this id was already stored
	// within the dedupe window: this one was dropped.
	Duplicate bool
}

// Submit validates a request and stores it on the queue ("" is the default
// queue). A request without ID gets a fresh one. It returns once JetStream
// has stored the request.
func (c *Client) Submit(ctx context.Context, queue string, req *RunRequest) (SubmitResult, error) {
	if req.ID == "" {
		req.ID = NewRunID()
	}
	if err := req.Validate(req.ID); err != nil {
		return SubmitResult{}, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return SubmitResult{}, err
	}
	return c.SubmitRaw(ctx, queue, req.ID, body)
}

// SubmitRaw stores a request body as it is (no validation but of the
// subject tokens): for tools and tests.
func (c *Client) SubmitRaw(ctx context.Context, queue, runID string, body []byte) (SubmitResult, error) {
	if queue == "" {
		queue = DefaultQueue
	}
	if err := CheckQueue(queue); err != nil {
		return SubmitResult{}, err
	}
	if err := CheckID(runID); err != nil {
		return SubmitResult{}, err
	}
	ack, err := c.js.Publish(ctx, c.names.Submit(queue, runID), body,
		jetstream.WithMsgID(runID), jetstream.WithExpectStream(c.names.RunsStream()))
	if err != nil {
		return SubmitResult{}, fmt.Errorf("submit %s: %w", runID, err)
	}
	return SubmitResult{ID: runID, Queue: queue, Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// GapError reports missing envelopes: Follow yields it (with a nil
// envelope) before the envelope that came after the gap, and goes on.
type GapError struct {
	Run     string
	Attempt int
	Want    uint64
	Got     uint64
}

func (e *GapError) Error() string {
	return fmt.Sprintf("run %s attempt %d: events %d..%d missing", e.Run, e.Attempt, e.Want, e.Got-1)
}

// DecodeError is an envelope that did not decode; Follow skips it.
type DecodeError struct {
	Run string
	Err error
}

func (e *DecodeError) Error() string { return fmt.Sprintf("run %s: %v", e.Run, e.Err) }
func (e *DecodeError) Unwrap() error { return e.Err }

// IsFatalFollowError tells the errors that end Follow from those it yields
// and goes on after (*GapError, *DecodeError).
func IsFatalFollowError(err error) bool {
	var gap *GapError
	var dec *DecodeError
	return !errors.As(err, &gap) && !errors.As(err, &dec)
}

// Follow yields a run's envelopes from the first one, then live, and stops
// after the run's run_finished. Envelopes of an attempt stored after a newer
// attempt's run_started are skipped. Non-fatal problems are yielded as
// errors with a nil envelope (a *GapError, an envelope that does not
// decode) and following goes on; a fatal error (ctx done, the stream gone)
// is yielded last. Stop early by breaking out of the loop.
func (c *Client) Follow(ctx context.Context, runID string) iter.Seq2[*Envelope, error] {
	return func(yield func(*Envelope, error) bool) {
		if err := CheckID(runID); err != nil {
			yield(nil, err)
			return
		}
		cons, err := c.js.OrderedConsumer(ctx, c.names.EventsStream(), jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{c.names.Events(runID)},
			DeliverPolicy:  jetstream.DeliverAllPolicy,
		})
		if err != nil {
			yield(nil, fmt.Errorf("follow %s: %w", runID, err))
			return
		}
		it, err := cons.Messages()
		if err != nil {
			yield(nil, fmt.Errorf("follow %s: %w", runID, err))
			return
		}
		defer it.Stop()
		attempt := 0
		var next uint64
		for {
			msg, err := it.Next(jetstream.NextContext(ctx))
			if err != nil {
				if ctx.Err() != nil {
					err = ctx.Err()
				}
				yield(nil, fmt.Errorf("follow %s: %w", runID, err))
				return
			}
			env, err := DecodeEnvelope(msg.Data())
			if err != nil {
				if !yield(nil, &DecodeError{Run: runID, Err: err}) {
					return
				}
				continue
			}
			if md, err := msg.Metadata(); err == nil {
				env.StreamSeq = md.Sequence.Stream
			}
			if env.Attempt < attempt {
				continue // a stale attempt's late event
			}
			if env.Attempt > attempt {
				attempt, next = env.Attempt, 1
			}
			if env.Seq != next && next != 0 {
				if env.Seq < next {
					continue // a duplicate
				}
				if !yield(nil, &GapError{Run: runID, Attempt: attempt, Want: next, Got: env.Seq}) {
					return
				}
			}
			next = env.Seq + 1
			if !yield(env, nil) {
				return
			}
			if env.Type == EventRunFinished {
				return
			}
		}
	}
}

// LoadTranscript replays a run's events into a Transcript, up to its
// run_finished. It waits for a running run to finish (bound it with ctx).
func (c *Client) LoadTranscript(ctx context.Context, runID string) (*Transcript, error) {
	t := &Transcript{Run: runID}
	for env, err := range c.Follow(ctx, runID) {
		if err != nil {
			if IsFatalFollowError(err) {
				return t, err
			}
			continue
		}
		_ = t.Apply(env)
	}
	return t, nil
}

// ReadEvents returns a run's envelopes in stream order, those stored at a
// stream sequence below before (0: everything stored now). It does not
// wait for events to come; envelopes that do not decode are skipped.
func (c *Client) ReadEvents(ctx context.Context, runID string, before uint64) ([]*Envelope, error) {
	if err := CheckID(runID); err != nil {
		return nil, err
	}
	s, err := c.Stream(ctx, c.names.EventsStream())
	if err != nil {
		return nil, err
	}
	last, err := s.GetLastMsgForSubject(ctx, c.names.Events(runID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", runID, err)
	}
	if before == 0 || before > last.Sequence+1 {
		before = last.Sequence + 1
	}
	if before <= 1 {
		return nil, nil
	}
	cons, err := c.js.OrderedConsumer(ctx, c.names.EventsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{c.names.Events(runID)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", runID, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", runID, err)
	}
	defer it.Stop()
	var out []*Envelope
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return out, fmt.Errorf("events of %s: %w", runID, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return out, err
		}
		seq := md.Sequence.Stream
		if seq >= before {
			return out, nil
		}
		if env, err := DecodeEnvelope(msg.Data()); err == nil {
			env.StreamSeq = seq
			out = append(out, env)
		}
		if seq+1 >= before {
			return out, nil
		}
	}
}

// Steer sends a steering message to a run; it returns the control stream
// sequence. A finished run gives ErrRunFinished and nothing is sent.
func (c *Client) Steer(ctx context.Context, runID, text string) (uint64, error) {
	return c.SendControl(ctx, runID, KindSteer, Control{Text: text})
}

// FollowUp queues a follow-up message for a run.
func (c *Client) FollowUp(ctx context.Context, runID, text string) (uint64, error) {
	return c.SendControl(ctx, runID, KindFollowUp, Control{Text: text})
}

// Abort asks a run to stop.
func (c *Client) Abort(ctx context.Context, runID, reason string) (uint64, error) {
	return c.SendControl(ctx, runID, KindAbort, Control{Reason: reason})
}

// SteerMessage sends a full pi user message as steering.
func (c *Client) SteerMessage(ctx context.Context, runID string, m agent.Message) (uint64, error) {
	return c.SendControl(ctx, runID, KindSteer, Control{Message: &m})
}

// SendControl publishes a control message of a kind (steer, followup,
// abort) after checking the run has not finished.
func (c *Client) SendControl(ctx context.Context, runID, kind string, body Control) (uint64, error) {
	if err := CheckID(runID); err != nil {
		return 0, err
	}
	switch kind {
	case KindSteer, KindFollowUp, KindAbort:
	default:
		return 0, fmt.Errorf("unknown control kind %q", kind)
	}
	if rec, err := c.record(ctx, runID); err == nil && rec.Finished() {
		return 0, fmt.Errorf("%w: run %s is %s", ErrRunFinished, runID, rec.State)
	}
	data, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	ack, err := c.js.Publish(ctx, c.names.Control(runID, kind), data, jetstream.WithExpectStream(c.names.ControlStream()))
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", kind, runID, err)
	}
	return ack.Sequence, nil
}

func (c *Client) record(ctx context.Context, runID string) (*RunRecord, error) {
	kv, err := c.Records(ctx)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, runID)
	if err != nil {
		return nil, err
	}
	return DecodeRecord(e)
}

// DecodeRecord decodes a run record from its KV entry, with its revision
// (the lease's compare-and-set token).
func DecodeRecord(e jetstream.KeyValueEntry) (*RunRecord, error) {
	var r RunRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, fmt.Errorf("record %s: %w", e.Key(), err)
	}
	r.Revision = e.Revision()
	return &r, nil
}

// Status returns a run's record. A run with no record but a pending request
// is reported as queued; neither gives ErrRunNotFound.
func (c *Client) Status(ctx context.Context, runID string) (*RunRecord, error) {
	if err := CheckID(runID); err != nil {
		return nil, err
	}
	r, err := c.record(ctx, runID)
	if err == nil {
		c.markStale(r, time.Now())
		return r, nil
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, err
	}
	s, err := c.Stream(ctx, c.names.RunsStream())
	if err != nil {
		return nil, err
	}
	m, err := s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(c.names.Submit("*", runID)))
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, fmt.Errorf("%w: %s", ErrRunNotFound, runID)
		}
		return nil, err
	}
	q, _, _ := c.names.ParseSubmit(m.Subject)
	return &RunRecord{ID: runID, Queue: q, State: StateQueued, SubmittedAt: m.Time, RequestSeq: m.Sequence}, nil
}

// ListOptions filter List.
type ListOptions struct {
	// State: "" for all; queued, running, succeeded, failed, aborted, or
	// stale (running records whose heartbeat is too old).
	State string
	Queue string // "" for all
	Limit int    // 0 for no limit
}

// List returns run records, the newest first: queued runs (requests with no
// record yet) and the records of the bucket.
func (c *Client) List(ctx context.Context, o ListOptions) ([]RunRecord, error) {
	kv, err := c.Records(ctx)
	if err != nil {
		return nil, err
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	var recs []RunRecord
	have := map[string]bool{}
loop:
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok || e == nil {
				break loop
			}
			var r RunRecord
			if json.Unmarshal(e.Value(), &r) != nil {
				continue
			}
			r.Revision = e.Revision()
			have[r.ID] = true
			recs = append(recs, r)
		case <-ctx.Done():
			_ = w.Stop()
			return nil, ctx.Err()
		}
	}
	_ = w.Stop()
	if o.State == "" || o.State == StateQueued {
		s, err := c.Stream(ctx, c.names.RunsStream())
		if err != nil {
			return nil, err
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(c.names.SubmitAll()))
		if err != nil {
			return nil, err
		}
		for subj := range info.State.Subjects {
			q, id, err := c.names.ParseSubmit(subj)
			if err != nil || have[id] {
				continue
			}
			recs = append(recs, RunRecord{ID: id, Queue: q, State: StateQueued})
		}
	}
	out := recs[:0]
	now := time.Now()
	for _, r := range recs {
		c.markStale(&r, now)
		state := o.State == "" || r.State == o.State || (o.State == StateStale && r.Stale)
		if state && (o.Queue == "" || r.Queue == o.Queue) {
			out = append(out, r)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.State == StateQueued) != (b.State == StateQueued) {
			return a.State == StateQueued
		}
		ta, tb := a.SubmittedAt, b.SubmittedAt
		if ta.IsZero() {
			ta = a.StartedAt
		}
		if tb.IsZero() {
			tb = b.StartedAt
		}
		if !ta.Equal(tb) {
			return ta.After(tb)
		}
		return a.ID < b.ID
	})
	if o.Limit > 0 && len(out) > o.Limit {
		out = out[:o.Limit]
	}
	return out, nil
}
