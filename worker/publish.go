package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
//     seq to the end of its publish, and by a re-send over all of its
//     publishes. mu guards the state and is never held over a publish,
//     so the ack callback never waits on the connection.
//   - A new event is sent at once only if it cannot overtake an earlier
//     one: nothing is held, the connection is up, no disconnect is
//     pending in eventAcks, and the oldest unacknowledged event was sent
//     on this connection (its epoch). Otherwise it is held: one re-send
//     goroutine waits for the connection and re-sends every
//     unacknowledged event in seq order with its Nats-Msg-Id, so those
//     already stored are dropped as duplicates. So does an ack that fails
//     for a reason a reconnect cures (timeout, no responders, 503), after
//     a pause. (A loss between the check and the publish can still let an
//     event overtake; its ack then comes out of order, below.) The retry
//     budget is AckWait from the first failure, counted again from each
//     ack that comes meanwhile, and cleared once nothing waits: past it
//     the request is redelivered anyway.
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
	// nothing more (a fenced attempt must not).
	stopped atomic.Bool

	mu          sync.Mutex
	queue       []*outgoing     // see the invariants
	drained     []chan struct{} // sync waiters: closed when queue empties or a publish fails
	seq         uint64
	holding     bool // do not send: disconnected, or re-sending
	resending   bool // the re-send goroutine runs
	again       bool // a failure came while it ran: it goes on
	retryStart  time.Time
	closed      bool
	finished    bool // done is closed
	err         error
	lastStream  uint64 // stream sequence of the last popped event
	sent        int    // events published, for the run's event budget
	sentBytes   int64
	firstStream uint64
	onFail      func(error)
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
	if p.holding || !p.w.c.Conn().IsConnected() {
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

// ackArrived applies the ack of the event seq (eventAcks' callback: it
// must not block).
func (p *publisher) ackArrived(seq, stream uint64, dup bool, ackErr error) {
	p.mu.Lock()
	if p.err != nil || len(p.queue) == 0 {
		p.mu.Unlock()
		return
	}
	head := p.queue[0].seq
	if seq < head || seq-head >= uint64(len(p.queue)) {
		p.mu.Unlock() // a late ack of an event already popped
		return
	}
	o := p.queue[seq-head]
	if o.acked {
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
	if first {
		go p.failed()
	}
}

// popLocked pops the acked events at the queue's head: how many, how many
// of them were new to the stream, and an error if one was stored out of
// order. Caller holds mu.
func (p *publisher) popLocked() (popped, stored int, bad error) {
	for len(p.queue) > 0 && p.queue[0].acked {
		o := p.queue[0]
		if o.stream <= p.lastStream {
			return popped, stored, fmt.Errorf("%w (event %d stored at %d, before %d)", errOutOfOrder, o.seq, o.stream, p.lastStream)
		}
		p.lastStream = o.stream
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
	switch {
	case popped == 0:
	case p.resending && len(p.queue) > 0:
		p.retryStart = time.Now() // progress: the budget starts again
	default:
		p.retryStart = time.Time{}
	}
	if popped > 0 && len(p.queue) == 0 {
		p.releaseSyncLocked()
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
	p.holding = true
	if p.err != nil {
		return
	}
	if p.resending {
		p.again = true
		return
	}
	p.resending = true
	warn := p.retryStart.IsZero()
	if warn {
		p.retryStart = time.Now()
	}
	go p.resend(cause, warn)
}

// resend waits for the connection and re-sends every unacknowledged event
// in order. It fails the publisher once the retry budget is spent.
func (p *publisher) resend(cause error, warn bool) {
	if warn {
		p.w.log.Warn("event publish not acknowledged; re-sending when NATS is back", "run", p.run, "err", cause)
	}
	nc := p.w.c.Conn()
	// The stream answered no (503, no responders) or nothing: ask again
	// only after a pause, or an outage would be a loop of re-sends.
	pause := func(cause error) time.Time {
		if errors.Is(cause, nats.ErrDisconnected) {
			return time.Now()
		}
		return time.Now().Add(resendPause)
	}
	notBefore := pause(cause)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var batch []*outgoing
	for {
		p.sendMu.Lock()
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
		batch = batch[:0]
		if !time.Now().Before(notBefore) && nc.IsConnected() {
			p.again = false
			now, epoch := time.Now(), p.w.acks.current()
			for _, o := range p.queue {
				if !o.acked {
					stampLocked(o, now, epoch)
					batch = append(batch, o)
				}
			}
		}
		p.mu.Unlock()
		sent := len(batch) > 0
		for i, o := range batch {
			if h := p.w.beforeEventResend; h != nil {
				h(o.seq)
			}
			if p.stopped.Load() {
				break // fenced or failed: the loop's top ends it
			}
			if nc.PublishMsg(&o.m) != nil {
				p.mu.Lock()
				for _, o := range batch[i:] {
					o.sent = false
				}
				p.mu.Unlock()
				sent = false
				break
			}
		}
		clear(batch)
		if sent {
			p.mu.Lock()
			if !p.again {
				p.holding, p.resending = false, false
				p.finishLocked()
				p.mu.Unlock()
				p.sendMu.Unlock()
				return
			}
			notBefore = pause(jetstream.ErrAsyncPublishTimeout) // an ack failed meanwhile
			p.mu.Unlock()
		}
		p.sendMu.Unlock()
		select {
		case <-t.C:
		case <-p.kick:
		case <-p.w.hardCtx.Done():
			p.fail(fmt.Errorf("publish to %s: worker stopping: %w", p.subject, cause))
		}
	}
}

// resendStateLocked ends the re-send when it is over: failed, nothing left
// unacknowledged, or past the budget (then first tells whether this
// failure is the publisher's first). Caller holds mu.
func (p *publisher) resendStateLocked(cause error) (done, first bool) {
	switch {
	case p.err != nil:
	case !p.unackedLocked():
		p.holding, p.retryStart = false, time.Time{}
	case !p.retryStart.IsZero() && time.Since(p.retryStart) > p.budget:
		p.resending = false
		first = p.failLocked(p.budgetSpent(cause))
		return true, first
	default:
		return false, false
	}
	p.resending, p.again = false, false
	p.finishLocked()
	return true, false
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
	p.stopped.Store(true)
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
	p.w.obs.PublishFailed(err)
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
	p.releaseSyncLocked()
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

// event publishes one encoded event and returns its seq.
func (p *publisher) event(typ string, event []byte, controlSeq uint64) (uint64, error) {
	return p.eventFlags(typ, event, controlSeq, false)
}

func (p *publisher) eventFlags(typ string, event []byte, controlSeq uint64, interrupted bool) (uint64, error) {
	p.acquire()
	p.sendMu.Lock()
	p.mu.Lock()
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
	m.Reply = p.replyHead + strconv.FormatUint(seq, 10)
	m.Header = nats.Header{jetstream.MsgIDHeader: []string{p.msgIDHead + strconv.FormatUint(seq, 10)}}
	epoch, send := p.mayOvertakeLocked()
	if send {
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
		} else if err := p.w.c.Conn().PublishMsg(m); err != nil {
			p.mu.Lock()
			o.sent = false
			if bus.Transient(err) {
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

// spent returns the events and bytes published so far.
func (p *publisher) spent() (int, int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent, p.sentBytes
}

// charge counts earlier attempts' events against the run's event budget.
func (p *publisher) charge(envs []*bus.Envelope) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range envs {
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

// sync waits until every event published so far is stored.
func (p *publisher) sync(ctx context.Context) error {
	for {
		p.mu.Lock()
		n, err := len(p.queue), p.err
		var ch chan struct{}
		if err == nil && n > 0 {
			ch = make(chan struct{})
			p.drained = append(p.drained, ch)
		}
		p.mu.Unlock()
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for event acks: %w", ctx.Err())
		}
	}
}

// releaseSyncLocked wakes the sync waiters. Caller holds mu.
func (p *publisher) releaseSyncLocked() {
	for _, ch := range p.drained {
		close(ch)
	}
	p.drained = nil
}

// flush waits until every publish is acked (or ctx is done) and closes
// the publisher. It returns the first publish error.
func (p *publisher) flush(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	p.finishLocked()
	p.mu.Unlock()
	p.wake()
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
