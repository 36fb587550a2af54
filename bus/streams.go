package bus

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
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
	// Byte limits of AGENTS_RUNS, AGENTS_EVENTS and AGENTS_CONTROL [none].
	// A limit is set where a stream has none and only ever raised: an
	// operator's smaller one stays.
	RequestsMaxBytes, EventsMaxBytes, ControlMaxBytes int64
	ControlMaxAge                                     time.Duration // [7 days]
	RecordsTTL                                        time.Duration // [7 days]
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

// ensureStream creates a stream, or widens an existing one's config with
// want (see widenStream), so an older worker cannot undo a newer one's
// additions nor an operator's settings. keepNewest: the stream's
// per-subject cap keeps the newest messages (see widenStream).
func (c *Client) ensureStream(ctx context.Context, want jetstream.StreamConfig, keepNewest bool) error {
	s, err := c.js.Stream(ctx, want.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		_, err = c.js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return c.ensureStream(ctx, want, keepNewest) // another worker was first
		}
		return err
	case err != nil:
		return err
	}
	have := s.CachedInfo().Config
	widened := widenStream(have, want, keepNewest)
	if reflect.DeepEqual(widened, have) {
		return nil
	}
	_, err = c.js.UpdateStream(ctx, widened)
	return err
}

// widenStream is the existing config with want added: subjects are the
// union, limits the larger (unlimited is the largest, a limit want leaves
// at zero keeps its value), flags on if on in either, replicas never
// lowered. Everything want does not set (fields this version does not
// know, an operator's max_bytes or sources) is kept. One flag is turned
// off rather than on: with keepNewest, discard new per subject, which
// refuses what the cap would otherwise make room for (a widening too:
// the stream then stores every message it is sent).
func widenStream(have, want jetstream.StreamConfig, keepNewest bool) jetstream.StreamConfig {
	out := have
	out.Subjects = append([]string(nil), have.Subjects...)
	for _, sub := range want.Subjects {
		if !slices.ContainsFunc(out.Subjects, func(h string) bool { return covers(h, sub) }) {
			// What the new one covers goes: a stream may not hold
			// overlapping subjects (1.10's lane.<q>.<p>._.* became .*.*).
			out.Subjects = slices.DeleteFunc(out.Subjects, func(h string) bool { return covers(sub, h) })
			out.Subjects = append(out.Subjects, sub)
		}
	}
	if out.Description == "" {
		out.Description = want.Description
	}
	out.MaxMsgs = raiseLimit(have.MaxMsgs, want.MaxMsgs)
	out.MaxBytes = raiseLimit(have.MaxBytes, want.MaxBytes)
	if have.MaxBytes <= 0 && want.MaxBytes > 0 {
		out.MaxBytes = want.MaxBytes // a byte limit where there was none
	}
	out.MaxMsgsPerSubject = raiseLimit(have.MaxMsgsPerSubject, want.MaxMsgsPerSubject)
	out.MaxMsgSize = int32(raiseLimit(int64(have.MaxMsgSize), int64(want.MaxMsgSize)))
	out.MaxAge = time.Duration(raiseLimit(int64(have.MaxAge), int64(want.MaxAge)))
	out.Duplicates = max(have.Duplicates, want.Duplicates)
	out.Replicas = max(have.Replicas, want.Replicas)
	if want.Discard != jetstream.DiscardOld {
		out.Discard = want.Discard
	}
	if want.RePublish != nil {
		out.RePublish = want.RePublish
	}
	// Needs a per-subject limit (an operator's unlimited one is kept).
	out.DiscardNewPerSubject = (have.DiscardNewPerSubject || want.DiscardNewPerSubject) && out.MaxMsgsPerSubject > 0 &&
		out.Discard == jetstream.DiscardNew && !keepNewest
	out.AllowDirect = have.AllowDirect || want.AllowDirect
	out.AllowRollup = have.AllowRollup || want.AllowRollup
	out.AllowMsgTTL = have.AllowMsgTTL || want.AllowMsgTTL
	out.AllowBatchPublish = have.AllowBatchPublish || want.AllowBatchPublish
	out.AllowMsgSchedules = have.AllowMsgSchedules || want.AllowMsgSchedules
	out.DenyDelete = have.DenyDelete || want.DenyDelete
	out.DenyPurge = have.DenyPurge || want.DenyPurge
	for k, v := range want.Metadata {
		if out.Metadata == nil {
			out.Metadata = map[string]string{}
		}
		if _, ok := out.Metadata[k]; !ok {
			out.Metadata[k] = v
		}
	}
	return out
}

// covers reports whether subject filter have matches every subject that
// filter want matches (a stream may not hold overlapping subjects).
func covers(have, want string) bool {
	h, w := strings.Split(have, "."), strings.Split(want, ".")
	for i, t := range h {
		if t == ">" {
			return i < len(w)
		}
		if i >= len(w) || (t != "*" && t != w[i]) || (t == "*" && w[i] == ">") {
			return false
		}
	}
	return len(h) == len(w)
}

// MaxControlsPerSubject bounds the stored control messages of one kind for
// one run (AGENTS_CONTROL max_msgs_per_subject): the newest are kept.
const MaxControlsPerSubject = 1024

// raiseLimit returns the larger of two JetStream limits where zero or less
// is unlimited; want zero means "not set here" and keeps have.
func raiseLimit(have, want int64) int64 {
	if want == 0 || have <= 0 {
		return have
	}
	if want < 0 {
		return want
	}
	return max(have, want)
}

func queueSubjects(n Names, queues []string) []string {
	subs := make([]string, len(queues), 4*len(queues))
	for i, q := range queues {
		subs[i] = n.SubmitFilter(q)
	}
	for _, q := range queues {
		subs = append(subs, n.LaneSubjects(q)...) // since 1.10
	}
	return subs
}

// EnsureStreams creates or updates AGENTS_RUNS, AGENTS_EVENTS,
// AGENTS_CONTROL, the durable consumer workers-<queue> of each queue and the
// KV bucket agents_runs. What exists is only widened (widenStream): subjects
// and flags added, limits raised, replicas never lowered, and nothing an
// operator or a newer worker set is removed.
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
		// Only declared queues take requests: a request for a queue no
		// worker ever served is refused at publish (no stream answers)
		// instead of being kept for a week.
		Subjects:   queueSubjects(n, cfg.Queues),
		Retention:  jetstream.WorkQueuePolicy,
		Discard:    jetstream.DiscardNew,
		MaxMsgs:    cfg.MaxPendingRequests,
		MaxBytes:   cfg.RequestsMaxBytes,
		MaxAge:     cfg.RequestsMaxAge,
		MaxMsgSize: MaxRequestBytes + 64<<10,
		Duplicates: cfg.DuplicateWindow,
		Storage:    cfg.Storage,
		Replicas:   cfg.Replicas,
		// Since 1.10: every stored lane request, headers only, for the
		// workers' tenant lanes and idle wake-ups (Names.LaneSeen).
		RePublish: n.laneSeenRepublish(),
	}, {
		Name:        n.EventsStream(),
		Description: "agentfleet run events",
		Subjects:    []string{n.Events("*"), n.EventBatches()},
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      cfg.EventsMaxAge,
		MaxBytes:    cfg.EventsMaxBytes,
		// A worker re-sends unacknowledged events after a reconnect for
		// up to AckWait; the window must cover that so a re-sent lifecycle
		// or first event (the ones with a Nats-Msg-Id) is dropped.
		Duplicates: min(max(2*time.Minute, 2*cfg.AckWait), cfg.EventsMaxAge),
		Storage:    cfg.Storage,
		Replicas:   cfg.Replicas,
		// Workers publish events in fast batches (worker/internal/eventpub/batch.go).
		AllowBatchPublish: true,
		// Since 1.10: a resume reads the run's events with batched direct
		// gets (ReadEvents), not an ordered consumer each.
		AllowDirect: true,
	}, {
		Name:        n.ControlStream(),
		Description: "agentfleet steering, follow-ups, aborts and approvals",
		Subjects: []string{n.Control("*", KindSteer), n.Control("*", KindFollowUp),
			n.Control("*", KindAbort), n.Control("*", KindApprove), n.Control("*", KindCompact)},
		Retention:  jetstream.LimitsPolicy,
		MaxAge:     cfg.ControlMaxAge,
		MaxBytes:   cfg.ControlMaxBytes,
		MaxMsgSize: MaxControlBytes + 16<<10,
		// A retried control message with the Nats-Msg-Id of its first
		// publish is stored once (WithControlID); the server's default,
		// written down.
		Duplicates: min(2*time.Minute, cfg.ControlMaxAge),
		// Invariant: nobody but a run's owner side can exhaust what the
		// owner needs, whatever was published before the run existed or
		// after (docs/protocol.md §6). Whoever may publish a kind may
		// publish it for any run id, one not submitted yet too, so a cap
		// that refused the next message (discard new per subject, before
		// 1.8) let 1,024 junk aborts refuse the owner's abort for a week.
		// The cap keeps the newest 1,024 per run and kind instead: every
		// publish is stored, a flood only pushes older messages out, and
		// what the owner sends after the request reaches the run (one
		// stored abort stops it: the newest suffices). The worker still
		// ignores what was stored before the request, and bounds what it
		// queues (--max-queued-controls).
		MaxMsgsPerSubject: MaxControlsPerSubject,
		Discard:           jetstream.DiscardNew, // the byte limit refuses
		Storage:           cfg.Storage,
		Replicas:          cfg.Replicas,
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
		// Since 1.9: the request copies of parked runs (worker/internal/park),
		// the newest per run; a wake republishes one into the work queue.
		// And their timers: a message schedule per parked run (@at its
		// first approval's expiry) the server fires into ParkTimerDue.
		Name:              n.ParkedStream(),
		Description:       "agentfleet parked runs' requests, kept for their wake, and their timers",
		Subjects:          []string{n.ParkedAll(), n.ParkTimersAll()},
		AllowMsgSchedules: true,
		Retention:         jetstream.LimitsPolicy,
		MaxMsgsPerSubject: 1,
		MaxAge:            cfg.RequestsMaxAge,
		MaxMsgSize:        MaxRequestBytes + 64<<10,
		Duplicates:        min(2*time.Minute, cfg.RequestsMaxAge),
		Storage:           cfg.Storage,
		Replicas:          cfg.Replicas,
		// Since 1.10: a waker reads the kept copy by direct get, outside
		// the server's API queue (worker/internal/park/kept.go).
		AllowDirect: true,
	}, {
		Name:        n.AdvisoriesStream(),
		Description: "agentfleet MAX_DELIVERIES advisories of the request consumers, for the give-up path",
		Subjects:    []string{n.MaxDeliveriesAdvisories()},
		Retention:   jetstream.WorkQueuePolicy,
		MaxAge:      cfg.RequestsMaxAge,
		Storage:     cfg.Storage,
		Replicas:    cfg.Replicas,
	}, waitingStreamConfig(n, cfg), schedulesStreamConfig(n, cfg)}
	// Before AGENTS_RUNS: its subjects come from the entry of declared
	// queues in agents_keys (declared.go).
	if err := c.ensureKeysBucket(ctx, cfg); err != nil { // presence.go, since 1.10
		return err
	}
	replicas := map[string]int{}
	for _, sc := range streams {
		var err error
		if sc.Name == n.RunsStream() {
			err = c.ensureRunsStream(ctx, sc, cfg.Queues)
		} else {
			err = c.ensureStream(ctx, sc, sc.Name == n.ControlStream())
		}
		if err != nil {
			return fmt.Errorf("stream %s: %w", sc.Name, err)
		}
		s, err := c.js.Stream(ctx, sc.Name)
		if err != nil {
			return fmt.Errorf("stream %s: %w", sc.Name, err)
		}
		replicas[sc.Name] = s.CachedInfo().Config.Replicas
	}
	runsReplicas := replicas[n.RunsStream()]
	for _, q := range cfg.Queues {
		if _, err := c.js.CreateOrUpdateConsumer(ctx, n.RunsStream(), jetstream.ConsumerConfig{
			Durable:     n.Consumer(q),
			Description: "agentfleet workers of queue " + q,
			// Every message stored for the queue is delivered, and run or
			// removed with a logged reason: one with literal wildcard
			// tokens too (QueueFilter), which the worker terminates.
			FilterSubject: n.QueueFilter(q),
			AckPolicy:     jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckWait:       cfg.AckWait,
			MaxDeliver:    cfg.MaxDeliver,
			MaxAckPending: cfg.MaxAckPending,
			Replicas:      runsReplicas,
		}); err != nil {
			return fmt.Errorf("consumer %s: %w", n.Consumer(q), err)
		}
		// Since 1.10: one consumer per lane (docs/architecture.md,
		// Choosing the next run), disjoint from workers-<queue>.
		for _, l := range Lanes(q) {
			if l.Old() {
				continue
			}
			if _, err := c.js.CreateOrUpdateConsumer(ctx, n.RunsStream(),
				n.LaneConsumerConfig(l, cfg.AckWait, cfg.MaxDeliver, cfg.MaxAckPending, runsReplicas)); err != nil {
				return fmt.Errorf("consumer %s: %w", n.LaneConsumer(l), err)
			}
		}
	}
	if _, err := c.js.CreateOrUpdateConsumer(ctx, n.AdvisoriesStream(), jetstream.ConsumerConfig{
		Durable:       n.GiveUpConsumer(),
		Description:   "agentfleet workers giving up runs that reached MaxDeliver",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 1000,
		Replicas:      replicas[n.AdvisoriesStream()],
	}); err != nil {
		return fmt.Errorf("consumer %s: %w", n.GiveUpConsumer(), err)
	}
	// Since 1.9: every approve and abort stored passes the wake consumer,
	// which wakes the run if it is parked (worker/internal/park). It starts
	// at the newest message: what came before it exists woke nothing.
	if _, err := c.js.CreateOrUpdateConsumer(ctx, n.ControlStream(), jetstream.ConsumerConfig{
		Durable:        n.WakeConsumer(),
		Description:    "agentfleet workers waking parked runs",
		FilterSubjects: []string{n.Control("*", KindApprove), n.Control("*", KindAbort)},
		AckPolicy:      jetstream.AckExplicitPolicy,
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		// A wake is a record read and a publish: one a dead worker took
		// comes again soon.
		AckWait:       10 * time.Second,
		MaxAckPending: 1000,
		Replicas:      replicas[n.ControlStream()],
	}); err != nil {
		return fmt.Errorf("consumer %s: %w", n.WakeConsumer(), err)
	}
	// Since 1.9: the due timers of parked runs, which every worker pulls.
	if _, err := c.js.CreateOrUpdateConsumer(ctx, n.ParkedStream(), jetstream.ConsumerConfig{
		Durable:       n.TimersConsumer(),
		Description:   "agentfleet workers waking parked runs whose approval timed out",
		FilterSubject: n.ParkTimerDue("*"),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverNewPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 1000,
		Replicas:      replicas[n.ParkedStream()],
	}); err != nil {
		return fmt.Errorf("consumer %s: %w", n.TimersConsumer(), err)
	}
	// Since 1.10: the schedules' fires, which every worker pulls (schedule.go).
	if _, err := c.js.CreateOrUpdateConsumer(ctx, n.SchedulesStream(), schedulesConsumerConfig(n, replicas[n.SchedulesStream()])); err != nil {
		return fmt.Errorf("consumer %s: %w", n.FiresConsumer(), err)
	}
	if err := c.ensureWorkersBucket(ctx, cfg); err != nil { // presence.go
		return err
	}
	if err := c.ensureLimitsBucket(ctx, cfg); err != nil { // presence.go
		return err
	}
	if err := c.ensureBudgetsBucket(ctx, cfg); err != nil { // budgets.go
		return err
	}
	if err := c.ensureTranscriptsBucket(ctx, cfg); err != nil { // snapshot.go
		return err
	}
	kvStream := "KV_" + n.RecordsBucket()
	if _, err := c.js.Stream(ctx, kvStream); err == nil {
		// The bucket exists: widen its stream like the others (the KV
		// layer's update would rewrite the whole config).
		if err := c.ensureStream(ctx, jetstream.StreamConfig{
			Name:              kvStream,
			MaxMsgsPerSubject: 1,
			MaxAge:            cfg.RecordsTTL,
			MaxMsgSize:        64 << 10,
			Replicas:          cfg.Replicas,
		}, false); err != nil {
			return fmt.Errorf("kv bucket %s: %w", n.RecordsBucket(), err)
		}
		return nil
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("kv bucket %s: %w", n.RecordsBucket(), err)
	}
	if _, err := c.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:       n.RecordsBucket(),
		Description:  "agentfleet run records",
		History:      1,
		TTL:          cfg.RecordsTTL,
		MaxValueSize: 64 << 10,
		Storage:      cfg.Storage,
		Replicas:     cfg.Replicas,
	}); err != nil {
		return fmt.Errorf("kv bucket %s: %w", n.RecordsBucket(), err)
	}
	return nil
}

// Records returns the KV bucket of run records, cached. The bucket is
// looked up outside the client's lock: every Follow asks at its start, and
// a lookup waiting on NATS must not hold up the other callers.
func (c *Client) Records(ctx context.Context) (jetstream.KeyValue, error) {
	c.mu.Lock()
	kv := c.kv
	c.mu.Unlock()
	if kv != nil {
		return kv, nil
	}
	kv, err := c.js.KeyValue(ctx, c.names.RecordsBucket())
	if err != nil {
		return nil, fmt.Errorf("kv bucket %s: %w (has a worker or EnsureStreams created it?)", c.names.RecordsBucket(), err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kv == nil { // the first lookup to finish is kept
		c.kv = kv
	}
	return c.kv, nil
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
