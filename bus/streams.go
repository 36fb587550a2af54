package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

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
