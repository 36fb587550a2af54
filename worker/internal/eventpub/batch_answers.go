package eventpub

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pruneLocked forgets the batches sent before a loss of the connection:
// no answer will settle them, their publishers re-send what is
// unacknowledged (acks.go's sweep). Caller holds mu.
func (b *Batch) pruneLocked(epoch uint64) {
	for _, ob := range b.open {
		if ob.epoch < epoch {
			b.forgetLocked(ob)
			b.releaseLocked(ob)
		}
	}
}

// endLocked marks ob known ended: it takes no more events, and the
// publishers of its unsettled events are held until releaseLocked, which
// the caller calls once their answers are dispatched. Caller holds mu.
func (b *Batch) endLocked(ob *openBatch) {
	if b.cur == ob {
		b.cur = nil
	}
	if ob.ended || b.open[ob.id] != ob {
		return // held already, or forgotten: no answer would release it
	}
	ob.ended = true
	ob.changedLocked()
	end := min(uint64(len(ob.entries)), ob.cut)
	seen := map[*Publisher]bool{}
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
func (b *Batch) releaseLocked(ob *openBatch) {
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
func (b *Batch) releaseIfSettled(ob *openBatch) {
	b.mu.Lock()
	if ob.holds != nil && (b.open[ob.id] != ob || ob.settled >= min(uint64(len(ob.entries)), ob.cut)) {
		b.releaseLocked(ob)
	}
	b.mu.Unlock()
}

// forgetLocked drops ob: no answer of it is applied any more, and no event
// goes in it. Caller holds mu.
func (b *Batch) forgetLocked(ob *openBatch) {
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
func (b *Batch) sweep() {
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
func (b *Batch) unanswered(ob *openBatch) {
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

// route is the answers' callback: flow acks, commit acks, errors.
func (b *Batch) route(m *nats.Msg) {
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
func (b *Batch) streamEnded(ob *openBatch) {
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
func (b *Batch) stored(ob *openBatch, upTo, last uint64) {
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
func (b *Batch) notStored(ob *openBatch, from uint64, cause error, ended bool) {
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
