package eventpub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/natserr"
	"github.com/agentfleet/agentfleet/internal/workerproto"
)

// envelopeHeadroom is kept free under the max payload for headers and
// protocol overhead.
const envelopeHeadroom = 4 << 10

// Publisher publishes one attempt's events, in order, each stored once
// (see doc.go for how). Create it with New; end it with Flush or Abandon.
type Publisher struct {
	env     *Env
	run     string
	attempt int
	subject string // the run's events subject

	envHead, envMid string        // the envelope's constant parts (envelopeParts)
	msgIDHead       string        // a Nats-Msg-Id without its seq
	replyHead       string        // an event's ack subject without its seq (Acks)
	ackID           uint64        // its id in Acks
	limit           int           // the largest envelope a message may carry
	budget          time.Duration // a re-send's time from its first failure

	window chan struct{} // a slot per queued event: a full one blocks Event
	kick   chan struct{} // wakes the re-send goroutine
	done   chan struct{} // closed once closed, its queue empty and no re-send runs
	first  chan struct{} // closed when seq 1 is acked

	sendMu  sync.Mutex    // held from taking a seq to the end of its send; taken before mu
	stopped atomic.Bool   // set with err: a send outside mu sends nothing more
	stopCh  chan struct{} // closed with stopped: ends a wait for an earlier batch

	mu          sync.Mutex         // guards what follows; never held over a send
	queue       []*outgoing        // unacked events, and acked ones behind them, in seq order
	syncs       []syncWaiter       // Sync calls waiting
	seq         uint64             // the last seq taken
	holding     atomic.Bool        // send nothing (disconnected, re-sending); read without mu by the batch
	resending   bool               // the re-send goroutine runs
	stopResend  context.CancelFunc // ends the re-send's request in flight
	retryStart  time.Time          // the re-send budget's start; zero: none
	closed      bool               // Flush or Abandon was called
	finished    bool               // done is closed
	err         error              // the first failure
	lastStream  uint64             // stream sequence of the last popped event
	singleSeq   uint64             // the last event sent singly (not in a batch)
	sent        int                // events published, for the run's event budget
	sentBytes   int64              // their bytes
	firstStream uint64             // where seq 1 is stored
	onFail      func(error)        // told of the first failure (not a fence)
	batch       string             // the batch of its last batched event (the batch's mu)
	batchAt     uint64             // that event's place in it, from 1 (the batch's mu)
	turn        chan struct{}      // closed when an event waiting for its turn may try again
	keepLimit   int                // KeepEnvelopes' bound on kept bytes (0: keep none)
	kept        [][]byte           // the envelopes published, while within keepLimit
	keptBytes   int
	keepOver    bool // more than keepLimit was published: kept is nil
}

// outgoing is one queued event.
type outgoing struct {
	seq     uint64
	m       nats.Msg
	sent    bool   // handed to the connection (or about to be)
	epoch   uint64 // Acks' epoch when it was
	sentAt  time.Time
	acked   bool
	stream  uint64 // where the ack says it is stored
	dup     bool   // the stream had it already
	msgID   bool   // carries a Nats-Msg-Id
	batched bool   // sent in an event batch, whose answers ack it
	approx  bool   // stream is a floor of where it is stored, not the place
}

// Attempt names the attempt whose events a publisher publishes.
type Attempt struct {
	Run     string
	Attempt int
	// MsgIDHead replaces the attempt's own message id prefix (a finish
	// publishing for an earlier attempt); "" keeps it.
	MsgIDHead string
	// LastSeq is the seq already published (a finish from the record
	// continuing a transcript); the next event takes LastSeq+1.
	LastSeq uint64
}

// New starts a publisher of a's events; onFail (may be nil) is told of
// its first failure unless it was fenced.
func New(env *Env, a Attempt, onFail func(error)) *Publisher {
	limit := int(env.Conn.MaxPayload())
	if limit <= 0 {
		limit = 1 << 20
	}
	p := &Publisher{
		env: env, run: a.Run, attempt: a.Attempt,
		subject:   env.Names.Events(a.Run),
		msgIDHead: workerproto.MsgIDPrefix(a.Run, a.Attempt),
		limit:     limit - envelopeHeadroom,
		budget:    env.Budget,
		window:    make(chan struct{}, env.Window),
		kick:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		first:     make(chan struct{}),
		stopCh:    make(chan struct{}),
		onFail:    onFail,
		seq:       a.LastSeq,
	}
	if a.MsgIDHead != "" {
		p.msgIDHead = a.MsgIDHead
	}
	p.envHead, p.envMid = envelopeParts(a.Run, a.Attempt, env.Worker)
	p.replyHead = env.Acks.add(p)
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
func (p *Publisher) appendEnvelope(dst []byte, seq uint64, ts int64, o Options, event []byte) []byte {
	dst = append(dst, p.envHead...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, p.envMid...)
	dst = strconv.AppendInt(dst, ts, 10)
	if o.ControlSeq > 0 {
		dst = append(dst, `,"controlSeq":`...)
		dst = strconv.AppendUint(dst, o.ControlSeq, 10)
	}
	if o.Interrupted {
		dst = append(dst, `,"interrupted":true`...)
	}
	dst = append(dst, `,"event":`...)
	dst = append(dst, event...)
	return append(dst, '}')
}

func (p *Publisher) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Event publishes one encoded event of type typ and returns its seq. It
// blocks while the window is full, and returns the publisher's failure
// once it failed.
func (p *Publisher) Event(typ string, event []byte, opts Options) (uint64, error) {
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
				err = ErrClosed
			}
			return 0, err
		}
		// Sent at once unless held (the re-send then sends it in its
		// turn), and only in its turn (turnLocked).
		if epoch, send = p.mayOvertakeLocked(); !send {
			break
		}
		b := p.env.Batch
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
		seq, now.UnixMilli(), opts, event)
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
		o.batched = !o.msgID && p.env.Batch != nil && p.env.Batch.on() && !p.singleUnackedLocked()
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
	p.keepLocked(data)
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
			if errors.Is(err, errHeld) || natserr.Transient(err) {
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

// failure returns the publisher's failure, nil if none.
func (p *Publisher) Failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// spent returns the events and bytes published so far.
func (p *Publisher) Spent() (int, int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent, p.sentBytes
}

// charge counts earlier attempts' events against the run's event budget;
// a copy (an attempt's seq stored again) is not counted twice.
func (p *Publisher) Charge(envs []*bus.Envelope) {
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
func (p *Publisher) Fleet(typ string, v any) (uint64, error) {
	data, err := agent.MarshalJSON(v)
	if err != nil {
		return 0, err
	}
	return p.Event(typ, data, Options{})
}

// startedAt waits until the attempt's first event (run_started) is stored
// and returns its stream sequence.
func (p *Publisher) StartedAt(ctx context.Context) (uint64, error) {
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
		return 0, cmpErr(p.err, ErrClosed)
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
func (p *Publisher) Sync(ctx context.Context) error {
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
func (p *Publisher) storedUpToLocked(seq uint64) bool {
	return len(p.queue) == 0 || p.queue[0].seq > seq
}

// releaseSyncLocked wakes the sync waiters whose events are stored, or
// all of them (a failure). Caller holds mu.
func (p *Publisher) releaseSyncLocked(all bool) {
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
func (p *Publisher) Flush(ctx context.Context) error {
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
func (p *Publisher) Abandon() {
	p.Fence()
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

// KeepEnvelopes makes p keep a copy of every envelope it publishes after
// prior (envelopes stored before this publisher's), for Kept, while they
// come to at most limit bytes. Call it before the first event.
func (p *Publisher) KeepEnvelopes(limit int, prior [][]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keepLimit = limit
	for _, d := range prior {
		p.keepLocked(d)
	}
}

// keepLocked keeps data (the envelope is not changed once made). p.mu is
// held.
func (p *Publisher) keepLocked(data []byte) {
	if p.keepLimit <= 0 || p.keepOver {
		return
	}
	if p.keptBytes+len(data) > p.keepLimit {
		p.kept, p.keptBytes, p.keepOver = nil, 0, true
		return
	}
	p.kept = append(p.kept, data)
	p.keptBytes += len(data)
}

// Kept returns the envelopes KeepEnvelopes kept, in seq order; ok is
// false when none are (not asked, or over its limit).
func (p *Publisher) Kept() (envs [][]byte, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keepLimit <= 0 || p.keepOver {
		return nil, false
	}
	return slices.Clone(p.kept), true
}
