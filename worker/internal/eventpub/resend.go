package eventpub

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/natserr"
)

// resendPause is how long a re-send waits after the stream answered an
// event with an error, or left it unanswered (nats.go waits as long
// between its own retries).
const resendPause = 250 * time.Millisecond

// budgetSpent is the failure of events not stored within the budget.
func (p *Publisher) budgetSpent(cause error) error {
	return fmt.Errorf("publish to %s: not stored within %s: %w", p.subject, p.budget, cause)
}

// startResendLocked holds new events and starts the re-send goroutine
// unless it runs. Caller holds mu.
func (p *Publisher) startResendLocked(cause error) {
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
	ctx, cancel := context.WithCancel(p.env.Stop)
	p.stopResend = cancel
	go p.resend(ctx, cause, warn)
}

// resend waits for the connection and re-sends the unacknowledged events
// one at a time, in seq order (see the invariants), new ones held
// meanwhile included. It ends once nothing waits for an ack, and fails the
// publisher once the retry budget is spent.
func (p *Publisher) resend(ctx context.Context, cause error, warn bool) {
	if warn {
		p.env.Log.Warn("event publish not acknowledged; re-sending when NATS is back", "run", p.run, "err", cause)
	}
	nc := p.env.Conn
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
		batchHeld := p.env.Batch != nil && p.env.Batch.endedHolds(p) // before mu: the batch takes it after its own
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
			wait = p.env.AckTimeout
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
			epoch, sentIn = p.env.Acks.currentWithContext()
			stampLocked(o, time.Now(), epoch)
		}
		p.mu.Unlock()
		p.sendMu.Unlock()
		if o != nil {
			p.env.Signals.beforeResend(o.seq)
			if p.stopped.Load() {
				continue // fenced or failed: the loop's top ends it
			}
			var err error
			known, read, err = p.resendOne(ctx, sentIn, o, expect, wait)
			if err == nil {
				continue
			}
			if ctx.Err() != nil && p.env.Stop.Err() != nil { // whatever the request made of it
				p.fail(fmt.Errorf("publish to %s: %w: %w", p.subject, ErrStopped, err))
				continue // the loop's top ends it
			}
			cause, notBefore = err, pause(err)
		}
		select {
		case <-t.C:
		case <-p.kick:
		case <-p.env.Stop.Done():
			p.fail(fmt.Errorf("publish to %s: %w: %w", p.subject, ErrStopped, cause))
		}
	}
}

// heldOnlyLocked returns the unacknowledged events if none of them was
// sent (all were held), else nil. Caller holds mu.
func (p *Publisher) heldOnlyLocked() []*outgoing {
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
func (p *Publisher) releaseHeld(held []*outgoing) {
	held = slices.Clone(held) // the queue's array: acks pop it, a failure clears it
	p.holding.Store(false)
	p.retryStart = time.Time{}
	p.endResendLocked()
	epoch, now := p.env.Acks.current(), time.Now()
	for _, o := range held {
		o.batched = !o.msgID && p.env.Batch != nil && p.env.Batch.on()
		stampLocked(o, now, epoch)
	}
	waiting := len(p.syncs) > 0 || p.closed // a sync or flush: its commit went before these
	p.mu.Unlock()
	p.env.Signals.beforeHeldSend(held[0].seq)
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
func (p *Publisher) sendReleased(held []*outgoing, waiting bool) (first bool) {
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
		if errors.Is(err, errHeld) || natserr.Transient(err) {
			p.startResendLocked(err)
			return false
		}
		return p.failLocked(fmt.Errorf("publish to %s: %w", p.subject, err))
	}
	return false
}

// firstUnackedLocked returns the first unacknowledged event and the
// stream sequence of the event before it (0 for an attempt's first).
// Caller holds mu; the queue has an unacknowledged event.
func (p *Publisher) firstUnackedLocked() (*outgoing, uint64) {
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
func (p *Publisher) resendOne(ctx, sentIn context.Context, o *outgoing, expect uint64, wait time.Duration) (uint64, bool, error) {
	m := &nats.Msg{Subject: o.m.Subject, Data: o.m.Data, Header: o.m.Header}
	if !o.msgID {
		m.Header = nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(expect, 10)}}
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	// The connection it went out on lost: no answer comes on it.
	stop := context.AfterFunc(sentIn, cancel)
	reply, err := p.env.Out.RequestMsgWithContext(rctx, m)
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
	case natserr.Transient(err) || errors.As(err, &api) && api.ErrorCode == jsDuplicateInProcess:
		return expect, false, err
	case ctx.Err() != nil && p.env.Stop.Err() != nil:
		return expect, false, err // the hard stop: resend fails it as one
	}
	p.fail(fmt.Errorf("publish to %s: %w", p.subject, err))
	return expect, false, err
}

// MaxStoredReads is how many re-sends of one worker read what the stream
// holds at a time. An overload's 429s make every run re-send at once, and
// thousands of reads queued on the server's API, served one after another
// and each long after its asker gave up, would keep it overloaded: a run
// waits for a slot instead, within its wait.
const MaxStoredReads = 16

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
func (p *Publisher) reconcile(ctx, sentIn context.Context, after uint64, wait time.Duration) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	defer context.AfterFunc(sentIn, cancel)()
	var last uint64
	var err error
	p.env.Signals.beforeStoredRead(p)
	select {
	case p.env.StoredReads <- struct{}{}:
		last, err = p.reconcileWithin(ctx, after)
		<-p.env.StoredReads
	case <-ctx.Done():
		last, err = after, fmt.Errorf("waiting to read the stored events: %w", context.Cause(ctx))
	}
	if errors.Is(err, context.Canceled) && lostSince(sentIn) {
		err = fmt.Errorf("reading the stored events: %w", nats.ErrDisconnected)
	}
	return last, err
}

func (p *Publisher) reconcileWithin(ctx context.Context, after uint64) (uint64, error) {
	// Each unacknowledged event stored at most twice, and what an older
	// attempt may still have published: more is not this attempt's doing.
	limit := 4*cap(p.window) + 64
	found, last, err := p.readStored(ctx, after, limit)
	if err != nil {
		return after, fmt.Errorf("reading the stored events: %w", err)
	}
	if len(found) > limit {
		p.fail(fmt.Errorf("publish to %s: more than %d messages stored after %d", p.subject, limit, after))
		return last, ErrClosed
	}
	if len(found) == 0 {
		// Refused, yet nothing after after: the subject lost messages
		// (limits): ask for its last.
		m, err := p.env.Stream.GetLastMsgForSubject(ctx, p.subject)
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
		return last, ErrClosed
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
func (p *Publisher) readStored(ctx context.Context, after uint64, limit int) ([]storedEvent, uint64, error) {
	var found []storedEvent
	last := after
	for len(found) <= limit {
		m, err := p.env.Stream.GetMsg(ctx, last+1, jetstream.WithGetMsgSubject(p.subject))
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
func (p *Publisher) applyStoredLocked(found []storedEvent) error {
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
func (p *Publisher) resendStateLocked(cause error) (done, first bool) {
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
func (p *Publisher) endResendLocked() {
	p.resending = false
	if p.stopResend != nil {
		p.stopResend()
		p.stopResend = nil
	}
	p.finishLocked()
}

// unackedLocked tells whether an event waits for its ack. Caller holds mu.
func (p *Publisher) unackedLocked() bool {
	for _, o := range p.queue {
		if !o.acked {
			return true
		}
	}
	return false
}
