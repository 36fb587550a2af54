package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
)

// jsDuplicateInProcess is the stream's answer to a copy of an event
// whose original it is still storing (a cluster): the original's ack
// comes to the same reply subject.
const jsDuplicateInProcess = 10158

// resendPause is how long a re-send waits after the stream answered an
// event with an error, or left it unanswered (nats.go waits as long
// between its own retries).
const resendPause = 250 * time.Millisecond

// envelopeHeadroom is kept free under the max payload for headers and
// protocol overhead.
const envelopeHeadroom = 4 << 10

var (
	errPublisherClosed = errors.New("publisher closed")
	errLeaseLost       = errors.New("the run's lease was lost: another attempt owns it")
	errOutOfOrder      = errors.New("events were stored out of order after a reconnect")
	errSuperseded      = errors.New("a newer attempt published on the run")
	errNoProgress      = errors.New("re-send refused, and nothing new stored")
	// errWorkerStopping: the hard stop cut a wait or a read short (a
	// re-send's, a turn's, a resume's); the run is handed back as any run
	// at a hard stop is.
	errWorkerStopping = errors.New("worker stopping")
)

// EventTooLargeError is a single event that would not fit in one NATS
// message. The run fails with reason event_too_large.
type EventTooLargeError struct {
	Type  string
	Size  int
	Limit int
}

func (e *EventTooLargeError) Error() string {
	return fmt.Sprintf("%s event is %d bytes, more than the %d bytes a NATS message may carry", e.Type, e.Size, e.Limit)
}

// publisher publishes one attempt's events asynchronously with a bounded
// window of outstanding acks. Every event takes a window slot before it is
// published and gives it back when its ack arrives; a full window blocks
// the caller (the agent's listener): back-pressure. Acks come through the
// worker's eventAcks (acks.go), which applies them here.
//
// Invariants:
//   - queue holds the unacknowledged events and those acked after an
//     earlier one still unacked, in seq order; its head is popped only
//     once acked, so events are counted stored in seq order.
//   - The window holds at least len(queue) slots: a queued event's slot is
//     given back when it is popped or dropped, never before.
//   - Acks must come with increasing stream sequences in seq order; if not
//     (a lost event stored after a later one), the attempt fails and is
//     handed back.
//   - Events go on the wire in seq order: sendMu is held from taking a
//     seq to the end of its publish; while a re-send runs every new event
//     is held and the re-send sends it in its turn. The re-send picks an
//     event under sendMu too, so an event is never picked while its first
//     send is under way. mu guards the state
//     and is never held over a publish, so the ack callback never waits
//     on the connection.
//   - Only a publisher's first event and the lifecycle events carry a
//     Nats-Msg-Id (carriesMsgID): the stream's dedupe of every event cost
//     it about a fifth of its ingest (nats bench js pub async with and
//     without --dedup, docs/benchmarks/).
//   - While the stream takes batches, an event sent singly (no
//     expectation) goes out alone: once every earlier event of its run is
//     answered, and the run's next event only after its answer
//     (turnLocked). Batches keep order within a batch; nothing kept it
//     between two single sends in flight, and an overloaded stream drops
//     one and stores the next.
//   - A new event is sent at once only if it cannot overtake an earlier
//     one: nothing is held, the connection is up, no disconnect is
//     pending in eventAcks, and the oldest unacknowledged event was sent
//     on this connection (its epoch). Otherwise it is held: one re-send
//     goroutine waits for the connection and re-sends the unacknowledged
//     events one at a time in seq order until every event it sent is
//     stored (the held ones then go out as new events do, releaseHeld),
//     each stored only right after
//     the subject's last message as the goroutine knows it
//     (Nats-Expected-Last-Subject-Sequence; an event with a message id is
//     dropped by the stream if stored already). Refused because more is
//     stored than it knew (acks lost or late), it reads what the run's
//     subject holds since (reconcile): this attempt's events found there
//     in seq order count as acked, copies and older attempts' events are
//     skipped, and an event found after a later one (lost, the later one
//     stored) fails the attempt. So a re-send never stores an event twice
//     unless its original lands after the read (a copy after it, same
//     seq and body: readers take the first of a seq). So does an ack that
//     fails for a reason a reconnect cures (timeout, no responders, 503),
//     after a pause. (A loss between the check and the publish can still
//     let an event overtake; its ack then comes out of order, below.) The
//     retry budget is AckWait from the first failure, counted again from
//     each ack that comes meanwhile, and cleared once nothing waits: past
//     it the request is redelivered anyway.
//   - Once failed or fenced (stopped), nothing more goes on the wire,
//     also from a publish in progress outside mu.
//   - done is closed once the publisher is closed, its queue is empty and
//     no re-send runs; then it leaves eventAcks.
type publisher struct {
	w       *Worker
	run     string
	attempt int
	subject string
	// The constant parts of the envelopes, message ids and reply subjects.
	envHead, envMid, msgIDHead string
	replyHead                  string
	ackID                      uint64
	limit                      int
	budget                     time.Duration

	window chan struct{}
	kick   chan struct{} // wakes the re-send goroutine
	done   chan struct{}
	first  chan struct{} // closed when seq 1 is acked

	sendMu sync.Mutex // see the invariants; taken before mu
	// stopped is set with err: a publish in progress outside mu sends
	// nothing more (a fenced attempt must not). stopCh is closed then:
	// it ends a wait for an earlier batch's answer.
	stopped atomic.Bool
	stopCh  chan struct{}

	mu    sync.Mutex
	queue []*outgoing  // see the invariants
	syncs []syncWaiter // see sync
	seq   uint64
	// holding: do not send (disconnected, or re-sending). Written under
	// mu, set before a batch's hold on the publisher ends and cleared only
	// once nothing sent is unacknowledged (what was held then goes out in
	// seq order under sendMu, before any new event); the event batch reads
	// it without mu (batch.go).
	holding   atomic.Bool
	resending bool // the re-send goroutine runs
	// stopResend cancels the re-send's requests in flight once the
	// publisher fails (a fenced attempt does not wait out an ack).
	stopResend  context.CancelFunc
	retryStart  time.Time
	closed      bool
	finished    bool // done is closed
	err         error
	lastStream  uint64 // stream sequence of the last popped event
	singleSeq   uint64 // the last event sent singly (not in a batch)
	sent        int    // events published, for the run's event budget
	sentBytes   int64
	firstStream uint64
	onFail      func(error)
	// batch and batchAt are where the publisher's last batched event went
	// (entry batchAt, from 1), guarded by the event batch's mu (batch.go).
	batch   string // the batch's id
	batchAt uint64
	// turn, made by an event waiting for its turn (turnLocked), is closed
	// when an ack pops, a re-send starts or the publisher fails.
	turn chan struct{}
}

type outgoing struct {
	seq    uint64
	m      nats.Msg
	sent   bool   // handed to the connection (or about to be)
	epoch  uint64 // eventAcks' epoch when it was
	sentAt time.Time
	acked  bool
	stream uint64 // where the ack says it is stored
	dup    bool
	msgID  bool // carries a Nats-Msg-Id
	// batched: sent in an event batch (batch.go), whose answers ack it;
	// approx: its stream is a floor of where it is stored, not the place.
	batched, approx bool
}

func newPublisher(w *Worker, run string, attempt int, onFail func(error)) *publisher {
	n := w.cfg.PublishWindow
	p := &publisher{
		w: w, run: run, attempt: attempt,
		subject:   w.names.Events(run),
		msgIDHead: workerproto.MsgIDPrefix(run, attempt),
		limit:     int(w.maxPayload()) - envelopeHeadroom,
		budget:    w.cfg.AckWait,
		window:    make(chan struct{}, n),
		kick:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		first:     make(chan struct{}),
		stopCh:    make(chan struct{}),
		onFail:    onFail,
	}
	p.envHead, p.envMid = envelopeParts(run, attempt, w.id)
	p.replyHead = w.acks.add(p)
	return p
}

// envelopeParts cuts an attempt's envelope at its seq and ts: what comes
// before the seq, and what between the seq and the ts.
func envelopeParts(run string, attempt int, worker string) (head, mid string) {
	e := (&bus.Envelope{Run: run, Attempt: attempt, Worker: worker}).AppendJSON(nil)
	// {"run":"R","seq":0,"attempt":A,"worker":"W","ts":0,"event":}
	i := bytes.Index(e, []byte(`,"seq":`)) + len(`,"seq":`)
	j := bytes.Index(e, []byte(`,"attempt":`))
	k := bytes.LastIndex(e, []byte(`,"ts":`)) + len(`,"ts":`)
	return string(e[:i]), string(e[j:k])
}

// appendEnvelope appends what bus.Envelope.AppendJSON writes for this
// attempt's envelope, without re-encoding its constant parts.
func (p *publisher) appendEnvelope(dst []byte, seq uint64, ts int64, controlSeq uint64, interrupted bool, event []byte) []byte {
	dst = append(dst, p.envHead...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, p.envMid...)
	dst = strconv.AppendInt(dst, ts, 10)
	if controlSeq > 0 {
		dst = append(dst, `,"controlSeq":`...)
		dst = strconv.AppendUint(dst, controlSeq, 10)
	}
	if interrupted {
		dst = append(dst, `,"interrupted":true`...)
	}
	dst = append(dst, `,"event":`...)
	dst = append(dst, event...)
	return append(dst, '}')
}

func (p *publisher) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// stampLocked marks o sent now in epoch (read after the connection was
// seen up), before its publish: its ack may come before the publish
// returns. Caller holds mu.
func stampLocked(o *outgoing, now time.Time, epoch uint64) {
	o.sent, o.epoch, o.sentAt = true, epoch, now
}

// mayOvertakeLocked tells whether a new event may be sent at once (see
// the invariants), and the epoch to stamp it with. Caller holds mu.
func (p *publisher) mayOvertakeLocked() (uint64, bool) {
	if p.holding.Load() || !p.w.c.Conn().IsConnected() {
		return 0, false
	}
	epoch := p.w.acks.current()
	for _, o := range p.queue {
		if !o.acked {
			return epoch, o.sent && o.epoch == epoch
		}
	}
	return epoch, true
}

// budgetSpent is the failure of events not stored within the budget.
func (p *publisher) budgetSpent(cause error) error {
	return fmt.Errorf("publish to %s: not stored within %s: %w", p.subject, p.budget, cause)
}

// queuedLocked returns the queued event seq unacknowledged, or nil (the
// publisher failed, or a late answer: acked or popped already). Caller
// holds mu.
func (p *publisher) queuedLocked(seq uint64) *outgoing {
	if p.err != nil || len(p.queue) == 0 {
		return nil
	}
	head := p.queue[0].seq
	if seq < head || seq-head >= uint64(len(p.queue)) || p.queue[seq-head].acked {
		return nil
	}
	return p.queue[seq-head]
}

// ackArrived applies the ack of the event seq (eventAcks' callback: it
// must not block).
func (p *publisher) ackArrived(seq, stream uint64, dup bool, ackErr error) {
	p.mu.Lock()
	o := p.queuedLocked(seq)
	if o == nil {
		p.mu.Unlock()
		return
	}
	if ackErr != nil {
		var api *jetstream.APIError
		if errors.As(ackErr, &api) && api.ErrorCode == jsDuplicateInProcess {
			p.mu.Unlock() // a copy of an event the stream is storing: its ack comes
			return
		}
		if bus.Transient(ackErr) {
			p.startResendLocked(ackErr)
			p.mu.Unlock()
			return
		}
		first := p.failLocked(fmt.Errorf("publish to %s: %w", p.subject, ackErr))
		p.mu.Unlock()
		if first {
			go p.failed()
		}
		return
	}
	o.acked, o.stream, o.dup = true, stream, dup
	p.popAndUnlock(true)
}

// batchUnanswered re-sends the event seq, whose batch was committed but
// not answered: it may or may not be stored, the re-send finds out.
func (p *publisher) batchUnanswered(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queuedLocked(seq) != nil {
		p.startResendLocked(errBatchUnanswered)
	}
}

// batchAnswer applies the event batch's answer for the event seq: stored
// at stream (a floor if approx), or, with cause, not stored. It is the
// batch answers' callback: it must not block.
func (p *publisher) batchAnswer(seq, stream uint64, approx bool, cause error) {
	p.mu.Lock()
	o := p.queuedLocked(seq)
	if o == nil {
		p.mu.Unlock()
		return
	}
	i := seq - p.queue[0].seq
	if cause == nil {
		o.acked, o.stream, o.approx = true, stream, approx
		p.popAndUnlock(true)
		return
	}
	// Not stored: re-sent, unless a later event is stored already (in a
	// later batch, or plainly): stored now, it would come after it.
	for _, later := range p.queue[i+1:] {
		if later.acked {
			first := p.failLocked(fmt.Errorf("%w (event %d not stored: %w; event %d stored)", errOutOfOrder, seq, cause, later.seq))
			p.mu.Unlock()
			if first {
				go p.failed()
			}
			return
		}
	}
	p.startResendLocked(cause)
	p.mu.Unlock()
}

// popAndUnlock pops what is acked at the queue's head, fails the
// publisher if it was stored out of order, unlocks mu and gives the
// popped events' window slots back. Caller holds mu; async runs the
// failure report in a goroutine (the ack callback must not block).
func (p *publisher) popAndUnlock(async bool) {
	popped, stored, bad := p.popLocked()
	var first bool
	if bad != nil {
		first = p.failLocked(bad)
	}
	p.mu.Unlock()
	for range popped {
		<-p.window
	}
	for range stored {
		p.w.obs.EventPublished()
	}
	switch {
	case !first:
	case async:
		go p.failed()
	default:
		p.failed()
	}
}

// popLocked pops the acked events at the queue's head: how many, how many
// of them were new to the stream, and an error if one was stored out of
// order. Caller holds mu.
func (p *publisher) popLocked() (popped, stored int, bad error) {
	for len(p.queue) > 0 && p.queue[0].acked {
		o := p.queue[0]
		switch {
		case o.approx:
			// A floor says nothing of the order (the batch kept it).
			p.lastStream = max(p.lastStream, o.stream)
		case o.stream <= p.lastStream:
			return popped, stored, fmt.Errorf("%w (event %d stored at %d, before %d)", errOutOfOrder, o.seq, o.stream, p.lastStream)
		default:
			p.lastStream = o.stream
		}
		p.queue[0] = nil
		p.queue = p.queue[1:]
		popped++
		if !o.dup {
			stored++
		}
		if o.seq == 1 {
			p.firstStream = o.stream
			close(p.first)
		}
	}
	if popped > 0 {
		p.turnChangedLocked()
	}
	switch {
	case popped == 0:
	case p.resending && len(p.queue) > 0:
		p.retryStart = time.Now() // progress: the budget starts again
	default:
		p.retryStart = time.Time{}
	}
	if popped > 0 {
		p.releaseSyncLocked(false)
	}
	if popped > 0 && len(p.queue) == 0 {
		p.finishLocked()
	}
	return popped, stored, nil
}

// check is eventAcks' sweep: it starts a re-send when the oldest
// unacknowledged event was sent before the connection's latest reconnect
// or longer than timeout ago, and fails the publisher past its budget.
func (p *publisher) check(now time.Time, epoch uint64, timeout time.Duration) {
	p.mu.Lock()
	if p.err != nil || p.resending || len(p.queue) == 0 {
		p.mu.Unlock()
		return
	}
	if !p.retryStart.IsZero() && now.Sub(p.retryStart) > p.budget {
		first := p.failLocked(p.budgetSpent(jetstream.ErrAsyncPublishTimeout))
		p.mu.Unlock()
		if first {
			go p.failed()
		}
		return
	}
	for _, o := range p.queue {
		if o.acked {
			continue
		}
		switch {
		case !o.sent, o.epoch < epoch: // a stamp after the sweep's read is newer
			p.startResendLocked(nats.ErrDisconnected)
		case now.Sub(o.sentAt) > timeout:
			p.startResendLocked(jetstream.ErrAsyncPublishTimeout)
		}
		break
	}
	p.mu.Unlock()
}

// startResendLocked holds new events and starts the re-send goroutine
// unless it runs. Caller holds mu.
func (p *publisher) startResendLocked(cause error) {
	p.turnChangedLocked() // a waiting event is held now
	p.holding.Store(true)
	if p.err != nil || p.resending {
		return
	}
	p.resending = true
	warn := p.retryStart.IsZero()
	if warn {
		p.retryStart = time.Now()
	}
	ctx, cancel := context.WithCancel(p.w.hardCtx)
	p.stopResend = cancel
	go p.resend(ctx, cause, warn)
}

// resend waits for the connection and re-sends the unacknowledged events
// one at a time, in seq order (see the invariants), new ones held
// meanwhile included. It ends once nothing waits for an ack, and fails the
// publisher once the retry budget is spent.
func (p *publisher) resend(ctx context.Context, cause error, warn bool) {
	if warn {
		p.w.log.Warn("event publish not acknowledged; re-sending when NATS is back", "run", p.run, "err", cause)
	}
	nc := p.w.c.Conn()
	// The stream answered no (503, 429, no responders) or nothing: ask
	// again only after a pause, or an outage would be a loop of re-sends;
	// spread over up to four pauses, as the runs of an overloaded worker
	// get their 429s at once.
	pause := func(cause error) time.Time {
		if errors.Is(cause, nats.ErrDisconnected) || errors.Is(cause, errBatchEnded) || errors.Is(cause, errHeld) || errors.Is(cause, errBatchUnanswered) {
			return time.Now()
		}
		return time.Now().Add(resendPause + rand.N(3*resendPause))
	}
	notBefore := pause(cause)
	// known is the subject's last stream sequence as this re-send learned
	// it (0: not yet; then an event's predecessor's). Read from the stream
	// (read), it is taken as it is: messages may have been removed since
	// (limits), so it can be below the predecessor's.
	var known uint64
	var read bool
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		// sendMu: no event's first send is under way while one is picked
		// (it may be the one picked, and would then go out twice).
		p.sendMu.Lock()
		batchHeld := p.w.batch != nil && p.w.batch.endedHolds(p) // before mu: the batch takes it after its own
		p.mu.Lock()
		done, first := p.resendStateLocked(cause)
		if done {
			p.mu.Unlock()
			p.sendMu.Unlock()
			if first {
				p.failed()
			}
			return
		}
		if held := p.heldOnlyLocked(); held != nil && !batchHeld && !time.Now().Before(notBefore) && nc.IsConnected() {
			p.releaseHeld(held) // unlocks mu and sendMu
			return
		}
		var o *outgoing
		var expect uint64
		var wait time.Duration
		var sentIn context.Context // the epoch's: it ends with the connection
		if !time.Now().Before(notBefore) && nc.IsConnected() {
			// An answer is waited for at most until the budget is spent.
			wait = p.w.cfg.PublishAckTimeout
			if !p.retryStart.IsZero() {
				wait = min(wait, max(p.budget-time.Since(p.retryStart), 10*time.Millisecond))
			}
			o, expect = p.firstUnackedLocked()
			if read {
				expect = known
			} else {
				expect = max(expect, known)
			}
			var epoch uint64
			epoch, sentIn = p.w.acks.currentWithContext()
			stampLocked(o, time.Now(), epoch)
		}
		p.mu.Unlock()
		p.sendMu.Unlock()
		if o != nil {
			if h := p.w.hooks.beforeEventResend; h != nil {
				h(o.seq)
			}
			if p.stopped.Load() {
				continue // fenced or failed: the loop's top ends it
			}
			var err error
			known, read, err = p.resendOne(ctx, sentIn, nc, o, expect, wait)
			if err == nil {
				continue
			}
			if ctx.Err() != nil && p.w.hardCtx.Err() != nil { // whatever the request made of it
				p.fail(fmt.Errorf("publish to %s: %w: %w", p.subject, errWorkerStopping, err))
				continue // the loop's top ends it
			}
			cause, notBefore = err, pause(err)
		}
		select {
		case <-t.C:
		case <-p.kick:
		case <-p.w.hardCtx.Done():
			p.fail(fmt.Errorf("publish to %s: %w: %w", p.subject, errWorkerStopping, cause))
		}
	}
}

// heldOnlyLocked returns the unacknowledged events if none of them was
// sent (all were held), else nil. Caller holds mu.
func (p *publisher) heldOnlyLocked() []*outgoing {
	for i, o := range p.queue {
		if o.acked {
			continue
		}
		for _, later := range p.queue[i:] {
			if later.sent || later.acked {
				return nil
			}
		}
		return p.queue[i:]
	}
	return nil
}

// releaseHeld ends the re-send once every event it sent is stored: the
// held ones go out as new events do, in seq order (in batches), and new
// ones follow them. Sent one at a time with a round trip each, they did
// not keep up with a streaming run on a loaded server: the run never left
// the re-send, and every run of a worker could fall into it at once (a
// batch the stream dropped holds events of many). Caller holds sendMu
// and mu; both are unlocked on return.
func (p *publisher) releaseHeld(held []*outgoing) {
	held = slices.Clone(held) // the queue's array: acks pop it, a failure clears it
	p.holding.Store(false)
	p.retryStart = time.Time{}
	p.endResendLocked()
	epoch, now := p.w.acks.current(), time.Now()
	for _, o := range held {
		o.batched = !o.msgID && p.w.batch != nil && p.w.batch.on()
		stampLocked(o, now, epoch)
	}
	waiting := len(p.syncs) > 0 || p.closed // a sync or flush: its commit went before these
	p.mu.Unlock()
	if h := p.w.hooks.beforeHeldSend; h != nil {
		h(held[0].seq)
	}
	first := p.sendReleased(held, waiting)
	p.sendMu.Unlock()
	if first {
		p.failed()
	}
}

// sendReleased sends the released events in order. It stops where one
// is not sent, or where an answer holds the publisher again (an event
// just sent was not stored: it would be overtaken; the re-send that answer
// started sends the rest). It reports whether the publisher failed here
// first. Caller holds sendMu.
func (p *publisher) sendReleased(held []*outgoing, waiting bool) (first bool) {
	for i, o := range held {
		if p.stopped.Load() {
			return false // failed or fenced since: send nothing
		}
		var err error
		if !p.takeTurn(o) {
			err = errHeld
		} else if err = p.send(o.seq, o); err == nil {
			if waiting && i == len(held)-1 {
				p.commitBatch()
			}
			continue
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.err != nil {
			return false // failed meanwhile: the queue is dropped
		}
		for _, unsent := range held[i:] {
			unsent.sent = false
		}
		if errors.Is(err, errHeld) || bus.Transient(err) {
			p.startResendLocked(err)
			return false
		}
		return p.failLocked(fmt.Errorf("publish to %s: %w", p.subject, err))
	}
	return false
}

// takeTurn waits for o's turn (turnLocked), o stamped sent already, and
// tells whether it may go: not if the publisher is held again, failed,
// or the connection was lost since o's stamp (its re-send sends it).
// Caller holds sendMu.
func (p *publisher) takeTurn(o *outgoing) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.holding.Load() || p.err != nil || o.epoch != p.w.acks.current() {
			return false // held, failed, or the connection lost since its stamp
		}
		wait := p.turnLocked(!o.batched, o.seq)
		if wait == nil {
			if !o.batched {
				p.singleSeq = o.seq
			}
			o.sentAt = time.Now() // its ack is timed from here
			return true
		}
		p.mu.Unlock()
		p.awaitTurn(wait)
		p.mu.Lock()
	}
}

// firstUnackedLocked returns the first unacknowledged event and the
// stream sequence of the event before it (0 for an attempt's first).
// Caller holds mu; the queue has an unacknowledged event.
func (p *publisher) firstUnackedLocked() (*outgoing, uint64) {
	prev := p.lastStream
	for _, o := range p.queue {
		if !o.acked {
			return o, prev
		}
		prev = o.stream
	}
	panic("worker: re-send without an unacknowledged event")
}

// resendOne sends o again and waits for the stream's answer: o is stored
// only if the subject's last message is expect (or, carrying a message id,
// if it is not stored yet). It returns the subject's last sequence as now
// known, whether it was read from the stream, and an error when the
// re-send must pause (the publisher has failed already if the error is
// permanent).
func (p *publisher) resendOne(ctx, sentIn context.Context, nc *nats.Conn, o *outgoing, expect uint64, wait time.Duration) (uint64, bool, error) {
	m := &nats.Msg{Subject: o.m.Subject, Data: o.m.Data, Header: o.m.Header}
	if !o.msgID {
		m.Header = nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(expect, 10)}}
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	// The connection it went out on lost: no answer comes on it.
	stop := context.AfterFunc(sentIn, cancel)
	reply, err := nc.RequestMsgWithContext(rctx, m)
	stop()
	cancel()
	if errors.Is(err, context.Canceled) && lostSince(sentIn) && ctx.Err() == nil {
		err = nats.ErrDisconnected // sent again on the new connection
	} else if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		// No answer in time (a leader election, a slow or restarted
		// server): try again within the budget; reconcile finds it if it
		// was stored after all.
		err = jetstream.ErrAsyncPublishTimeout
	}
	var stream uint64
	var dup bool
	if err == nil {
		stream, dup, err = parsePubAck(reply)
	}
	var api *jetstream.APIError
	switch {
	case err == nil:
		p.mu.Lock()
		if !o.acked { // a late ack of the original may have come first
			o.acked, o.stream, o.dup = true, stream, dup
		}
		p.popAndUnlock(false)
		return stream, false, nil
	case errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		last, err := p.reconcile(ctx, sentIn, expect, wait)
		return last, err == nil || errors.Is(err, errNoProgress), err
	case bus.Transient(err) || errors.As(err, &api) && api.ErrorCode == jsDuplicateInProcess:
		return expect, false, err
	case ctx.Err() != nil && p.w.hardCtx.Err() != nil:
		return expect, false, err // the hard stop: resend fails it as one
	}
	p.fail(fmt.Errorf("publish to %s: %w", p.subject, err))
	return expect, false, err
}

// maxStoredReads is how many re-sends of one worker read what the stream
// holds at a time. An overload's 429s make every run re-send at once, and
// thousands of reads queued on the server's API, served one after another
// and each long after its asker gave up, would keep it overloaded: a run
// waits for a slot instead, within its wait.
const maxStoredReads = 16

// storedEvent is one message reconcile found on the run's subject.
type storedEvent struct {
	attempt int
	seq     uint64
	stream  uint64
}

// reconcile reads what the run's subject holds after stream sequence
// after and applies it (see the invariants), within wait and while the
// connection of sentIn's epoch lasts. It returns the subject's last
// sequence, and an error when the re-send must pause or has failed.
func (p *publisher) reconcile(ctx, sentIn context.Context, after uint64, wait time.Duration) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	defer context.AfterFunc(sentIn, cancel)()
	var last uint64
	var err error
	if h := p.w.hooks.beforeStoredRead; h != nil {
		h(p)
	}
	select {
	case p.w.storedReads <- struct{}{}:
		last, err = p.reconcileWithin(ctx, after)
		<-p.w.storedReads
	case <-ctx.Done():
		last, err = after, fmt.Errorf("waiting to read the stored events: %w", context.Cause(ctx))
	}
	if errors.Is(err, context.Canceled) && lostSince(sentIn) {
		err = fmt.Errorf("reading the stored events: %w", nats.ErrDisconnected)
	}
	return last, err
}

func (p *publisher) reconcileWithin(ctx context.Context, after uint64) (uint64, error) {
	// Each unacknowledged event stored at most twice, and what an older
	// attempt may still have published: more is not this attempt's doing.
	limit := 4*cap(p.window) + 64
	found, last, err := p.readStored(ctx, after, limit)
	if err != nil {
		return after, fmt.Errorf("reading the stored events: %w", err)
	}
	if len(found) > limit {
		p.fail(fmt.Errorf("publish to %s: more than %d messages stored after %d", p.subject, limit, after))
		return last, errPublisherClosed
	}
	if len(found) == 0 {
		// Refused, yet nothing after after: the subject lost messages
		// (limits): ask for its last.
		m, err := p.w.eventsStream.GetLastMsgForSubject(ctx, p.subject)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			last = 0
		case err != nil:
			return after, fmt.Errorf("reading the stored events: %w", err)
		default:
			last = m.Sequence
		}
	}
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return last, errPublisherClosed
	}
	if bad := p.applyStoredLocked(found); bad != nil {
		first := p.failLocked(bad)
		p.mu.Unlock()
		if first {
			p.failed()
		}
		return last, bad
	}
	p.popAndUnlock(false)
	if len(found) == 0 {
		// Nothing new stored: in a cluster, a message of the subject
		// still being replicated refuses the expectation (10164); pause.
		return last, errNoProgress
	}
	return last, nil
}

// readStored reads what the run's subject holds after stream sequence
// after, up to limit+1 messages, one read per message (through the
// JetStream API, which only the stream's leader answers: a direct get may
// be served by a follower behind it), and returns those that decode and
// the last one's sequence (after if none).
func (p *publisher) readStored(ctx context.Context, after uint64, limit int) ([]storedEvent, uint64, error) {
	var found []storedEvent
	last := after
	for len(found) <= limit {
		m, err := p.w.eventsStream.GetMsg(ctx, last+1, jetstream.WithGetMsgSubject(p.subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, after, err
		}
		last = m.Sequence
		if env, err := bus.DecodeEnvelope(m.Data); err == nil {
			found = append(found, storedEvent{attempt: env.Attempt, seq: env.Seq, stream: m.Sequence})
		}
	}
	return found, last, nil
}

// applyStoredLocked takes this attempt's events found stored, in stream
// order, as acked. Caller holds mu.
func (p *publisher) applyStoredLocked(found []storedEvent) error {
	if len(p.queue) == 0 {
		return nil
	}
	head := p.queue[0].seq
	for _, f := range found {
		switch {
		case f.attempt > p.attempt:
			return fmt.Errorf("%w (attempt %d, seq %d, at %d)", errSuperseded, f.attempt, f.seq, f.stream)
		case f.attempt < p.attempt || f.seq < head || f.seq-head >= uint64(len(p.queue)):
			continue
		}
		i := f.seq - head
		o := p.queue[i]
		if o.acked && !o.approx && o.stream != f.stream {
			continue // the first of its seq stands; this is a copy
		}
		// Stored (acked already or not), every event before it must be:
		// one that is not was lost, and a re-send would store it after.
		for _, e := range p.queue[:i] {
			if !e.acked {
				return fmt.Errorf("%w (event %d stored at %d, event %d missing)", errOutOfOrder, f.seq, f.stream, e.seq)
			}
		}
		o.acked, o.stream, o.approx = true, f.stream, false
	}
	return nil
}

// resendStateLocked ends the re-send when it is over: failed, nothing left
// unacknowledged, or past the budget (then first tells whether this
// failure is the publisher's first). Caller holds mu.
func (p *publisher) resendStateLocked(cause error) (done, first bool) {
	switch {
	case p.err != nil:
	case !p.unackedLocked():
		p.holding.Store(false)
		p.retryStart = time.Time{}
	case !p.retryStart.IsZero() && time.Since(p.retryStart) > p.budget:
		p.endResendLocked()
		first = p.failLocked(p.budgetSpent(cause))
		return true, first
	default:
		if p.retryStart.IsZero() {
			// The queue emptied under the re-send (its budget cleared) and
			// a new event came: it has a budget of its own.
			p.retryStart = time.Now()
		}
		return false, false
	}
	p.endResendLocked()
	return true, false
}

// endResendLocked marks the re-send goroutine gone. Caller holds mu.
func (p *publisher) endResendLocked() {
	p.resending = false
	if p.stopResend != nil {
		p.stopResend()
		p.stopResend = nil
	}
	p.finishLocked()
}

// unackedLocked tells whether an event waits for its ack. Caller holds mu.
func (p *publisher) unackedLocked() bool {
	for _, o := range p.queue {
		if !o.acked {
			return true
		}
	}
	return false
}

// failLocked records the first failure and drops the queue; it reports
// whether this was the first. Caller holds mu; the caller then runs
// failed unless the failure is the lease's.
func (p *publisher) failLocked(err error) bool {
	first := p.err == nil
	if first {
		p.err = err
	}
	if !p.stopped.Swap(true) {
		close(p.stopCh)
	}
	p.turnChangedLocked()
	if p.stopResend != nil {
		p.stopResend() // its request in flight ends now
	}
	p.dropLocked()
	p.finishLocked()
	return first
}

// failed reports the publisher's failure (once, after failLocked).
func (p *publisher) failed() {
	p.mu.Lock()
	err := p.err
	p.mu.Unlock()
	p.wake()
	if errors.Is(err, errLeaseLost) {
		return
	}
	if !errors.Is(err, errWorkerStopping) { // not the stream's doing
		p.w.obs.PublishFailed(err)
	}
	if p.onFail != nil {
		p.onFail(err)
	}
}

// finishLocked closes done once nothing is left to do. Caller holds mu.
func (p *publisher) finishLocked() {
	if p.finished || !p.closed || len(p.queue) > 0 || p.resending {
		return
	}
	p.finished = true
	close(p.done)
	p.w.acks.remove(p.ackID)
}

// dropLocked releases every queued event after a failure.
func (p *publisher) dropLocked() {
	for range p.queue {
		<-p.window
	}
	clear(p.queue)
	p.queue = p.queue[:0]
	p.releaseSyncLocked(true)
}

func (p *publisher) fail(err error) {
	p.mu.Lock()
	first := p.failLocked(err)
	p.mu.Unlock()
	if first {
		p.failed()
	} else {
		p.wake()
	}
}

// fence stops publishing at once (the lease is lost): nothing more is sent.
func (p *publisher) fence() {
	p.fail(errLeaseLost)
}

// acquire takes a window slot, blocking while the window is full.
func (p *publisher) acquire() {
	select {
	case p.window <- struct{}{}:
		return
	default:
	}
	start := time.Now()
	p.window <- struct{}{}
	p.w.obs.PublishWait(time.Since(start))
}

// carriesMsgID tells the events published with a Nats-Msg-Id (protocol
// 1.4): a publisher's first (a re-send of it knows no predecessor to be
// stored after) and the run's lifecycle events, which another party may
// publish for the same attempt and seq (a give-up retried, a redelivery
// finishing a crashed run's run_finished) and which must be stored once.
// The agent's events have one publisher, their attempt's, whose re-send
// stores each only after its predecessor (see the invariants).
func carriesMsgID(typ string, first bool) bool {
	switch typ {
	case bus.EventRunStarted, bus.EventRunResumed, bus.EventRunFinished:
		return true
	}
	return first
}

// event publishes one encoded event and returns its seq.
func (p *publisher) event(typ string, event []byte, controlSeq uint64) (uint64, error) {
	return p.eventFlags(typ, event, controlSeq, false)
}

func (p *publisher) eventFlags(typ string, event []byte, controlSeq uint64, interrupted bool) (uint64, error) {
	p.acquire()
	p.sendMu.Lock()
	p.mu.Lock()
	var epoch uint64
	var send bool
	for {
		if p.err != nil || p.closed {
			err := p.err
			p.mu.Unlock()
			p.sendMu.Unlock()
			<-p.window
			if err == nil {
				err = errPublisherClosed
			}
			return 0, err
		}
		// Sent at once unless held (the re-send then sends it in its
		// turn), and only in its turn (turnLocked).
		if epoch, send = p.mayOvertakeLocked(); !send {
			break
		}
		b := p.w.batch
		plain := carriesMsgID(typ, p.lastStream == 0 && len(p.queue) == 0) || b == nil || !b.on()
		wait := p.turnLocked(plain, p.seq+1)
		if wait == nil {
			break
		}
		p.mu.Unlock()
		p.awaitTurn(wait)
		p.mu.Lock()
	}
	seq := p.seq + 1
	now := time.Now()
	data := p.appendEnvelope(make([]byte, 0, len(event)+len(p.envHead)+len(p.envMid)+64),
		seq, now.UnixMilli(), controlSeq, interrupted, event)
	if len(data) > p.limit {
		p.mu.Unlock()
		p.sendMu.Unlock()
		<-p.window
		return 0, &EventTooLargeError{Type: typ, Size: len(data), Limit: p.limit}
	}
	o := &outgoing{seq: seq}
	m := &o.m
	m.Subject, m.Data = p.subject, data
	if o.msgID = carriesMsgID(typ, p.lastStream == 0 && len(p.queue) == 0); o.msgID {
		m.Header = nats.Header{jetstream.MsgIDHeader: []string{p.msgIDHead + strconv.FormatUint(seq, 10)}}
	}
	if send {
		// Not behind an unacknowledged event sent singly: were that one
		// lost to a reconnect, its re-send (with a message id, so without
		// an expectation) would be stored after this one unnoticed.
		o.batched = !o.msgID && p.w.batch != nil && p.w.batch.on() && !p.singleUnackedLocked()
		if !o.batched {
			p.singleSeq = seq
		}
		stampLocked(o, now, epoch)
	} else {
		p.startResendLocked(nats.ErrDisconnected) // sent with the others when NATS is back
	}
	p.seq = seq
	p.sent++
	p.sentBytes += int64(len(data))
	p.queue = append(p.queue, o)
	p.mu.Unlock()
	var failed error
	first := false
	if send {
		if p.stopped.Load() {
			// failed or fenced since the checks: send nothing
		} else if err := p.send(seq, o); err != nil {
			p.mu.Lock()
			o.sent = false
			if errors.Is(err, errHeld) || bus.Transient(err) {
				p.startResendLocked(err)
			} else {
				failed = fmt.Errorf("publish to %s: %w", p.subject, err)
				first = p.failLocked(failed)
			}
			p.mu.Unlock()
		}
	}
	p.sendMu.Unlock()
	if failed != nil {
		if first {
			p.failed()
		}
		return 0, failed
	}
	return seq, nil
}

// turnLocked returns, when the event seq (plain: sent singly) may not go
// out yet, a channel closed once that may have changed, else nil. While
// the stream takes batches, an event sent singly has its run to itself:
// it goes out once every earlier event of the run is answered, and no
// later one goes out before its answer. A single send carries no
// expectation; two in flight at once, or one beside a batch, were stored
// out of order when the stream dropped the earlier (429, overloaded) and
// took the later, and the attempt failed (it is handed back). A run
// waits a round trip after its run_started, and each event of a run
// waits one while batches are paused. With batches off (the stream does
// not allow them) single sends stay pipelined, as before batches: a lost
// one fails the attempt. Caller holds mu.
func (p *publisher) turnLocked(plain bool, seq uint64) <-chan struct{} {
	b := p.w.batch
	switch {
	case b == nil:
		return nil
	case b.off.Load():
		// Pipelined, but not beside a batched event still unanswered
		// (batches were just turned off, and it may be refused).
		if !plain || !p.unackedBeforeLocked(seq, true) {
			return nil
		}
	case plain:
		if !p.unackedBeforeLocked(seq, false) {
			return nil
		}
	case !p.singleUnackedLocked():
		return nil
	}
	if p.turn == nil {
		p.turn = make(chan struct{})
	}
	return p.turn
}

// turnChangedLocked wakes the events waiting for their turn. Caller
// holds mu.
func (p *publisher) turnChangedLocked() {
	if p.turn != nil {
		close(p.turn)
		p.turn = nil
	}
}

// awaitTurn waits on wait (from turnLocked), having the event batch
// answer now, as a sync does; a hard stop fails the publisher. Caller
// holds sendMu, not mu: what closes wait (acks, a re-send starting, a
// failure) does not take sendMu.
func (p *publisher) awaitTurn(wait <-chan struct{}) {
	p.commitBatch()
	select {
	case <-wait:
	case <-p.w.hardCtx.Done():
		p.mu.Lock()
		first := p.failLocked(fmt.Errorf("publish to %s: %w", p.subject, errWorkerStopping))
		p.mu.Unlock()
		if first {
			go p.failed() // not under sendMu: onFail may publish
		}
	}
}

// failure returns the publisher's failure, nil if none.
func (p *publisher) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// unackedBeforeLocked tells whether an event before seq (sent in a
// batch, if batched) waits for its answer. Caller holds mu.
func (p *publisher) unackedBeforeLocked(seq uint64, batched bool) bool {
	for _, o := range p.queue {
		if o.seq >= seq {
			return false
		}
		if !o.acked && (o.batched || !batched) {
			return true
		}
	}
	return false
}

// singleUnackedLocked tells whether the last event sent singly waits for
// its ack. Caller holds mu.
func (p *publisher) singleUnackedLocked() bool {
	if p.singleSeq == 0 || len(p.queue) == 0 {
		return false
	}
	head := p.queue[0].seq
	return p.singleSeq >= head && !p.queue[p.singleSeq-head].acked
}

// send puts o on the wire: in the event batch if it may go in one, else
// plainly. Caller holds sendMu.
func (p *publisher) send(seq uint64, o *outgoing) error {
	b := p.w.batch
	if o.batched {
		if h := p.w.hooks.beforeBatchSend; h != nil {
			h(p, seq)
		}
		if ok, err := b.publish(p, seq, &o.m, o.epoch); ok {
			return err
		}
		p.mu.Lock()
		o.batched = false // batches are off since
		p.mu.Unlock()
	}
	// Every single send takes its turn here too: batches may have paused
	// or turned off since its publisher's check, which took it for batched.
	if b != nil && (b.holds(p) || !p.takeTurn(o)) {
		return errHeld
	}
	if h := p.w.hooks.beforeSingleSend; h != nil {
		h(p, seq)
	}
	o.m.Reply = p.replyHead + strconv.FormatUint(seq, 10)
	return p.w.c.Conn().PublishMsg(&o.m)
}

// commitBatch has the event batch answer now if an event of p waits in
// it (sync, flush).
func (p *publisher) commitBatch() {
	b := p.w.batch
	if b == nil {
		return
	}
	p.mu.Lock()
	waits := false
	for _, o := range p.queue {
		if o.batched && !o.acked {
			waits = true
			break
		}
	}
	p.mu.Unlock()
	if waits {
		b.commitFor(p)
	}
}

// spent returns the events and bytes published so far.
func (p *publisher) spent() (int, int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent, p.sentBytes
}

// charge counts earlier attempts' events against the run's event budget;
// a copy (an attempt's seq stored again) is not counted twice.
func (p *publisher) charge(envs []*bus.Envelope) {
	last := map[int]uint64{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range envs {
		if e.Seq <= last[e.Attempt] {
			continue
		}
		last[e.Attempt] = e.Seq
		p.sent++
		p.sentBytes += int64(len(e.Event)) + 160 // envelope fields, roughly
	}
}

// fleetEvent encodes and publishes a fleet event (run_started, ...).
func (p *publisher) fleetEvent(typ string, v any) (uint64, error) {
	data, err := agent.MarshalJSON(v)
	if err != nil {
		return 0, err
	}
	return p.event(typ, data, 0)
}

// startedAt waits until the attempt's first event (run_started) is stored
// and returns its stream sequence.
func (p *publisher) startedAt(ctx context.Context) (uint64, error) {
	select {
	case <-p.first:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.firstStream, nil
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.firstStream != 0 {
			return p.firstStream, nil
		}
		return 0, cmpErr(p.err, errPublisherClosed)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// syncWaiter is a sync waiting for the events up to upTo.
type syncWaiter struct {
	upTo uint64
	ch   chan struct{}
}

// sync waits until every event published before it is stored (not the
// ones published meanwhile: a parallel call's updates would keep a
// queue from emptying).
func (p *publisher) sync(ctx context.Context) error {
	p.mu.Lock()
	upTo := p.seq
	p.mu.Unlock()
	for {
		p.mu.Lock()
		err := p.err
		var ch chan struct{}
		if err == nil && !p.storedUpToLocked(upTo) {
			ch = make(chan struct{})
			p.syncs = append(p.syncs, syncWaiter{upTo, ch})
		}
		p.mu.Unlock()
		if err != nil {
			return err
		}
		if ch == nil {
			return nil
		}
		p.commitBatch()
		select {
		case <-ch:
		case <-ctx.Done():
			p.mu.Lock()
			p.syncs = slices.DeleteFunc(p.syncs, func(sw syncWaiter) bool { return sw.ch == ch })
			p.mu.Unlock()
			return fmt.Errorf("waiting for event acks: %w", ctx.Err())
		}
	}
}

// storedUpToLocked tells whether the events up to seq are stored: acks
// pop the queue's head in order. Caller holds mu.
func (p *publisher) storedUpToLocked(seq uint64) bool {
	return len(p.queue) == 0 || p.queue[0].seq > seq
}

// releaseSyncLocked wakes the sync waiters whose events are stored, or
// all of them (a failure). Caller holds mu.
func (p *publisher) releaseSyncLocked(all bool) {
	kept := p.syncs[:0]
	for _, sw := range p.syncs {
		if all || p.storedUpToLocked(sw.upTo) {
			close(sw.ch)
		} else {
			kept = append(kept, sw)
		}
	}
	clear(p.syncs[len(kept):])
	p.syncs = kept
}

// flush waits until every publish is acked (or ctx is done) and closes
// the publisher. It returns the first publish error.
func (p *publisher) flush(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	p.finishLocked()
	p.mu.Unlock()
	p.wake()
	p.commitBatch()
	select {
	case <-p.done:
	case <-ctx.Done():
		p.fail(fmt.Errorf("waiting for event acks: %w", ctx.Err()))
		<-p.done
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// abandon closes the publisher without waiting for acks (lease lost).
func (p *publisher) abandon() {
	p.fence()
	p.mu.Lock()
	p.closed = true
	p.finishLocked()
	p.mu.Unlock()
	p.wake()
	<-p.done
}

func cmpErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}
