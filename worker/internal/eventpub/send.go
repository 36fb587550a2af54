package eventpub

import (
	"fmt"
	"strconv"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// stampLocked marks o sent now in epoch (read after the connection was
// seen up), before its publish: its ack may come before the publish
// returns. Caller holds mu.
func stampLocked(o *outgoing, now time.Time, epoch uint64) {
	o.sent, o.epoch, o.sentAt = true, epoch, now
}

// mayOvertakeLocked tells whether a new event may be sent at once (see
// the invariants), and the epoch to stamp it with. Caller holds mu.
func (p *Publisher) mayOvertakeLocked() (uint64, bool) {
	if p.holding.Load() || !p.env.Conn.IsConnected() {
		return 0, false
	}
	epoch := p.env.Acks.current()
	for _, o := range p.queue {
		if !o.acked {
			return epoch, o.sent && o.epoch == epoch
		}
	}
	return epoch, true
}

// takeTurn waits for o's turn (turnLocked), o stamped sent already, and
// tells whether it may go: not if the publisher is held again, failed,
// or the connection was lost since o's stamp (its re-send sends it).
// Caller holds sendMu.
func (p *Publisher) takeTurn(o *outgoing) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.holding.Load() || p.err != nil || o.epoch != p.env.Acks.current() {
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

// acquire takes a window slot, blocking while the window is full.
func (p *Publisher) acquire() {
	select {
	case p.window <- struct{}{}:
		return
	default:
	}
	start := time.Now()
	p.window <- struct{}{}
	p.env.Metrics.PublishWait(time.Since(start))
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
func (p *Publisher) turnLocked(plain bool, seq uint64) <-chan struct{} {
	b := p.env.Batch
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
func (p *Publisher) turnChangedLocked() {
	if p.turn != nil {
		close(p.turn)
		p.turn = nil
	}
}

// awaitTurn waits on wait (from turnLocked), having the event batch
// answer now, as a sync does; a hard stop fails the publisher. Caller
// holds sendMu, not mu: what closes wait (acks, a re-send starting, a
// failure) does not take sendMu.
func (p *Publisher) awaitTurn(wait <-chan struct{}) {
	p.commitBatch()
	select {
	case <-wait:
	case <-p.env.Stop.Done():
		p.mu.Lock()
		first := p.failLocked(fmt.Errorf("publish to %s: %w", p.subject, ErrStopped))
		p.mu.Unlock()
		if first {
			go p.failed() // not under sendMu: onFail may publish
		}
	}
}

// unackedBeforeLocked tells whether an event before seq (sent in a
// batch, if batched) waits for its answer. Caller holds mu.
func (p *Publisher) unackedBeforeLocked(seq uint64, batched bool) bool {
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
func (p *Publisher) singleUnackedLocked() bool {
	if p.singleSeq == 0 || len(p.queue) == 0 {
		return false
	}
	head := p.queue[0].seq
	return p.singleSeq >= head && !p.queue[p.singleSeq-head].acked
}

// A sender puts a queued event on the wire: the publisher's queue, its
// order and its re-send are the same whichever sends it. An event goes
// singly (its ack comes to its own reply subject, through Acks) or in
// the worker's open batch (the batch's answers ack it).
type sender interface {
	// put sends o, the event seq; ok is false when it cannot go this
	// way (batches turned off since its publisher chose). Caller holds
	// p.sendMu.
	put(p *Publisher, seq uint64, o *outgoing) (ok bool, err error)
}

// single sends an event alone, in its turn (turnLocked).
type single struct{}

func (single) put(p *Publisher, seq uint64, o *outgoing) (bool, error) {
	// Every single send takes its turn here too: batches may have paused
	// or turned off since its publisher's check, which took it for batched.
	if b := p.env.Batch; b != nil && (b.holds(p) || !p.takeTurn(o)) {
		return true, errHeld
	}
	p.env.Signals.beforeSingleSend(p, seq)
	o.m.Reply = p.replyHead + strconv.FormatUint(seq, 10)
	return true, p.env.Out.PublishMsg(&o.m)
}

// inBatch sends an event in the worker's open batch.
type inBatch struct{ b *Batch }

func (s inBatch) put(p *Publisher, seq uint64, o *outgoing) (bool, error) {
	p.env.Signals.beforeBatchSend(p, seq)
	return s.b.publish(p, seq, &o.m, o.epoch)
}

// send puts o on the wire: in the event batch if it may go in one, else
// singly. Caller holds sendMu.
func (p *Publisher) send(seq uint64, o *outgoing) error {
	if o.batched {
		if ok, err := (inBatch{p.env.Batch}).put(p, seq, o); ok {
			return err
		}
		p.mu.Lock()
		o.batched = false // batches are off since
		p.mu.Unlock()
	}
	_, err := single{}.put(p, seq, o)
	return err
}

// commitBatch has the event batch answer now if an event of p waits in
// it (sync, flush).
func (p *Publisher) commitBatch() {
	b := p.env.Batch
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
