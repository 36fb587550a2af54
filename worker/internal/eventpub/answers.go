package eventpub

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/natserr"
)

// jsDuplicateInProcess is the stream's answer to a copy of an event
// whose original it is still storing (a cluster): the original's ack
// comes to the same reply subject.
const jsDuplicateInProcess = 10158

// queuedLocked returns the queued event seq unacknowledged, or nil (the
// publisher failed, or a late answer: acked or popped already). Caller
// holds mu.
func (p *Publisher) queuedLocked(seq uint64) *outgoing {
	if p.err != nil || len(p.queue) == 0 {
		return nil
	}
	head := p.queue[0].seq
	if seq < head || seq-head >= uint64(len(p.queue)) || p.queue[seq-head].acked {
		return nil
	}
	return p.queue[seq-head]
}

// ackArrived applies the ack of the event seq (Acks' callback: it
// must not block).
func (p *Publisher) ackArrived(seq, stream uint64, dup bool, ackErr error) {
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
		if natserr.Transient(ackErr) {
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
func (p *Publisher) batchUnanswered(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queuedLocked(seq) != nil {
		p.startResendLocked(errBatchUnanswered)
	}
}

// batchAnswer applies the event batch's answer for the event seq: stored
// at stream (a floor if approx), or, with cause, not stored. It is the
// batch answers' callback: it must not block.
func (p *Publisher) batchAnswer(seq, stream uint64, approx bool, cause error) {
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
func (p *Publisher) popAndUnlock(async bool) {
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
		p.env.Metrics.EventPublished()
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
func (p *Publisher) popLocked() (popped, stored int, bad error) {
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

// check is Acks' sweep: it starts a re-send when the oldest
// unacknowledged event was sent before the connection's latest reconnect
// or longer than timeout ago, and fails the publisher past its budget.
func (p *Publisher) check(now time.Time, epoch uint64, timeout time.Duration) {
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

// failLocked records the first failure and drops the queue; it reports
// whether this was the first. Caller holds mu; the caller then runs
// failed unless the failure is the lease's.
func (p *Publisher) failLocked(err error) bool {
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
func (p *Publisher) failed() {
	p.mu.Lock()
	err := p.err
	p.mu.Unlock()
	p.wake()
	if errors.Is(err, ErrFenced) {
		return
	}
	if !errors.Is(err, ErrStopped) { // not the stream's doing
		p.env.Metrics.PublishFailed(err)
	}
	if p.onFail != nil {
		p.onFail(err)
	}
}

// finishLocked closes done once nothing is left to do. Caller holds mu.
func (p *Publisher) finishLocked() {
	if p.finished || !p.closed || len(p.queue) > 0 || p.resending {
		return
	}
	p.finished = true
	// Gone from Acks before done: whoever waited for done finds it gone.
	p.env.Acks.remove(p.ackID)
	close(p.done)
}

// dropLocked releases every queued event after a failure.
func (p *Publisher) dropLocked() {
	for range p.queue {
		<-p.window
	}
	clear(p.queue)
	p.queue = p.queue[:0]
	p.releaseSyncLocked(true)
}

func (p *Publisher) fail(err error) {
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
func (p *Publisher) Fence() {
	p.fail(ErrFenced)
}
