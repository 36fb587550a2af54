package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
)

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
// the caller (the agent's listener): back-pressure.
//
// Events stay in order and gapless across NATS outages: an event is only
// sent while the connection is up; when an ack fails for a reason that a
// reconnect cures (disconnect, timeout, no responders, 503), the publisher
// holds new events, waits for the connection and re-sends every
// unacknowledged event in seq order with its Nats-Msg-Id, so those already
// stored are dropped as duplicates. Acks must come back with increasing
// stream sequences; if not (a lost event stored after a later one), the
// attempt fails and is handed back. The retry budget is AckWait: past it
// the request is redelivered anyway.
type publisher struct {
	w       *Worker
	run     string
	attempt int
	subject string
	// The constant parts of the envelopes and of their message ids.
	envHead, envMid, msgIDHead string
	limit                      int
	budget                     time.Duration

	window chan struct{}
	kick   chan struct{}
	done   chan struct{}
	first  chan struct{} // closed when seq 1 is acked

	mu          sync.Mutex
	queue       []*outgoing     // unacknowledged, in seq order
	drained     []chan struct{} // sync waiters: closed when queue empties or a publish fails
	seq         uint64
	holding     bool // do not send: disconnected, or re-sending
	closed      bool
	err         error
	lastStream  uint64 // stream sequence of the last acked event
	sent        int    // events published, for the run's event budget
	sentBytes   int64
	firstStream uint64
	onFail      func(error)
}

type outgoing struct {
	seq uint64
	m   nats.Msg
	f   jetstream.PubAckFuture // nil: not sent yet
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
	go p.ackLoop()
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

// retryable tells publish errors that a reconnect or a new stream leader
// cures.
func retryable(err error) bool {
	if errors.Is(err, nats.ErrDisconnected) || errors.Is(err, jetstream.ErrAsyncPublishTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
		return true
	}
	var api *jetstream.APIError
	return errors.As(err, &api) && api.Code == 503
}

func (p *publisher) ackLoop() {
	defer close(p.done)
	var retryStart time.Time
	for {
		p.mu.Lock()
		if p.err != nil {
			p.dropLocked()
		}
		if len(p.queue) == 0 {
			if p.closed {
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			<-p.kick
			continue
		}
		head := p.queue[0]
		f := head.f
		p.mu.Unlock()
		if f == nil {
			if err := p.resend(&retryStart, nil); err != nil {
				p.fail(err)
			}
			continue
		}
		select {
		case <-p.kick:
			// re-check: failed, fenced or closing
		case ack := <-f.Ok():
			p.acked(head, ack)
			retryStart = time.Time{}
		case err := <-f.Err():
			if !retryable(err) {
				p.fail(fmt.Errorf("publish to %s: %w", p.subject, err))
				continue
			}
			if err := p.resend(&retryStart, err); err != nil {
				p.fail(err)
			}
		}
	}
}

func (p *publisher) acked(o *outgoing, ack *jetstream.PubAck) {
	p.mu.Lock()
	if len(p.queue) == 0 || p.queue[0] != o {
		p.mu.Unlock()
		return
	}
	if ack.Sequence <= p.lastStream {
		p.mu.Unlock()
		p.fail(fmt.Errorf("%w (event %d stored at %d, before %d)", errOutOfOrder, o.seq, ack.Sequence, p.lastStream))
		return
	}
	p.lastStream = ack.Sequence
	p.queue[0] = nil
	p.queue = p.queue[1:]
	if o.seq == 1 {
		p.firstStream = ack.Sequence
		close(p.first)
	}
	if len(p.queue) == 0 {
		p.releaseSyncLocked()
	}
	p.mu.Unlock()
	<-p.window
	if !ack.Duplicate {
		p.w.obs.EventPublished()
	}
}

// resend waits for the connection and re-sends every unacknowledged event
// in order. It returns an error once the retry budget is spent.
func (p *publisher) resend(start *time.Time, cause error) error {
	if start.IsZero() {
		*start = time.Now()
		if cause != nil {
			p.w.log.Warn("event publish not acknowledged; re-sending when NATS is back", "run", p.run, "err", cause)
		}
	}
	p.mu.Lock()
	p.holding = true
	p.mu.Unlock()
	nc := p.w.c.Conn()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if time.Since(*start) > p.budget {
			if cause == nil {
				cause = nats.ErrDisconnected
			}
			return fmt.Errorf("publish to %s: not stored within %s: %w", p.subject, p.budget, cause)
		}
		p.mu.Lock()
		if p.err != nil {
			p.mu.Unlock()
			return nil
		}
		if nc.IsConnected() {
			sent := true
			for _, o := range p.queue {
				f, err := p.w.js.PublishMsgAsync(&o.m)
				if err != nil {
					sent = false
					o.f = nil
					break
				}
				o.f = f
			}
			if sent {
				p.holding = false
				p.mu.Unlock()
				return nil
			}
		}
		p.mu.Unlock()
		select {
		case <-t.C:
		case <-p.w.hardCtx.Done():
			return fmt.Errorf("publish to %s: worker stopping: %w", p.subject, cause)
		}
	}
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
	first := p.err == nil
	if first {
		p.err = err
	}
	p.releaseSyncLocked()
	p.mu.Unlock()
	p.wake()
	if first && !errors.Is(err, errLeaseLost) {
		p.w.obs.PublishFailed(err)
		if p.onFail != nil {
			p.onFail(err)
		}
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
	p.mu.Lock()
	if p.err != nil || p.closed {
		err := p.err
		p.mu.Unlock()
		<-p.window
		if err == nil {
			err = errPublisherClosed
		}
		return 0, err
	}
	seq := p.seq + 1
	data := p.appendEnvelope(make([]byte, 0, len(event)+len(p.envHead)+len(p.envMid)+64),
		seq, time.Now().UnixMilli(), controlSeq, interrupted, event)
	if len(data) > p.limit {
		p.mu.Unlock()
		<-p.window
		return 0, &EventTooLargeError{Type: typ, Size: len(data), Limit: p.limit}
	}
	o := &outgoing{seq: seq}
	m := &o.m
	m.Subject, m.Data = p.subject, data
	m.Header = nats.Header{jetstream.MsgIDHeader: []string{p.msgIDHead + strconv.FormatUint(seq, 10)}}
	if !p.holding && p.w.c.Conn().IsConnected() {
		f, err := p.w.js.PublishMsgAsync(m)
		switch {
		case err == nil:
			o.f = f
		case retryable(err):
			p.holding = true // sent with the others when NATS is back
		default:
			p.mu.Unlock()
			<-p.window
			err = fmt.Errorf("publish to %s: %w", p.subject, err)
			p.fail(err)
			return 0, err
		}
	} else {
		p.holding = true
	}
	p.seq = seq
	p.sent++
	p.sentBytes += int64(len(data))
	p.queue = append(p.queue, o)
	p.mu.Unlock()
	p.wake()
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
