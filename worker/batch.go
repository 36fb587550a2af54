package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// Events travel to the stream in JetStream fast batches (nats-server
// 2.14+, a stream with AllowBatchPublish): the server answers a batch with
// a flow ack every few messages and one ack at its commit, where a plain
// publish is answered once per message; those answers were a quarter of
// the server's ingest cost. A batch holds the events of any of the
// worker's runs; only events without headers go in one (a refused message
// ends its batch for every run, so nothing that may be refused by design,
// a message id or an expectation, goes in).
//
// Invariants:
//   - sendMu is held from taking a batch seq to the end of its publish, and
//     over a commit: a batch's messages go on the wire in seq order, its
//     commit after them. mu guards the state and is never held over a
//     publish, so the answers' callback never waits on the connection.
//   - Batches are gap-fail: the server stores a batch's messages in seq
//     order and ends the batch at the first it refuses or misses, then
//     answers with a commit ack counting what it stored. So a flow ack for
//     seq N says 1..N are stored; a commit ack for count C says 1..C are
//     stored and C+1.. are not; an error answer for seq K says K.. are
//     not (the batch ends at K; its commit ack settles what is before K).
//   - Stored events are applied to their publishers in batch seq order.
//     The answers give no stream sequence but the commit's (the last
//     stored one's): every other event gets the batch's floor, the highest
//     stream sequence the worker had seen acked before the batch's first
//     message went out. Every message sent after that ack is stored above
//     it, so a floor is a lower bound (publish.go: approx).
//   - An event not stored is re-sent by its publisher as after a lost ack;
//     if a later event of its run is stored already (in a later batch),
//     the attempt fails as stored out of order and is handed back.
//   - A batch is committed flushEvery after its first message, at maxBatch
//     messages, or when a publisher waits for its acks (sync); the next
//     event opens a new one, while the commit's answer may still be on its
//     way (the stream then has two open, and starts the new one with a flow
//     ack every message, doubling). A batch the stream ended (a gap or an
//     error answer), or one opened before the connection's latest loss
//     (eventAcks' epoch), takes no more messages: what it did not store is
//     re-sent by the publishers (acks.go's sweep for a lost connection).
//   - A batch committed and not answered within answerWait (its commit
//     lost, as in a leader change) is forgotten and its unsettled events
//     are re-sent: each is stored only right after its predecessor, so one
//     stored already is found, not stored again (publish.go). Lost, not
//     late: the stream (its leader) answers one connection's commits in
//     the order it got them, so a batch is taken for lost only once a
//     batch committed after it was answered, or after stuckWait with no
//     such answer. (A leader change, or a batch the stream ended and
//     committed itself, can put two answers out of order: a batch then
//     taken for lost is found stored by its re-send.) An
//     overloaded server answers every batch late; re-sending them at
//     answerWait, each event checked against the store, was more load
//     than the batches themselves and the fleet did not recover.
//   - From the moment the worker knows a batch ended (an error or gap
//     answer, a commit ack storing less than sent, or no answer) until
//     the answers of its unsettled events reach their publishers, those
//     publishers are held (held, under mu): their new events, batched or
//     not, are not sent but left to the publisher's re-send, which sends
//     them in seq order after the lost ones. Without it a run's next
//     event could open a new batch and be stored before its predecessor
//     learned it was not (the attempt then fails as stored out of order).
//     The answers set the publisher's holding before the hold ends (it
//     stays set until nothing sent is unacknowledged), and publish checks it
//     after the hold, so an event that passed the publisher's own check
//     before the answers came is held too. An event
//     sent before the worker knew is not covered: the stream may take it
//     in a later batch, and the attempt fails as above.
//   - A run's events go in one batch at a time: an event does not open or
//     join a batch while an earlier event of its run waits for an answer
//     in another (it waits for that answer, for the batch to end or be
//     forgotten, or for its publisher to fail or be fenced, when it sends
//     nothing). Gap-fail orders a batch's messages, not two batches: an
//     overloaded server drops messages (429, its ingest queue full), and
//     a later batch's could be stored after an earlier one's were dropped,
//     the run's events then stored out of order. A run waits whenever its
//     events come closer together than a batch's answer takes (commit
//     every 2 ms, answer a round trip later): a few ms on a healthy
//     server, and as long as the server is behind when it is overloaded,
//     where the run failed before. Its publisher checks before the wait
//     (the acks' epoch, publish.go), so an event stamped before a loss of
//     the connection is held, not sent, and the sweep forgets batches
//     sent before a loss, so no waiter waits for their answer.
//   - An event goes in a batch only once no event of its run sent singly
//     waits for its ack (it waits for it, publish.go's turnLocked): a
//     single event lost to a reconnect is re-sent with its message id and
//     no expectation, and would be stored after a later batched one
//     unnoticed; one the stream dropped (429) would be stored after it.
//   - Refused for too many open batches (the stream's or the server's
//     limit), events go singly for batchPause.
type eventBatch struct {
	nc            *nats.Conn
	acks          *eventAcks
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
	held   map[*publisher]int    // publishers held: how many ended batches hold them
	nheld  atomic.Int64          // len(held), read without mu by plain sends
	closed bool

	scratch []batchEntry // the callback's

	beforeWait func(p *publisher, seq uint64) // a test's: an event waits for p's earlier batch
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
	holds []*publisher
	ended bool
}

type batchEntry struct {
	p   *publisher
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

func startEventBatch(nc *nats.Conn, acks *eventAcks, commit string) (*eventBatch, error) {
	b := &eventBatch{nc: nc, acks: acks, prefix: nc.NewInbox() + ".", commitSubject: commit, every: batchFlushEvery,
		open: map[string]*openBatch{}, held: map[*publisher]int{}, answerWait: acks.timeout / 5, stuckWait: acks.timeout * 2 / 3,
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
// reprobeEvery spaces the probes while batches are off for want of one.
const (
	probeWait    = 5 * time.Second
	reprobeEvery = 30 * time.Second
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
func (b *eventBatch) probe(ctx context.Context) error {
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

// probeOrOff probes (within ctx) and, with no answer, turns batches off
// and probes again every `every` in the background, turning them on at
// the first answer: a server slow at the worker's start costs a while of
// single sends, not the process's life.
func (b *eventBatch) probeOrOff(ctx context.Context, log *slog.Logger, every time.Duration) {
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

func (b *eventBatch) close() {
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
func (b *eventBatch) on() bool {
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
func (b *eventBatch) publish(p *publisher, seq uint64, m *nats.Msg, stamp uint64) (bool, error) {
	for {
		ok, wait, err := b.tryPublish(p, seq, m, stamp)
		if wait == nil {
			return ok, err
		}
		if h := b.beforeWait; h != nil {
			h(p, seq)
		}
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
func (b *eventBatch) tryPublish(p *publisher, seq uint64, m *nats.Msg, stamp uint64) (bool, <-chan struct{}, error) {
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
	if err := b.nc.PublishMsg(m); err != nil {
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

// pruneLocked forgets the batches sent before a loss of the connection:
// no answer will settle them, their publishers re-send what is
// unacknowledged (acks.go's sweep). Caller holds mu.
func (b *eventBatch) pruneLocked(epoch uint64) {
	for _, ob := range b.open {
		if ob.epoch < epoch {
			b.forgetLocked(ob)
			b.releaseLocked(ob)
		}
	}
}

// holds tells whether p is held (see the invariants): a plain send
// checks it too.
func (b *eventBatch) holds(p *publisher) bool {
	// Last: set before a hold ends, and kept until nothing is unacknowledged.
	return b.endedHolds(p) || p.holding.Load()
}

// endedHolds tells whether an ended batch holds p.
func (b *eventBatch) endedHolds(p *publisher) bool {
	if b.nheld.Load() == 0 { // the usual case skips the lock
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held[p] > 0
}

// endLocked marks ob known ended: it takes no more events, and the
// publishers of its unsettled events are held until releaseLocked, which
// the caller calls once their answers are dispatched. Caller holds mu.
func (b *eventBatch) endLocked(ob *openBatch) {
	if b.cur == ob {
		b.cur = nil
	}
	if ob.ended || b.open[ob.id] != ob {
		return // held already, or forgotten: no answer would release it
	}
	ob.ended = true
	ob.changedLocked()
	end := min(uint64(len(ob.entries)), ob.cut)
	seen := map[*publisher]bool{}
	for _, e := range ob.entries[min(ob.settled, end):end] {
		if !seen[e.p] {
			seen[e.p] = true
			ob.holds = append(ob.holds, e.p)
			b.held[e.p]++
		}
	}
	b.nheld.Store(int64(len(b.held)))
}

// releaseLocked ends ob's holds. Caller holds mu.
func (b *eventBatch) releaseLocked(ob *openBatch) {
	for _, p := range ob.holds {
		if b.held[p]--; b.held[p] <= 0 {
			delete(b.held, p)
		}
	}
	b.nheld.Store(int64(len(b.held)))
	ob.holds = nil
}

// releaseIfSettled ends ob's holds once nothing of it waits for an
// answer (called after answers were dispatched).
func (b *eventBatch) releaseIfSettled(ob *openBatch) {
	b.mu.Lock()
	if ob.holds != nil && (b.open[ob.id] != ob || ob.settled >= min(uint64(len(ob.entries)), ob.cut)) {
		b.releaseLocked(ob)
	}
	b.mu.Unlock()
}

// forgetLocked drops ob: no answer of it is applied any more, and no event
// goes in it. Caller holds mu.
func (b *eventBatch) forgetLocked(ob *openBatch) {
	ob.timer.Stop()
	delete(b.open, ob.id)
	if b.cur == ob {
		b.cur = nil
	}
	ob.changedLocked()
}

// sweep hands the events of a batch whose commit was lost (in a leader
// change, say: see the invariants) back to their publishers, which re-send
// them: each is stored only right after its predecessor, so one the
// stream holds already is found there, not stored again (publish.go).
func (b *eventBatch) sweep() {
	defer close(b.done)
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	var late []*openBatch
	for {
		select {
		case <-b.stopCtx.Done():
			return
		case <-t.C:
		}
		// Forget what was sent before a loss of the connection even when
		// no event comes to do it: a run waiting for its earlier batch
		// (see the invariants) waits for this.
		epoch := b.acks.current()
		b.mu.Lock()
		b.pruneLocked(epoch)
		for _, ob := range b.open {
			if ob.committedAt.IsZero() {
				continue
			}
			if wait := time.Since(ob.committedAt); wait > b.stuckWait || wait > b.answerWait && b.answered.After(ob.committedAt) {
				late = append(late, ob)
			}
		}
		b.mu.Unlock()
		for i, ob := range late {
			b.unanswered(ob)
			late[i] = nil
		}
		late = late[:0]
	}
}

// unanswered forgets ob and hands its unsettled events back.
func (b *eventBatch) unanswered(ob *openBatch) {
	b.mu.Lock()
	if b.open[ob.id] != ob {
		b.mu.Unlock()
		return
	}
	b.endLocked(ob)
	b.forgetLocked(ob)
	end := min(uint64(len(ob.entries)), ob.cut)
	var back []batchEntry
	if ob.settled < end {
		back = slices.Clone(ob.entries[ob.settled:end])
	}
	ob.settled = end
	ob.changedLocked()
	b.mu.Unlock()
	for _, e := range back {
		e.p.batchUnanswered(e.seq)
	}
	b.releaseIfSettled(ob)
}

// commit ends ob unless its commit went out already.
func (b *eventBatch) commit(ob *openBatch) {
	b.sendMu.Lock()
	defer b.sendMu.Unlock()
	b.commitLocked(ob)
}

// commitFor ends the open batch if it holds p's latest batched event: p
// waits for its acks (sync, flush, a turn). A batch committed already is
// answered without it; ending the open one would only cut other runs'
// batches short.
func (b *eventBatch) commitFor(p *publisher) {
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
func (b *eventBatch) commitLocked(ob *openBatch) {
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

// route is the answers' callback: flow acks, commit acks, errors.
func (b *eventBatch) route(m *nats.Msg) {
	rest, ok := cutPrefix(m.Subject, b.prefix)
	if !ok {
		return
	}
	dot := strings.IndexByte(rest, '.')
	if dot <= 0 {
		return
	}
	id := rest[:dot]
	b.mu.Lock()
	ob := b.open[id]
	b.mu.Unlock()
	if ob == nil {
		return // settled, or sent before a loss of the connection
	}
	data := m.Data
	switch {
	case len(data) == 0:
		// No responders, or another status: the stream took nothing from
		// this message on.
		b.notStored(ob, replySeq(rest), nats.ErrNoResponders, true)
	case bytes.HasPrefix(data, []byte(`{"type":"ack"`)):
		var fa struct {
			Seq uint64 `json:"seq"`
		}
		if json.Unmarshal(data, &fa) == nil {
			b.stored(ob, fa.Seq, 0)
		}
	case bytes.HasPrefix(data, []byte(`{"type":`)):
		// A gap or an error: the stream ended the batch (gap fail) and
		// committed it; its commit ack follows with what it stored, or the
		// sweep hands the events back if it is lost. New events go to
		// another.
		b.streamEnded(ob)
	default:
		var pa struct {
			Error *struct {
				Code        int    `json:"code"`
				ErrCode     uint16 `json:"err_code"`
				Description string `json:"description"`
			} `json:"error"`
			Seq   uint64 `json:"seq"`
			Count uint64 `json:"count"`
		}
		if err := json.Unmarshal(data, &pa); err != nil {
			return
		}
		if pa.Error != nil {
			api := &jetstream.APIError{Code: pa.Error.Code, ErrorCode: jetstream.ErrorCode(pa.Error.ErrCode), Description: pa.Error.Description}
			switch api.ErrorCode {
			case jsBatchPublishDisabled:
				b.off.Store(true)
			case jsBatchTooManyInflight:
				// The stream's (or server's) open batches are at their
				// limit: publish singly for a while.
				b.pauseUntil.Store(time.Now().Add(batchPause).UnixNano())
			}
			b.notStored(ob, replySeq(rest), api, true)
			return
		}
		b.acks.sawStream(pa.Seq)
		b.mu.Lock()
		if pa.Count < uint64(len(ob.entries)) {
			b.endLocked(ob) // hold the runs of what is not stored
		}
		if ob.committedAt.After(b.answered) {
			b.answered = ob.committedAt
		}
		b.mu.Unlock()
		b.stored(ob, pa.Count, pa.Seq)
		b.notStored(ob, pa.Count+1, errBatchEnded, false)
		b.mu.Lock()
		b.forgetLocked(ob) // the commit ack is the batch's last answer
		b.releaseLocked(ob)
		b.mu.Unlock()
	}
}

// streamEnded applies a gap or error answer: the stream ended ob and
// committed it itself (unless ob was forgotten meanwhile, as after a
// reconnect).
func (b *eventBatch) streamEnded(ob *openBatch) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open[ob.id] != ob {
		return
	}
	b.endLocked(ob)
	if ob.committedAt.IsZero() {
		ob.committedAt = time.Now()
		ob.timer.Stop()
	}
}

// The stream's answers to a batch it does not take: it does not allow
// batches; too many batches are open on it or on the server.
const (
	jsBatchPublishDisabled = 10205
	jsBatchTooManyInflight = 10211
)

// batchPause is how long events go singly after a batch was refused for
// too many open batches.
const batchPause = time.Second

// replySeq reads the batch seq from <id>.<flow>.<gap>.<seq>.<op>.$FI (0
// if it is not there: then the whole batch is meant).
func replySeq(rest string) uint64 {
	t := strings.Split(rest, ".")
	if len(t) != 6 {
		return 0
	}
	seq, _ := strconv.ParseUint(t[3], 10, 64)
	return seq
}

// stored applies "1..upTo are stored" to ob; last, if not zero, is the
// stream sequence of upTo. Only the callback calls it.
func (b *eventBatch) stored(ob *openBatch, upTo, last uint64) {
	b.mu.Lock()
	upTo = min(upTo, uint64(len(ob.entries)), ob.cut)
	if upTo <= ob.settled {
		b.mu.Unlock()
		return
	}
	b.scratch = append(b.scratch[:0], ob.entries[ob.settled:upTo]...)
	ob.settled = upTo
	ob.changedLocked()
	floor := ob.floor
	b.mu.Unlock()
	for i, e := range b.scratch {
		if last != 0 && i == len(b.scratch)-1 {
			e.p.batchAnswer(e.seq, last, false, nil)
		} else {
			e.p.batchAnswer(e.seq, floor, true, nil)
		}
	}
	clear(b.scratch)
}

// notStored applies "from.. are not stored" to ob (from zero: all), for
// cause; ended says the stream ended the batch there, so new events go to
// another and this one is committed (its commit ack settles what is before
// from). Only the callback calls it.
func (b *eventBatch) notStored(ob *openBatch, from uint64, cause error, ended bool) {
	from = max(from, 1)
	b.mu.Lock()
	end := min(uint64(len(ob.entries)), ob.cut)
	start := max(ob.settled, from-1)
	b.scratch = b.scratch[:0]
	if start < end {
		b.scratch = append(b.scratch, ob.entries[start:end]...)
	}
	if ended {
		b.endLocked(ob) // before the cut: it holds the runs of what is cut
	}
	ob.cut = min(ob.cut, from-1)
	ob.changedLocked()
	if ob.settled >= ob.cut {
		b.forgetLocked(ob) // nothing left to settle
		ended = false
	}
	b.mu.Unlock()
	for _, e := range b.scratch {
		e.p.batchAnswer(e.seq, 0, false, cause)
	}
	clear(b.scratch)
	b.releaseIfSettled(ob)
	if ended {
		go b.commit(ob)
	}
}
