// Package park keeps what a parked run needs in NATS and wakes it: the
// copy of its request in AGENTS_PARKED, the wake (a copy of that request
// published into the work queue again), its confirmation at pickup, and
// the wake consumer every worker pulls from.
//
// A parked run (protocol 1.9) is a waiting run whose request was
// acknowledged: nothing of it is on a worker. Invariants, in the order of
// the steps (the parking attempt's, worker/park.go, then the waker's):
//
//  1. Keep: the request's bytes and trace headers are copied to
//     <prefix>.parked.<queue>.<run> (Nats-Msg-Id <run>:park:<attempt>:<seq>)
//     before the record says parked, so a record that names a copy has it.
//     The stream keeps the newest copy per run; a run parked again names
//     its new copy (a new sequence: a new park).
//  2. The record, written by the parking attempt with its lease's
//     compare-and-set (a newer attempt makes it fail), keeps state running
//     and its waiting, and gets parked {seq, attempt, at}. Only then is the
//     request acknowledged: a crash before the ack redelivers it, and the
//     redelivery resumes the run as any later attempt (its lease take
//     clears parked).
//  3. Wake: whoever sees an approve or an abort for a run whose record is
//     parked (the wake consumer; the parking attempt itself for what came
//     while it parked, before it acknowledges its request: a crash before
//     the ack redelivers the request, after it nothing looks again)
//     publishes a copy of the kept request to the run's
//     submit subject with Agentfleet-Woken-From: <parked.seq>,
//     Agentfleet-Attempt-Base: <parked.attempt>, the kept copy's
//     Agentfleet-Wake-Key (a random key Keep put on it) and Nats-Msg-Id
//     <run>:wake:<parked.seq>. The waker writes nothing: any number of
//     wakes of one park are harmless (see 4), so the waker may publish,
//     crash and publish again.
//  4. Confirm (the pickup of a request with Agentfleet-Woken-From): it
//     counts only while the record names the same parked.seq and its bytes
//     are the kept copy's and it carries the copy's wake key (since 1.10:
//     parked.digest, the SHA-256 of key and bytes, is written with
//     parked.seq, so no read of the copy) and it came on the
//     record's queue, or when the record is already this request's
//     (a redelivery after the woken attempt took the lease, whether or
//     not that attempt parked the run again: a run parked by a woken
//     attempt that died before its ack resumes from the redelivered
//     wake, as invariant 2 says of any parked request). Then its
//     attempt is the base plus its delivery count, and its lease take (a
//     compare-and-set that clears parked) is the one wake of the park
//     that runs: every other copy of it finds the record no longer
//     parked, or another request's, and is dropped (acknowledged, no
//     event). A submitter who may publish requests cannot forge a wake:
//     it lacks the kept copy's wake key (since 1.10), which only workers
//     read (the run's owner has the bytes; 1.9 checked only those).
//  5. A wake copy squatted by another message under its Nats-Msg-Id (a
//     submitter's, within the dedupe window) is published again without
//     the id: the confirmation, not the dedupe, keeps the wake single.
//  6. A run parks only if AGENTS_PARKED keeps its copy and its timer until
//     the timer fires (Keeps: its first pending call's expiry within the
//     stream's max age, less a margin): a copy aged out first could never
//     be woken or aborted, and its record would say parked for ever. A
//     run that would outlive them keeps waiting off its slot.
package park

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// Env is what parking and waking need of the worker.
type Env struct {
	JS     jetstream.JetStream
	Names  bus.Names
	Runs   jetstream.Stream // AGENTS_RUNS
	Parked jetstream.Stream // AGENTS_PARKED
	// Read reads a run's record with its revision
	// (jetstream.ErrKeyNotFound: none).
	Read func(ctx context.Context, id string) (*bus.RunRecord, error)
	Log  *slog.Logger
	// KeepFor is AGENTS_PARKED's max age (0: none), as the worker found
	// the stream when it opened it.
	KeepFor time.Duration
	// Woke, when set, is told of every wake published: by what (ByAnswer,
	// ByTimer, ByParking, ByOther) and how long after what woke the run
	// was stored (negative: unknown). Metrics only: it must not block.
	Woke func(by string, d time.Duration)
}

// What woke a parked run (Env.Woke).
const (
	ByAnswer  = "answer"  // an approve or abort (the wake consumer)
	ByTimer   = "timer"   // a pending approval's timeout (the timers consumer)
	ByParking = "parking" // an answer that came while the run parked
	ByOther   = "other"   // a concurrency key's place, a child's end
)

// keepMargin is how long before the stream's max age a parked run's timer
// must fire: its wake then still reads the kept copy.
const keepMargin = time.Minute

// Keeps reports whether a run parked now, whose timer fires at due (its
// first pending call's expiry; zero: none), keeps its request copy and
// timer until then (invariant 6).
func (e *Env) Keeps(now, due time.Time) bool {
	return e.KeepFor <= 0 || due.IsZero() || due.Sub(now)+keepMargin <= e.KeepFor
}

// traceHeaders are kept on the copies (the submitter's trace).
var traceHeaders = []string{"traceparent", "tracestate"}

// Keep stores the copy of request req of run id (step 1) and returns its
// sequence in AGENTS_PARKED, with the digest its record's parked names.
func (e *Env) Keep(ctx context.Context, queue, id string, attempt int, req *jetstream.RawStreamMsg) (seq uint64, digest string, err error) {
	return e.KeepState(ctx, queue, id, attempt, req, "")
}

// KeepState is Keep, putting a non-empty state (the run's events) on the
// copy as Agentfleet-Parked-State.
func (e *Env) KeepState(ctx context.Context, queue, id string, attempt int, req *jetstream.RawStreamMsg, state string) (seq uint64, digest string, err error) {
	m := &nats.Msg{Subject: e.Names.Parked(queue, id), Data: req.Data, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, id+":park:"+strconv.Itoa(attempt)+":"+strconv.FormatUint(req.Sequence, 10))
	copyHeaders(m.Header, req.Header)
	key := rand.Text()
	m.Header.Set(bus.HeaderWakeKey, key)
	if state != "" {
		m.Header.Set(bus.HeaderParkedState, state)
	}
	ack, err := e.JS.PublishMsg(ctx, m, jetstream.WithExpectStream(e.Names.ParkedStream()))
	if err != nil {
		return 0, "", fmt.Errorf("keeping the parked request: %w", err)
	}
	return ack.Sequence, bus.RequestDigest(key, req.Data), nil
}

// ErrCopyGone: a parked run's request copy is gone (AGENTS_PARKED's max
// age, or a newer park replaced it), so it cannot be woken.
var ErrCopyGone = errors.New("parked run's request copy is gone")

// Wake publishes the wake of rec's park (step 3). A record not parked
// wakes nothing; nor does one whose copy is gone (logged: the record
// moved on, or says why the run cannot be woken).
func (e *Env) Wake(ctx context.Context, rec *bus.RunRecord) error {
	return e.WakeBy(ctx, rec, ByOther, time.Time{})
}

// WakeKept is Wake, but says ErrCopyGone when the copy is gone.
func (e *Env) WakeKept(ctx context.Context, rec *bus.RunRecord) error {
	return e.wakeBy(ctx, rec, ByOther, time.Time{})
}

// WakeBy is Wake, telling Woke what woke the run and when it was stored
// (zero: unknown).
func (e *Env) WakeBy(ctx context.Context, rec *bus.RunRecord, by string, stored time.Time) error {
	err := e.wakeBy(ctx, rec, by, stored)
	if errors.Is(err, ErrCopyGone) {
		e.Log.Warn("parked run's request copy is gone; cannot wake it", "run", rec.ID, "parkedSeq", rec.Parked.Seq)
		return nil
	}
	return err
}

func (e *Env) wakeBy(ctx context.Context, rec *bus.RunRecord, by string, stored time.Time) error {
	published, err := e.wake(ctx, rec)
	if published && e.Woke != nil {
		d := time.Duration(-1)
		if !stored.IsZero() {
			d = max(time.Since(stored), 0)
		}
		e.Woke(by, d)
	}
	return err
}

// wake is Wake; published reports whether a wake was published.
func (e *Env) wake(ctx context.Context, rec *bus.RunRecord) (published bool, err error) {
	if rec == nil || rec.Parked == nil {
		return false, nil
	}
	kept, err := e.kept(ctx, rec.Parked.Seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// Gone (max age) or replaced by a newer park: the record moved
		// on, or the run cannot be woken; the record says why.
		return false, ErrCopyGone
	}
	if err != nil {
		return false, fmt.Errorf("reading the parked request: %w", err)
	}
	// The wake goes back to the run's lane (since 1.10; the record says
	// which): a worker refuses a priority its subject does not carry.
	// The tenant lane too: the body's tenant is the subject's (Names.CheckTenant).
	var body struct {
		Metadata map[string]string `json:"metadata"`
	}
	_ = json.Unmarshal(kept.Data, &body) // a body without it goes to the no-tenant lane
	lane := bus.LaneOf(rec.Queue, rec.Priority, body.Metadata[bus.TenantMetadataKey])
	m := &nats.Msg{Subject: e.Names.RequestSubject(lane, rec.ID), Data: kept.Data, Header: nats.Header{}}
	copyHeaders(m.Header, kept.Header)
	seq := strconv.FormatUint(rec.Parked.Seq, 10)
	m.Header.Set(jetstream.MsgIDHeader, rec.ID+":wake:"+seq)
	m.Header.Set(bus.HeaderWokenFrom, seq)
	m.Header.Set(bus.HeaderAttemptBase, strconv.Itoa(rec.Parked.Attempt))
	if k := kept.Header.Get(bus.HeaderWakeKey); k != "" {
		m.Header.Set(bus.HeaderWakeKey, k)
	}
	if st := kept.Header.Get(bus.HeaderParkedState); st != "" {
		m.Header.Set(bus.HeaderParkedState, st)
	}
	ack, err := e.JS.PublishMsg(ctx, m, jetstream.WithExpectStream(e.Names.RunsStream()))
	if err != nil {
		return false, fmt.Errorf("publishing the wake: %w", err)
	}
	if ack.Duplicate && !e.isWake(ctx, ack.Sequence, m) {
		// Step 5: the id is taken by a message that is not this wake (or
		// one that was dropped).
		e.Log.Warn("wake: another message holds the wake's id; publishing the wake without it", "run", rec.ID)
		m.Header.Del(jetstream.MsgIDHeader)
		if _, err := e.JS.PublishMsg(ctx, m, jetstream.WithExpectStream(e.Names.RunsStream())); err != nil {
			return false, fmt.Errorf("publishing the wake: %w", err)
		}
	}
	return true, nil
}

// isWake reports whether the stored request seq is the wake m.
func (e *Env) isWake(ctx context.Context, seq uint64, m *nats.Msg) bool {
	got, err := e.Runs.GetMsg(ctx, seq)
	return err == nil && got.Subject == m.Subject && bytes.Equal(got.Data, m.Data) &&
		got.Header.Get(bus.HeaderWokenFrom) == m.Header.Get(bus.HeaderWokenFrom) &&
		got.Header.Get(bus.HeaderAttemptBase) == m.Header.Get(bus.HeaderAttemptBase) &&
		got.Header.Get(bus.HeaderWakeKey) == m.Header.Get(bus.HeaderWakeKey)
}

// Confirmation is what the pickup of a request learns of its wake header.
type Confirmation struct {
	Wake bool // the request carries Agentfleet-Woken-From
	// OK: the record confirms it (step 4); Base is its attempt base and
	// From the park it wakes. Not OK: drop the request.
	OK   bool
	Base int
	From uint64
	// Rec is the record the confirmation read (OK only): the pickup
	// starts from it instead of reading it again.
	Rec *bus.RunRecord
	// State is the wake's Agentfleet-Parked-State when the record's
	// parked.state names it and the record is still parked (the first
	// woken attempt of the park): the run's events, all of them.
	State string
}

// Confirm checks a request of run id on queue's submit subject at stream
// sequence reqSeq with headers h and body data (step 4). An error is a
// failed read: try again.
func (e *Env) Confirm(ctx context.Context, queue, id string, reqSeq uint64, h nats.Header, data []byte) (Confirmation, error) {
	text := h.Get(bus.HeaderWokenFrom)
	if text == "" {
		return Confirmation{}, nil
	}
	c := Confirmation{Wake: true}
	from, err1 := strconv.ParseUint(text, 10, 64)
	base, err2 := strconv.Atoi(h.Get(bus.HeaderAttemptBase))
	if err1 != nil || err2 != nil || from == 0 || base < 1 {
		return c, nil
	}
	rec, err := e.Read(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return c, nil
	}
	if err != nil {
		return c, err
	}
	switch {
	case rec.RequestSeq == reqSeq && !rec.Finished():
		// A redelivery: this wake took the lease already. Parked may name
		// a newer park (the woken attempt parked again and died before
		// its ack): the redelivery resumes the run as a plain request's
		// does (its lease take wins on the higher attempt and clears
		// parked); the newer park's own wakes then find the record
		// another request's and are dropped.
	case rec.Parked != nil && rec.Parked.Seq == from && rec.Parked.Attempt == base && !rec.Finished() && rec.Queue == queue &&
		rec.Parked.Digest != "":
		// On the run's own queue: a copy on another's would move the run.
		// The digest stands for the kept copy's wake key and bytes (no read).
		if bus.RequestDigest(h.Get(bus.HeaderWakeKey), data) != rec.Parked.Digest {
			return c, nil
		}
		// Only while parked: a later attempt may have stored more events.
		if st := h.Get(bus.HeaderParkedState); st != "" && rec.Parked.State != "" && bus.StateDigest(st) == rec.Parked.State {
			c.State = st
		}
	case rec.Parked != nil && rec.Parked.Seq == from && rec.Parked.Attempt == base && !rec.Finished() && rec.Queue == queue:
		// Parked by a 1.9 worker (no digest): the kept copy is read.
		kept, err := e.kept(ctx, from)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return c, nil
		}
		if err != nil {
			return c, err
		}
		if !bytes.Equal(kept.Data, data) {
			return c, nil
		}
		if k := kept.Header.Get(bus.HeaderWakeKey); k != "" && h.Get(bus.HeaderWakeKey) != k {
			return c, nil // not a worker's wake (a copy kept by 1.9 has no key)
		}
	case rec.RequestSeq == reqSeq && rec.Finished():
		// This wake ran to its end; only its ack was lost: the pickup
		// acknowledges it as any finished request's.
	default:
		return c, nil
	}
	c.OK, c.Base, c.From, c.Rec = true, base, from, rec
	return c, nil
}

// Forget removes the kept copy of a woken park (best effort: the stream's
// max age removes what a crash leaves).
func (e *Env) Forget(ctx context.Context, seq uint64) {
	if err := e.Parked.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		e.Log.Debug("cannot remove a woken run's parked request copy", "parkedSeq", seq, "err", err)
	}
}

// AnswerAfter reports whether run id has an approve stored after
// sequence approveAfter or an abort after abortAfter: what came while
// its attempt parked, which the wake consumer may have seen before the
// record said parked.
func (e *Env) AnswerAfter(ctx context.Context, control jetstream.Stream, id string, approveAfter, abortAfter uint64) (bool, error) {
	for _, q := range []struct {
		kind  string
		after uint64
	}{{bus.KindApprove, approveAfter}, {bus.KindAbort, abortAfter}} {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := control.GetMsg(gctx, q.after+1, jetstream.WithGetMsgSubject(e.Names.Control(id, q.kind)))
		cancel()
		switch {
		case err == nil:
			return true, nil
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			return false, err
		}
	}
	return false, nil
}

func copyHeaders(dst, src nats.Header) {
	for _, k := range traceHeaders {
		if v := src.Get(k); v != "" {
			dst.Set(k, v)
		}
	}
}
