package bus

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/internal/natserr"
)

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
	if req.Priority == PriorityNormal {
		// The default, left out: a worker before 1.10 refuses the field.
		req.Priority = ""
	}
	body, err := agent.MarshalJSON(req)
	if err != nil {
		return SubmitResult{}, err
	}
	if queue == "" {
		queue = DefaultQueue
	}
	// The tenant goes in the subject (since 1.10): workers share slots
	// fairly between tenant lanes, and an operator can make it unforgeable.
	return c.SubmitLane(ctx, LaneOf(queue, req.Priority, req.Metadata[TenantMetadataKey]), req.ID, body)
}

// SubmitRaw stores a request body as it is (no validation but of the
// subject tokens): for tools and tests. A span in ctx travels with the
// request (traceparent and tracestate headers).
func (c *Client) SubmitRaw(ctx context.Context, queue, runID string, body []byte) (SubmitResult, error) {
	if queue == "" {
		queue = DefaultQueue
	}
	return c.SubmitLane(ctx, Lane{Queue: queue}, runID, body)
}

// SubmitLane is SubmitRaw into a lane (since 1.10): a priority's subject
// (LaneOf), or the old one for a Lane with only its queue.
func (c *Client) SubmitLane(ctx context.Context, lane Lane, runID string, body []byte) (SubmitResult, error) {
	queue := lane.Queue
	if queue == "" {
		queue = DefaultQueue
		lane.Queue = queue
	}
	if err := CheckQueue(queue); err != nil {
		return SubmitResult{}, err
	}
	if err := CheckID(runID); err != nil {
		return SubmitResult{}, err
	}
	if !lane.Old() && (!ValidPriority(lane.Priority) || (lane.Tenant != NoTenant && !ValidTenant(lane.Tenant))) {
		return SubmitResult{}, fmt.Errorf("submit %s: invalid lane %s/%s", runID, truncate(lane.Priority, 40), truncate(lane.Tenant, 80))
	}
	ack, err := c.js.PublishMsg(ctx, tracedMsg(ctx, c.names.RequestSubject(lane, runID), body),
		jetstream.WithMsgID(runID), jetstream.WithExpectStream(c.names.RunsStream()))
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		if _, serr := c.js.Stream(ctx, c.names.RunsStream()); serr == nil {
			if !lane.Old() {
				return SubmitResult{}, fmt.Errorf("submit %s: %w: no 1.10 worker has declared the %s lane of queue %q for tenant %q (priorities and tenant lanes need a worker of protocol 1.10 or later on the queue)", runID, ErrUnknownQueue, lane.Priority, queue, lane.Tenant)
			}
			return SubmitResult{}, fmt.Errorf("submit %s: %w: no worker has declared queue %q (start a worker with --queue %s; see docs/operations.md, queues)", runID, ErrUnknownQueue, queue, queue)
		}
	}
	if err != nil {
		return SubmitResult{}, fmt.Errorf("submit %s: %w", runID, err)
	}
	if ack.Duplicate {
		if err := c.sameRequest(ctx, ack.Sequence, queue, runID, body); err != nil {
			return SubmitResult{}, err
		}
	}
	return SubmitResult{ID: runID, Queue: queue, Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// ErrUnknownQueue: the request names a queue the runs stream does not take.
var ErrUnknownQueue = errors.New("unknown queue")

// ErrRunIDTaken: a different request with this run id is already stored.
var ErrRunIDTaken = errors.New("run id taken by another request")

// sameRequest checks that the stored request a duplicate ack points at is
// this one (same queue, same body), so a request squatting on the id is
// not taken for ours. Once the original has been picked up and acked only
// its queue can be compared (from the run record).
func (c *Client) sameRequest(ctx context.Context, seq uint64, queue, runID string, body []byte) error {
	s, err := c.Stream(ctx, c.names.RunsStream())
	if err != nil {
		return fmt.Errorf("submit %s: checking the duplicate: %w", runID, err)
	}
	storedQueue := ""
	m, err := s.GetMsg(ctx, seq)
	switch {
	case err == nil:
		var storedRun string
		storedQueue, storedRun, _ = c.names.ParseSubmit(m.Subject)
		if storedQueue == queue && storedRun == runID && !bytes.Equal(m.Data, body) {
			return fmt.Errorf("submit %s: %w (sequence %d on queue %q holds another body); submit with a new id", runID, ErrRunIDTaken, seq, queue)
		}
	case errors.Is(err, jetstream.ErrMsgNotFound):
		rec, rerr := c.record(ctx, runID)
		if rerr != nil {
			return nil // neither the message nor a record: nothing to compare
		}
		storedQueue = rec.Queue
	default:
		return fmt.Errorf("submit %s: checking the duplicate: %w", runID, err)
	}
	if storedQueue != queue {
		return fmt.Errorf("submit %s: %w (stored on queue %q, not %q); submit with a new id", runID, ErrRunIDTaken, storedQueue, queue)
	}
	return nil
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
//
// A follower that waits in vain for the follow-stall interval asks the
// stream for the run's last stored event; if it is newer than the last one
// delivered, the consumer is replaced by one starting right after that.
// nats.go's ordered consumer has been seen to stay silent for good after a
// NATS restart while the run's events were stored.
//
// A run that does not exist would be waited for forever: while nothing has
// been delivered, Follow checks at its start and at each of those looks
// that the run has a stored event, a record or a request, and ends with
// ErrRunNotFound when two looks a stall interval apart found none. A run
// whose record says it finished but whose events are no longer stored
// (past the events stream's max age or byte limit) ends it likewise, with
// ErrEventsGone. Either ends a follower only while nothing was delivered.
func (c *Client) Follow(ctx context.Context, runID string) iter.Seq2[*Envelope, error] {
	return func(yield func(*Envelope, error) bool) {
		if err := CheckID(runID); err != nil {
			yield(nil, err)
			return
		}
		f := &follower{runID: runID, yield: yield}
		for {
			it, release, err := c.followFrom(ctx, runID, f.seen+1)
			if err != nil {
				yield(nil, fmt.Errorf("follow %s: %w", runID, err))
				return
			}
			if !c.drainAndRelease(ctx, f, it, release) {
				return
			}
		}
	}
}

// followFrom opens an ordered consumer on a run's events from stream
// sequence from on. The consumer's creation is retried while NATS is away
// or not answering: a request sent as the server goes down is lost, and
// would otherwise hold the follow until ctx ends.
func (c *Client) followFrom(ctx context.Context, runID string, from uint64) (it jetstream.MessagesContext, release func(), err error) {
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{c.names.Events(runID)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
	if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	pause := backoff.NewExponentialBackOff()
	pause.InitialInterval, pause.MaxInterval = 100*time.Millisecond, 2*time.Second
	cons, err := backoff.Retry(ctx, func() (jetstream.Consumer, error) {
		actx, cancel := context.WithTimeout(ctx, c.followOpenTimeout())
		defer cancel()
		cons, rel, err := c.OrderedEvents(actx, cfg)
		if err != nil && !natserr.Transient(err) && !errors.Is(err, context.DeadlineExceeded) { // each attempt has its own deadline
			return nil, backoff.Permanent(err)
		}
		release = rel
		return cons, err
	}, backoff.WithBackOff(pause), backoff.WithMaxElapsedTime(0))
	if ctx.Err() != nil {
		if err == nil {
			release()
		}
		return nil, nil, ctx.Err()
	}
	if err != nil {
		return nil, nil, err
	}
	if it, err = cons.Messages(); err != nil {
		release()
		return nil, nil, err
	}
	if c.wrapFollow != nil {
		it = c.wrapFollow(it)
	}
	return it, release, nil
}

// drainAndRelease drains a consumer, then deletes it (also when the
// caller's loop body panics).
func (c *Client) drainAndRelease(ctx context.Context, f *follower, it jetstream.MessagesContext, release func()) bool {
	defer release()
	return f.drain(ctx, it, c.watchStall(ctx, it, f.runID, f.seen))
}

// followOpenTimeout bounds one attempt at creating a follow consumer.
func (c *Client) followOpenTimeout() time.Duration { return max(2*c.followStall, 2*time.Second) }

// follower is one Follow's position, kept across consumers.
type follower struct {
	runID   string
	yield   func(*Envelope, error) bool
	attempt int
	next    uint64 // the envelope seq expected next in attempt
	seen    uint64 // stream sequence of the last message taken
}

// drain yields its messages until the run finishes, the caller stops or
// an error ends it; it reports whether to go on with a new consumer
// (the watch found this one stalled).
func (f *follower) drain(ctx context.Context, it jetstream.MessagesContext, w *stallWatch) bool {
	defer w.close()
	defer it.Stop()
	// The ordered consumer's Next ignores ctx while it makes its consumer
	// again (NATS away, the stream gone): stopping it ends the wait.
	defer context.AfterFunc(ctx, it.Stop)()
	for {
		if err := w.ended(); err != nil {
			if f.seen == 0 {
				f.yield(nil, fmt.Errorf("follow %s: %w", f.runID, err))
				return false
			}
			// The watch stopped the consumer on a look made before the
			// run's first event, which came meanwhile: the run exists,
			// and a new consumer goes on after what was delivered.
			return true
		}
		if w.stalled.Load() {
			// Stopped, but a reset already under way in nats.go may go on
			// with a new subscription that Stop no longer reaches: leave
			// it, and go on with a consumer of our own.
			return true
		}
		w.waiting.Store(true)
		msg, err := it.Next(jetstream.NextContext(ctx))
		w.waiting.Store(false)
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			} else if e := w.ended(); e != nil && f.seen == 0 {
				err = e
			} else if e != nil || w.stalled.Load() {
				return true
			}
			f.yield(nil, fmt.Errorf("follow %s: %w", f.runID, err))
			return false
		}
		var streamSeq uint64
		if md, err := msg.Metadata(); err == nil {
			streamSeq = md.Sequence.Stream
			// Fails only when the watch has just ended the follower on a
			// look made before this event was stored: the run exists
			// after all, and the next round goes on with a new consumer
			// (a follower that delivered something never ends so).
			w.seen.CompareAndSwap(f.seen, streamSeq)
			f.seen = streamSeq
		}
		env, err := DecodeEnvelope(msg.Data())
		if err != nil {
			if !f.yield(nil, &DecodeError{Run: f.runID, Err: err}) {
				return false
			}
			continue
		}
		env.StreamSeq = streamSeq
		if env.Attempt < f.attempt {
			continue // a stale attempt's late event
		}
		if env.Attempt > f.attempt {
			f.attempt, f.next = env.Attempt, 1
		}
		if env.Seq != f.next && f.next != 0 {
			if env.Seq < f.next {
				continue // a duplicate
			}
			if !f.yield(nil, &GapError{Run: f.runID, Attempt: f.attempt, Want: f.next, Got: env.Seq}) {
				return false
			}
		}
		f.next = env.Seq + 1
		if !f.yield(env, nil) || env.Type == EventRunFinished {
			return false
		}
	}
}

// stallWatch checks, every follow-stall interval, whether a follower that
// has been waiting all that time missed stored events, and stops its
// consumer if so. It runs beside the follower: a stuck consumer can hold
// Next (and its reset) for good.
type stallWatch struct {
	// seen is the stream sequence of the last message the follower took,
	// or endedSeen once the watch ended a follower that had taken none
	// (compare-and-swapped from 0 against the follower's own updates).
	seen    atomic.Uint64
	waiting atomic.Bool
	stalled atomic.Bool
	// end is why the watch ended the follower (ErrRunNotFound,
	// ErrEventsGone); written before seen becomes endedSeen, read after.
	end    error
	cancel context.CancelFunc
	exited chan struct{}
}

// endedSeen in stallWatch.seen: the watch ended a follower that had
// delivered nothing (no stream sequence is this large).
const endedSeen = ^uint64(0)

// ended is why the watch ended the follower, or nil.
func (w *stallWatch) ended() error {
	if w.seen.Load() != endedSeen {
		return nil
	}
	return w.end
}

func (c *Client) watchStall(ctx context.Context, it jetstream.MessagesContext, runID string, seen uint64) *stallWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &stallWatch{cancel: cancel, exited: make(chan struct{})}
	w.seen.Store(seen)
	go func() {
		defer close(w.exited)
		t := time.NewTicker(c.followStall)
		defer t.Stop()
		// Beside the consumer, not before it: a run that exists costs its
		// follower no wait.
		if seen == 0 && w.missing(ctx, c, it, runID, t.C) {
			return
		}
		// Stalled only after whole intervals spent in Next with nothing
		// delivered (a slow loop body is not a stall); a follower of an
		// idle run asks less and less often.
		last, idle, due := seen, 0, 2
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			c.stallTicks.Add(1)
			cur := w.seen.Load()
			if !w.waiting.Load() || cur != last {
				last, idle, due = cur, 0, 2
				continue
			}
			if idle++; idle < due {
				continue
			}
			idle = 0
			c.stallLooks.Add(1)
			lctx, cancel := context.WithTimeout(ctx, c.followOpenTimeout())
			look := c.lastEventSeq
			if c.lookLast != nil {
				look = c.lookLast
			}
			stored, err := look(lctx, runID)
			cancel()
			if err != nil {
				continue // NATS away: ask again, as often, once it is back
			}
			if stored == 0 && cur == 0 && w.missing(ctx, c, it, runID, t.C) {
				return
			}
			if stored <= cur || w.seen.Load() != cur || !w.waiting.Load() {
				due = min(2*due, 16) // nothing missed, or it moved meanwhile
				continue
			}
			w.stalled.Store(true)
			it.Stop()
			return
		}
	}()
	return w
}

// missing looks for a run nothing was delivered of, twice, a stall
// interval apart (tick), and stops the follower when neither look found
// it: one look would end a follower started just before the run's
// submitter published, or one that looked between a refused request's
// final record and its events. It reports whether the watch is done (the
// follower stopped, or ctx ended).
func (w *stallWatch) missing(ctx context.Context, c *Client, it jetstream.MessagesContext, runID string, tick <-chan time.Time) bool {
	if w.look(ctx, c, runID) == nil {
		return false
	}
	select {
	case <-ctx.Done():
		return true
	case <-tick:
	}
	why := w.look(ctx, c, runID)
	if why == nil {
		return false
	}
	if c.beforeEnd != nil {
		c.beforeEnd(runID)
	}
	w.end = why
	if !w.seen.CompareAndSwap(0, endedSeen) {
		return false // an event came meanwhile: the run exists
	}
	it.Stop()
	return true
}

// look reports why a follower that has delivered nothing should end: the
// run has no stored event, record or request (ErrRunNotFound), or its
// record says it finished and none of its events is stored any more
// (ErrEventsGone); nil when the run is there, something was delivered, or
// a read failed (no answer).
func (w *stallWatch) look(ctx context.Context, c *Client, runID string) error {
	lctx, cancel := context.WithTimeout(ctx, c.followOpenTimeout())
	defer cancel()
	rec, err := c.Status(lctx, runID)
	switch {
	case errors.Is(err, ErrRunNotFound):
		rec = nil
	case err != nil || !rec.Finished():
		return nil
	}
	stored, err := c.lastEventSeq(lctx, runID)
	if err != nil || stored != 0 || w.seen.Load() != 0 {
		return nil
	}
	if rec != nil {
		return fmt.Errorf("run finished (%s) but %w", rec.State, ErrEventsGone)
	}
	return ErrRunNotFound
}

func (w *stallWatch) close() {
	w.cancel()
	<-w.exited
}

// lastEventSeq is the stream sequence of a run's last stored event (0:
// none).
func (c *Client) lastEventSeq(ctx context.Context, runID string) (uint64, error) {
	s, err := c.Stream(ctx, c.names.EventsStream())
	if err != nil {
		return 0, err
	}
	m, err := s.GetLastMsgForSubject(ctx, c.names.Events(runID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
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
	if before > 0 && s.CachedInfo().Config.AllowDirect {
		envs, whole, err := c.readEventsDirect(ctx, runID, before)
		if err != nil || whole {
			return envs, err
		}
		// The server that answered had not stored before yet (a replica
		// behind): the leader's ordered consumer reads them.
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
	cons, release, err := c.OrderedEvents(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{c.names.Events(runID)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", runID, err)
	}
	defer release()
	return readEvents(ctx, runID, cons, func(md *jetstream.MsgMetadata, _ []byte) (keep, more bool) {
		seq := md.Sequence.Stream
		return seq < before, seq+1 < before
	})
}

// eventsBatch bounds the messages and bytes of one direct get of events.
const (
	eventsBatch      = 512
	eventsBatchBytes = 4 << 20
)

// readEventsDirect reads run's envelopes stored below before with batched
// direct gets on its literal subject (since 1.10: AGENTS_EVENTS allows
// direct gets): one request per eventsBatch events, where an ordered
// consumer costs its create, its pulls and its delete. Any replica may
// answer a direct get, one behind too, so the read is whole only when it
// reached a message of the run at before or later (a replica stores in
// order: it had every message below). Callers pass a sequence of the
// run's events (its attempt's run_started); whole is false otherwise.
func (c *Client) readEventsDirect(ctx context.Context, runID string, before uint64) (out []*Envelope, whole bool, err error) {
	g := c.directGetter(c.names.EventsStream())
	subj := c.names.Events(runID)
	for from := uint64(1); ; {
		msgs, err := g.request(ctx, map[string]any{"seq": from, "next_by_subj": subj, "batch": eventsBatch, "max_bytes": eventsBatchBytes})
		if errors.Is(err, errNoResults) || (err == nil && len(msgs) == 0) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("events of %s: %w", runID, err)
		}
		for _, m := range msgs {
			if m.seq >= before {
				return out, true, nil
			}
			if env, err := DecodeEnvelope(m.data); err == nil {
				env.StreamSeq = m.seq
				out = append(out, env)
			}
		}
		from = msgs[len(msgs)-1].seq + 1
	}
}

// readEvents reads a run's envelopes from an ordered consumer on its events
// while next (given each message's metadata and data) says to keep them
// and go on; envelopes that do not decode are skipped.
func readEvents(ctx context.Context, runID string, cons jetstream.Consumer, next func(md *jetstream.MsgMetadata, data []byte) (keep, more bool)) ([]*Envelope, error) {
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
		keep, more := next(md, msg.Data())
		if keep {
			if env, err := DecodeEnvelope(msg.Data()); err == nil {
				env.StreamSeq = md.Sequence.Stream
				out = append(out, env)
			}
		}
		if !more {
			return out, nil
		}
	}
}
