package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
)

// Giving up. When a request's delivery count reaches MaxDeliver and its
// last delivery ends without an ack (the worker crashed, stalled, or handed
// it back), the server publishes a MAX_DELIVERIES advisory. The stream
// AGENTS_ADVISORIES stores those advisories (work queue) and every worker
// pulls them from the shared durable consumer "giveup", so the give-up
// happens even when the worker of the last delivery is gone, and happens
// again if the worker handling it dies half-way (each step is idempotent):
//
//  1. the request is read from AGENTS_RUNS by its stream sequence (gone:
//     done already);
//  2. a finished record means only the ack was lost: the request is just
//     removed;
//  3. a copy goes to agents.dead.<queue>.<run> (stream AGENTS_DEAD,
//     Nats-Msg-Id <run>:<requestSeq>, headers with the reason);
//  4. the lease is taken as attempt deliveries+1 (fencing a stalled last
//     worker), run_started, run_resumed (the transcript so far stays
//     readable), the final record failed/gave_up, run_finished;
//  5. the request is deleted from AGENTS_RUNS and the advisory acked.

type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries int    `json:"deliveries"`
}

// Dead-letter headers.
const (
	HeaderDeadReason     = "Agentfleet-Dead-Reason"
	HeaderDeadDeliveries = "Agentfleet-Deliveries"
	HeaderDeadSubject    = "Agentfleet-Subject"
	HeaderDeadRequestSeq = "Agentfleet-Request-Seq"
)

// Requeue headers: a request whose deliveries ran out while its run was
// waiting (handed back by drains) is published again; the copy names the
// request it replaces and the attempts already used.
const (
	HeaderRequeuedFrom = "Agentfleet-Requeued-From"
	HeaderAttemptBase  = "Agentfleet-Attempt-Base"
)

// startGiveUp starts pulling MAX_DELIVERIES advisories; the returned
// function stops it and waits for a give-up in progress.
func (w *Worker) startGiveUp(ctx context.Context) (stop func()) {
	cons, err := w.js.Consumer(ctx, w.names.AdvisoriesStream(), w.names.GiveUpConsumer())
	if err != nil {
		w.log.Warn("give-up disabled: no advisories consumer (create the streams with EnsureStreams)", "err", err)
		return func() {}
	}
	// wg counts give-ups in progress; once stopping, none starts (so Add
	// never races with Wait).
	var wg sync.WaitGroup
	var mu sync.Mutex
	stopping := false
	cc, err := cons.Consume(func(m jetstream.Msg) {
		mu.Lock()
		if stopping {
			mu.Unlock()
			_ = m.Nak()
			return
		}
		wg.Add(1)
		mu.Unlock()
		// A give-up reads and writes NATS: never in the callback. The
		// consumer's MaxAckPending bounds how many run at once.
		go func() {
			defer wg.Done()
			w.onAdvisory(m)
		}()
	}, jetstream.PullMaxMessages(4), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if w.hardCtx.Err() == nil {
			w.log.Debug("advisories consumer", "err", err)
		}
	}))
	if err != nil {
		w.log.Warn("give-up disabled", "err", err)
		return func() {}
	}
	return func() {
		mu.Lock()
		stopping = true
		mu.Unlock()
		cc.Stop()
		<-cc.Closed()
		wg.Wait()
	}
}

func (w *Worker) onAdvisory(m jetstream.Msg) {
	var adv maxDeliveriesAdvisory
	if err := json.Unmarshal(m.Data(), &adv); err != nil || adv.StreamSeq == 0 || adv.Stream != w.names.RunsStream() {
		_ = m.Term()
		return
	}
	// The advisory stays this worker's while the give-up runs (its finish
	// alone may take one AckWait): another worker must not give the same
	// run up with the same attempt.
	stop := make(chan struct{})
	beat := make(chan struct{})
	go func() {
		defer close(beat)
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				_ = m.InProgress()
			case <-stop:
				return
			}
		}
	}()
	defer func() { close(stop); <-beat }()
	ctx, cancel := context.WithTimeout(w.hardCtx, 30*time.Second)
	defer cancel()
	if err := w.giveUp(ctx, adv); err != nil {
		w.log.Warn("give-up failed; retrying", "requestSeq", adv.StreamSeq, "err", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	_ = m.Ack()
}

func (w *Worker) giveUp(ctx context.Context, adv maxDeliveriesAdvisory) error {
	req, err := w.runsStream.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // acked meanwhile, or given up already
	}
	if err != nil {
		return fmt.Errorf("read request: %w", err)
	}
	removeRequest := func() error {
		// Its own deadline: it comes after the finish, which may have
		// used up ctx's.
		dctx, cancel := context.WithTimeout(w.hardCtx, 5*time.Second)
		defer cancel()
		if err := w.runsStream.DeleteMsg(dctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("remove request: %w", err)
		}
		return nil
	}
	queue, id, err := w.names.ParseSubmit(req.Subject)
	if err != nil {
		w.log.Warn("give-up: request with an invalid subject removed", "requestSeq", adv.StreamSeq)
		return removeRequest()
	}
	log := w.log.With("run", id, "queue", queue, "attempt", adv.Deliveries+1)
	rec, err := w.getRecord(ctx, id)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	if rec != nil && rec.Finished() && (rec.RequestSeq == 0 || rec.RequestSeq == adv.StreamSeq) {
		log.Info("give-up: run had finished (its ack was lost); request removed", "state", rec.State)
		return removeRequest()
	}
	if rec != nil && !rec.Finished() && rec.WaitingHandBacks > 0 && rec.RequestSeq == adv.StreamSeq {
		return w.requeue(ctx, req, rec, adv, removeRequest)
	}
	// The dead letter first: the request is never gone without a copy.
	dl := &nats.Msg{Subject: w.names.Dead(queue, id), Data: req.Data, Header: nats.Header{}}
	dl.Header.Set(jetstream.MsgIDHeader, id+":"+strconv.FormatUint(adv.StreamSeq, 10))
	dl.Header.Set(HeaderDeadReason, bus.ReasonGaveUp)
	dl.Header.Set(HeaderDeadDeliveries, strconv.Itoa(adv.Deliveries))
	dl.Header.Set(HeaderDeadSubject, req.Subject)
	dl.Header.Set(HeaderDeadRequestSeq, strconv.FormatUint(adv.StreamSeq, 10))
	if _, err := w.js.PublishMsg(ctx, dl, jetstream.WithExpectStream(w.names.DeadStream())); err != nil {
		return fmt.Errorf("dead letter: %w", err)
	}
	if rec == nil || !rec.Finished() {
		r := w.newRun(id, queue, adv.Deliveries+1, adv.StreamSeq, req.Time)
		if rec != nil && !rec.StartedAt.IsZero() {
			r.runStart = rec.StartedAt
		}
		// A lost lease: a newer attempt fenced this one; the request goes.
		if err := r.finishGaveUp(ctx, rec, adv.Deliveries, removeRequest); err != nil && !errors.Is(err, errLeaseLost) {
			return err
		}
	}
	if err := removeRequest(); err != nil {
		return err
	}
	log.Warn("run given up", "deliveries", adv.Deliveries, "deadLetter", w.names.Dead(queue, id))
	return nil
}

// finishGaveUp marks the run failed/gave_up under the lease, with its own
// attempt: run_started, run_resumed (the transcript so far), then the
// finish, whose settlement removes the request (the caller then acks the
// advisory).
func (r *run) finishGaveUp(ctx context.Context, prev *bus.RunRecord, deliveries int, removeRequest func() error) error {
	if prev != nil && prev.Model != "" {
		if m, err := bus.ParseModelRef(prev.Model); err == nil {
			r.modelRef = m
		}
	}
	rec := r.record(bus.StateRunning)
	if prev != nil {
		rec.Model, rec.Metadata, rec.Turns, rec.Usage, rec.Cost = prev.Model, prev.Metadata, prev.Turns, prev.Usage, prev.Cost
	}
	o, cur, err := r.lease.take(ctx, prev, rec)
	if err != nil {
		return err
	}
	if o != leaseTaken {
		if o == leaseFinished {
			r.log.Info("give-up: run finished meanwhile", "state", cur.State)
		}
		return nil
	}
	r.pub = newPublisher(r.w, r.id, r.attempt, nil)
	_, _ = r.pub.fleetEvent(bus.EventRunStarted, r.runStarted())
	// Readers restore messagesRestored messages: an unreadable history is
	// an error to retry (the advisory is handled again), not an empty one.
	seq, err := r.pub.startedAt(ctx)
	if err != nil {
		_ = r.pub.flush(ctx)
		return fmt.Errorf("give-up: run_started not stored: %w", err)
	}
	envs, err := r.w.c.ReadEvents(ctx, r.id, seq)
	if err != nil {
		_ = r.pub.flush(ctx)
		return fmt.Errorf("give-up: reading the run's events: %w", err)
	}
	restored := len(workerproto.Recover(envs, time.Now().UnixMilli()).Messages)
	_, _ = r.pub.fleetEvent(bus.EventRunResumed, bus.RunResumed{Type: bus.EventRunResumed, Attempt: r.attempt, MessagesRestored: restored})
	text := fmt.Sprintf("gave up after %d deliveries: every attempt ended without finishing (worker crashed, stalled or stopped); the request is on %s",
		deliveries, r.w.names.Dead(r.queue, r.id))
	rec.State, rec.Reason, rec.Error, rec.FinishedAt, rec.HeartbeatAt = bus.StatusFailed, bus.ReasonGaveUp, text, time.Now(), time.Now()
	fin := bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusFailed, Reason: bus.ReasonGaveUp, Error: text,
		Usage: rec.Usage, Cost: rec.Cost, Turns: rec.Turns, DurationMs: time.Since(r.runStart).Milliseconds()}
	return r.finish(ending{record: rec, fin: fin,
		settle: settlement{done: func(context.Context) error { return removeRequest() }}})
}

// requeue publishes a copy of a request whose deliveries ran out while
// drains handed its waiting run back: hand-backs while waiting must not
// use up MaxDeliver. The copy carries the request it replaces (its record
// stays the run's lease: the next attempt takes it over) and the attempts
// used so far (attempts keep rising); then the old request is removed. A
// copy published twice (this step retried) is dropped by its Nats-Msg-Id.
// The record's waitingHandBacks starts again at 0 with the copy, so a run
// that only crashes is given up as usual.
func (w *Worker) requeue(ctx context.Context, req *jetstream.RawStreamMsg, rec *bus.RunRecord, adv maxDeliveriesAdvisory, removeRequest func() error) error {
	base := max(rec.Attempt, adv.Deliveries)
	if prev, err := strconv.Atoi(req.Header.Get(HeaderAttemptBase)); err == nil && prev+adv.Deliveries > base {
		base = prev + adv.Deliveries
	}
	m := &nats.Msg{Subject: req.Subject, Data: req.Data, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, rec.ID+":requeue:"+strconv.FormatUint(adv.StreamSeq, 10))
	m.Header.Set(HeaderRequeuedFrom, strconv.FormatUint(adv.StreamSeq, 10))
	m.Header.Set(HeaderAttemptBase, strconv.Itoa(base))
	if _, err := w.js.PublishMsg(ctx, m, jetstream.WithExpectStream(w.names.RunsStream())); err != nil {
		return fmt.Errorf("requeue: %w", err)
	}
	if err := removeRequest(); err != nil {
		return err
	}
	w.log.Info("request requeued: its deliveries ran out while the run waited (handed back by drains)",
		"run", rec.ID, "deliveries", adv.Deliveries, "waitingHandBacks", rec.WaitingHandBacks, "attemptBase", base)
	return nil
}
