package eventpub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// Batch sends the events of every publisher of a worker in JetStream
// fast batches and applies their answers (doc.go: Batches).
type Batch struct {
	nc            *nats.Conn
	out           Out // the events go out on it (the events' Env.Out)
	acks          *Acks
	prefix        string // <inbox>.
	commitSubject string // where commits go
	sub           *nats.Subscription
	every         time.Duration

	off        atomic.Bool   // the stream refused batches: publish plainly
	pauseUntil atomic.Int64  // unix ns: publish plainly until then
	answerWait time.Duration // guarded by mu (a test sets it)
	stuckWait  time.Duration // guarded by mu (a test sets it)
	// answered is the commit time of the latest-committed batch whose
	// commit ack came (guarded by mu).
	answered time.Time
	// stopCtx ends with close: the sweep (done when it returned), the
	// waits for an earlier batch, the background probes (reprobing).
	stopCtx   context.Context
	stop      context.CancelFunc
	done      chan struct{}
	reprobing sync.WaitGroup

	sendMu sync.Mutex // see the invariants; taken before mu
	mu     sync.Mutex
	cur    *openBatch
	open   map[string]*openBatch // sent, not settled
	held   map[*Publisher]int    // publishers held: how many ended batches hold them
	nheld  atomic.Int64          // len(held), read without mu by plain sends
	closed bool

	scratch []batchEntry // the callback's
}

type openBatch struct {
	id      string
	reply   string // <prefix><id>.<flow>.fail.
	epoch   uint64
	floor   uint64
	entries []batchEntry
	settled uint64 // entries 1..settled are settled (stored or not)
	cut     uint64 // entries after cut were not stored (settled)
	timer   *time.Timer
	// committedAt is when its commit went out, or the stream committed
	// it itself (zero: not yet).
	committedAt time.Time
	// changed, made by a waiting publisher, is closed when the batch's
	// answers settle more of it, or it ends or is forgotten.
	changed chan struct{}
	// holds are the publishers it holds since it is known ended.
	holds []*Publisher
	ended bool
}

type batchEntry struct {
	p   *Publisher
	seq uint64
}

const (
	batchFlushEvery = 2 * time.Millisecond
	maxBatch        = 4096
	// batchFlow is the most messages between two flow acks we allow the
	// server (it may choose fewer).
	batchFlow = 256
)

// errBatchEnded is why an event sent in a batch was not stored: the batch
// ended before it (another message refused, or the connection lost).
var errBatchEnded = errors.New("event batch ended before the event")

// errBatchUnanswered: the event's batch was committed, and not answered.
var errBatchUnanswered = errors.New("event batch not answered")

// StartBatch subscribes to the answers of the batches to come, whose
// commits go to commit, and starts their sweep. Close stops it, once the
// publishers are done.
func StartBatch(nc *nats.Conn, out Out, acks *Acks, commit string) (*Batch, error) {
	b := &Batch{nc: nc, out: out, acks: acks, prefix: nc.NewInbox() + ".", commitSubject: commit, every: batchFlushEvery,
		open: map[string]*openBatch{}, held: map[*Publisher]int{}, answerWait: acks.timeout / 5, stuckWait: acks.timeout * 2 / 3,
		done: make(chan struct{})}
	b.stopCtx, b.stop = context.WithCancel(context.Background())
	sub, err := nc.Subscribe(b.prefix+">", b.route)
	if err != nil {
		b.stop()
		return nil, fmt.Errorf("event batch subscription: %w", err)
	}
	sub.SetPendingLimits(-1, 64<<20)
	b.sub = sub
	go b.sweep()
	return b, nil
}

// probeWait bounds the wait for the answer to a probe commit, and
// ReprobeEvery spaces the probes while batches are off for want of one.
const (
	probeWait    = 5 * time.Second
	ReprobeEvery = 30 * time.Second
)

// probe commits a batch the stream does not know, at seq 2 so that it
// cannot open one (nothing is stored), and waits for the stream's answer,
// an error: "batch publish ID unknown". With none, commits do not reach the
// stream (the user may not publish to the commit subject, as with a copy
// of deploy/nats/accounts.conf older than event batches), every batch
// would wait out its answer and re-send, and the runs would crawl (see
// probeOrOff). A stream that answers that batches are disabled (its
// config changed since the worker read it) returns errBatchesDisabled; no
// responders (JetStream away) is no answer.
func (b *Batch) probe(ctx context.Context) error {
	reply := b.prefix + "probe" + nuid.Next() + ".1.fail.2.3.$FI"
	sub, err := b.nc.SubscribeSync(reply)
	if err != nil {
		return fmt.Errorf("batch probe: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	ctx, cancel := context.WithTimeout(ctx, probeWait)
	defer cancel()
	var m *nats.Msg
	if err = b.nc.PublishMsg(&nats.Msg{Subject: b.commitSubject, Reply: reply}); err == nil {
		m, err = sub.NextMsgWithContext(ctx)
	}
	if err == nil && m.Header.Get("Status") == "503" {
		err = nats.ErrNoResponders
	}
	if err != nil {
		return fmt.Errorf("no answer to a batch commit on %s (may this user publish to it?): %w", b.commitSubject, err)
	}
	var pa struct {
		Error *struct {
			ErrCode uint16 `json:"err_code"`
		} `json:"error"`
	}
	if json.Unmarshal(m.Data, &pa) == nil && pa.Error != nil && pa.Error.ErrCode == jsBatchPublishDisabled {
		return errBatchesDisabled
	}
	return nil
}

var errBatchesDisabled = errors.New("the events stream does not allow batch publishing (allow_batched is off)")

// ProbeOrOff probes (within ctx) and, with no answer, turns batches off
// and probes again every `every` in the background, turning them on at
// the first answer: a server slow at the worker's start costs a while of
// single sends, not the process's life.
func (b *Batch) ProbeOrOff(ctx context.Context, log *slog.Logger, every time.Duration) {
	err := b.probe(ctx)
	if err == nil {
		return
	}
	b.off.Store(true)
	if errors.Is(err, errBatchesDisabled) {
		log.Warn("event batches off: each event goes singly", "err", err)
		return
	}
	log.Error("event batches off until a probe is answered: each event goes singly", "err", err, "probe_every", every)
	b.reprobing.Add(1)
	go func() {
		defer b.reprobing.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-b.stopCtx.Done():
				return
			case <-t.C:
			}
			switch err := b.probe(b.stopCtx); {
			case err == nil:
				b.off.Store(false)
				log.Info("event batches on: a probe commit was answered")
				return
			case errors.Is(err, errBatchesDisabled):
				log.Warn("event batches stay off: each event goes singly", "err", err)
				return
			}
		}
	}()
}

// Close stops the sweep, the probes and the subscription.
func (b *Batch) Close() {
	b.stop()
	b.reprobing.Wait()
	<-b.done
	b.mu.Lock()
	b.closed = true
	for _, ob := range b.open {
		if ob.timer != nil {
			ob.timer.Stop()
		}
	}
	clear(b.held)
	b.nheld.Store(0)
	b.mu.Unlock()
	_ = b.sub.Unsubscribe()
}

// on tells whether events may go in batches now.
func (b *Batch) on() bool {
	if b.off.Load() {
		return false
	}
	until := b.pauseUntil.Load()
	return until == 0 || time.Now().UnixNano() >= until
}

// errHeld: the event was not sent, an ended batch holds its publisher
// (see the invariants); the publisher's re-send sends it.
var errHeld = errors.New("event held behind an ended event batch")

// publish sends m, an event of p with seq stamped with the acks' epoch
// stamp, in the open batch, once no earlier event of p waits for an answer
// in another batch (see the invariants). It returns false when batches are
// off (the caller publishes plainly), errHeld when p is held or the
// connection was lost since the stamp. The caller holds p.sendMu.
func (b *Batch) publish(p *Publisher, seq uint64, m *nats.Msg, stamp uint64) (bool, error) {
	for {
		ok, wait, err := b.tryPublish(p, seq, m, stamp)
		if wait == nil {
			return ok, err
		}
		b.acks.signals.batchWait(p, seq)
		// Not ended by the hard stop: the answer is a few ms off, and the
		// hand-back's flush (bounded by AckWait) stores what waits.
		select {
		case <-wait:
		case <-p.stopCh:
		case <-b.stopCtx.Done():
			return true, errHeld
		}
		if p.stopped.Load() {
			return true, errHeld // failed or fenced meanwhile: send nothing
		}
	}
}

// tryPublish is publish, or the channel to wait on before trying again.
func (b *Batch) tryPublish(p *Publisher, seq uint64, m *nats.Msg, stamp uint64) (bool, <-chan struct{}, error) {
	if !b.on() {
		return false, nil, nil
	}
	b.sendMu.Lock()
	defer b.sendMu.Unlock()
	epoch := b.acks.current()
	b.mu.Lock()
	if b.held[p] > 0 || p.holding.Load() || stamp != epoch {
		// Held by an ended batch, or already told an event of its was not
		// stored (after the publisher's own check), or the connection was
		// lost since the publisher's check (an earlier event of p may
		// have been lost with it, the acks' sweep may not have seen p
		// yet): its re-send sends it, after the earlier ones.
		b.mu.Unlock()
		return true, nil, errHeld
	}
	if b.closed {
		b.mu.Unlock()
		return false, nil, nil
	}
	ob := b.cur
	if ob == nil || ob.epoch != epoch {
		b.pruneLocked(epoch)
		ob = nil
	}
	if prev := b.open[p.batch]; prev != nil && prev != ob && !prev.ended &&
		prev.settled < p.batchAt && p.batchAt <= prev.cut {
		if prev.changed == nil {
			prev.changed = make(chan struct{})
		}
		wait := prev.changed
		b.mu.Unlock()
		return true, wait, nil
	}
	if ob == nil {
		ob = &openBatch{id: nuid.Next(), epoch: epoch, floor: b.acks.highest.Load(), cut: math.MaxUint64}
		ob.reply = b.prefix + ob.id + "." + strconv.Itoa(batchFlow) + ".fail."
		b.cur = ob
		b.open[ob.id] = ob
	}
	ob.entries = append(ob.entries, batchEntry{p: p, seq: seq})
	n := len(ob.entries)
	prevBatch, prevAt := p.batch, p.batchAt
	p.batch, p.batchAt = ob.id, uint64(n)
	op := "1"
	if n == 1 {
		op = "0"
		ob.timer = time.AfterFunc(b.every, func() { b.commit(ob) })
	}
	full := n >= maxBatch
	b.mu.Unlock()
	m.Reply = ob.reply + strconv.Itoa(n) + "." + op + ".$FI"
	if err := b.out.PublishMsg(m); err != nil {
		b.mu.Lock()
		ob.entries = ob.entries[:n-1] // not sent: its seq is the next one's
		p.batch, p.batchAt = prevBatch, prevAt
		b.mu.Unlock()
		return true, nil, err
	}
	if full {
		b.commitLocked(ob)
	}
	return true, nil, nil
}

// changedLocked wakes the publishers waiting on ob. Caller holds mu.
func (ob *openBatch) changedLocked() {
	if ob.changed != nil {
		close(ob.changed)
		ob.changed = nil
	}
}

// holds tells whether p is held (see the invariants): a plain send
// checks it too.
func (b *Batch) holds(p *Publisher) bool {
	// Last: set before a hold ends, and kept until nothing is unacknowledged.
	return b.endedHolds(p) || p.holding.Load()
}

// endedHolds tells whether an ended batch holds p.
func (b *Batch) endedHolds(p *Publisher) bool {
	if b.nheld.Load() == 0 { // the usual case skips the lock
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held[p] > 0
}

// commit ends ob unless its commit went out already.
func (b *Batch) commit(ob *openBatch) {
	b.sendMu.Lock()
	defer b.sendMu.Unlock()
	b.commitLocked(ob)
}

// commitFor ends the open batch if it holds p's latest batched event: p
// waits for its acks (sync, flush, a turn). A batch committed already is
// answered without it; ending the open one would only cut other runs'
// batches short.
func (b *Batch) commitFor(p *Publisher) {
	b.mu.Lock()
	ob := b.cur
	mine := ob != nil && p.batch == ob.id
	b.mu.Unlock()
	if mine {
		b.commit(ob)
	}
}

// commitLocked sends ob's commit unless it went out already. Caller holds
// sendMu.
func (b *Batch) commitLocked(ob *openBatch) {
	b.mu.Lock()
	if !ob.committedAt.IsZero() || b.closed || len(ob.entries) == 0 || b.open[ob.id] != ob {
		b.mu.Unlock()
		return
	}
	if b.cur == ob {
		b.cur = nil
	}
	ob.committedAt = time.Now()
	ob.timer.Stop()
	n := len(ob.entries)
	b.mu.Unlock()
	// An end-of-batch commit, on a subject of the stream that is no run's:
	// it is not stored, and a run's followers do not see it.
	_ = b.nc.PublishMsg(&nats.Msg{Subject: b.commitSubject, Reply: ob.reply + strconv.Itoa(n+1) + ".3.$FI"})
}

// The stream's answers to a batch it does not take: it does not allow
// batches; too many batches are open on it or on the server.
const (
	jsBatchPublishDisabled = 10205
	jsBatchTooManyInflight = 10211
)
