package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
	"github.com/agentfleet/agentfleet/tracing"
	"github.com/agentfleet/agentfleet/worker/internal/giveup"
	"github.com/agentfleet/agentfleet/worker/internal/handoff"
	"github.com/agentfleet/agentfleet/worker/internal/metering"
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
//  2. the request is just removed, with no dead letter, when its record
//     has finished (only the ack was lost; a run_finished the events lack
//     is published from the record first), names it in a requeue marker
//     (requeued already) or belongs to another running request; a request
//     whose waiting run drains handed back is requeued instead (requeue);
//  3. a copy goes to agents.dead.<queue>.<run> (stream AGENTS_DEAD,
//     Nats-Msg-Id <run>:<requestSeq>, headers with the reason);
//  4. the lease is taken as attempt deliveries+1 (plus a requeued copy's
//     attempt base; the same attempt when an earlier try of this step
//     took it, otherwise never below the record's attempt + 1), fencing a
//     stalled last worker; run_started, run_resumed (the transcript so far
//     stays readable), the final record failed/gave_up, run_finished;
//  5. the request is deleted from AGENTS_RUNS and the advisory acked.

type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries int    `json:"deliveries"`
}

// requeueBindWait bounds how long a copy picked up before the give-up
// bound it to the run's record waits for that (one record write).
const requeueBindWait = 5 * time.Second

// startGiveUp starts pulling MAX_DELIVERIES advisories; the returned
// function stops it and waits for a give-up in progress.
func (w *Worker) startGiveUp(ctx context.Context) (stop func()) {
	cons, err := w.js.Consumer(ctx, w.names.AdvisoriesStream(), w.names.GiveUpConsumer())
	if err != nil {
		w.log.Warn("give-up disabled: no advisories consumer (create the streams with EnsureStreams)", "err", err)
		return func() {}
	}
	// A give-up reads and writes NATS: never in the callback.
	stop, err = handoff.Consume(w.hardCtx, cons, 4, "advisories consumer", w.log, func(_ context.Context, m jetstream.Msg) {
		w.onAdvisory(m)
	})
	if err != nil {
		w.log.Warn("give-up disabled", "err", err)
		return func() {}
	}
	return stop
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
	// The finish's settlement removes the request, and so does the end of
	// the give-up: the server refuses a second delete, so only one is sent.
	var removed atomic.Bool
	removeRequest := func() error {
		if removed.Load() {
			return nil
		}
		// Its own deadline: it comes after the finish, which may have
		// used up ctx's.
		dctx, cancel := context.WithTimeout(w.hardCtx, 5*time.Second)
		defer cancel()
		if err := w.runsStream.DeleteMsg(dctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("remove request: %w", err)
		}
		removed.Store(true)
		return nil
	}
	queue, id, err := w.names.ParseSubmit(req.Subject)
	if err != nil {
		w.log.Warn("give-up: request with an invalid subject removed", "requestSeq", adv.StreamSeq)
		return removeRequest()
	}
	rec, err := w.getRecord(ctx, id)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	log := w.log.With("run", id, "queue", queue)
	from, _ := strconv.ParseUint(req.Header.Get(bus.HeaderRequeuedFrom), 10, 64)
	d := giveup.Classify(rec, adv.StreamSeq, from, adv.Deliveries, w.cfg.MaxDeliver)
	switch d.Action {
	case giveup.Finished:
		// The last delivery (or this give-up, retried) may have crashed
		// between the final record and run_finished: no delivery is left
		// to publish it, so the give-up does.
		r := w.newRun(id, queue, max(rec.Attempt, 1), adv.StreamSeq, req.Time)
		missing, err := r.finishFromRecord(ctx, rec, settlement{done: func(context.Context) error { return removeRequest() }})
		if err != nil || missing {
			return err
		}
		log.Info("give-up: run had finished (its ack was lost); request removed", "state", rec.State)
		return removeRequest()
	case giveup.Republish:
		return w.publishRequeue(ctx, req, rec, adv, removeRequest)
	case giveup.Remove:
		return removeRequest()
	case giveup.HeldByAnother:
		log.Warn("give-up: request removed; its run id is held by another running request", "recordRequestSeq", rec.RequestSeq)
		return removeRequest()
	case giveup.Requeue:
		return w.requeue(ctx, req, rec, adv, d.Base, d.Crashes, removeRequest)
	}
	if d.MaxedOut {
		log.Info("give-up: deliveries that were not waiting hand-backs reached MaxDeliver", "crashes", d.Crashes)
	}
	attempt, copyOf := d.Attempt, d.CopyOf
	log = log.With("attempt", attempt)
	// The dead letter first: the request is never gone without a copy.
	dl := &nats.Msg{Subject: w.names.Dead(queue, id), Data: req.Data, Header: nats.Header{}}
	dl.Header.Set(jetstream.MsgIDHeader, id+":"+strconv.FormatUint(adv.StreamSeq, 10))
	dl.Header.Set(bus.HeaderDeadReason, bus.ReasonGaveUp)
	dl.Header.Set(bus.HeaderDeadDeliveries, strconv.Itoa(adv.Deliveries))
	dl.Header.Set(bus.HeaderDeadSubject, req.Subject)
	dl.Header.Set(bus.HeaderDeadRequestSeq, strconv.FormatUint(adv.StreamSeq, 10))
	copyTraceContext(dl.Header, req.Header)
	if _, err := w.js.PublishMsg(ctx, dl, jetstream.WithExpectStream(w.names.DeadStream())); err != nil {
		return fmt.Errorf("dead letter: %w", err)
	}
	if rec == nil || !rec.Finished() {
		r := w.newRun(id, queue, attempt, adv.StreamSeq, req.Time)
		r.lease.RequeuedFrom = copyOf
		if rec != nil && !rec.StartedAt.IsZero() {
			r.runStart = rec.StartedAt
		}
		// A lost lease: a newer attempt fenced this one; the request goes.
		end := r.traceGaveUp(req.Header) // trace.go: the give-up is an attempt too
		err := r.finishGaveUp(ctx, rec, req.Data, adv.Deliveries, removeRequest)
		end(err)
		if err != nil && !leaseGone(err) {
			return err
		}
	}
	if err := removeRequest(); err != nil {
		return err
	}
	log.Warn("run given up", "deliveries", adv.Deliveries, "deadLetter", w.names.Dead(queue, id))
	return nil
}

// gaveUpUsage is what the give-up's run_resumed carries as cutOffUsage
// (as a resume's: cutOffUsage) and the run's usage as the events tell it:
// that plus the usage of the restored messages that are the run's (after
// its prompt) and of the summary calls (compaction_end). The prompt's
// length comes from the request (and the transcript it continues); if that
// cannot be read, no message of the view counts as the run's, and only the
// cut-off usage earlier resumes carried does.
func (r *run) gaveUpUsage(ctx context.Context, rc *workerproto.Recovery, request []byte, byRef bool) (cut, usage agent.Usage) {
	promptLen, ok := r.requestPromptLen(ctx, request, byRef)
	if !ok {
		promptLen = len(rc.Messages) + len(rc.DroppedMessages)
	}
	cut = cutOffUsage(rc, promptLen)
	usage = cut
	for _, m := range rc.Messages[min(promptLen, len(rc.Messages)):] {
		if m.Role == agent.RoleAssistant {
			usage.Add(metering.NonNegative(m.Usage))
		}
	}
	// The summary calls were charged too, and are in no message (as resume
	// carries them); not in cut, which run_resumed publishes without them.
	_, _, _, summaries := compactionsIn(rc.Compactions)
	usage.Add(summaries)
	return cut, usage
}

// requestPromptLen is how many messages a run's request put before its
// first model call, as the pickup counts them (plan): the transcript it
// continues (unless byRef: since 1.9 it is not in the run's events), its
// messages, its prompt. ok is false when the request, or the transcript it
// continues, cannot be read.
func (r *run) requestPromptLen(ctx context.Context, request []byte, byRef bool) (n int, ok bool) {
	var req struct {
		Prompt       string            `json:"prompt"`
		Messages     []json.RawMessage `json:"messages"`
		ContinueFrom string            `json:"continueFrom"`
	}
	if err := json.Unmarshal(request, &req); err != nil {
		r.log.Warn("give-up: cannot read the request; the restored messages' usage is left out of the run's", "err", err)
		return 0, false
	}
	n = len(req.Messages)
	if req.Prompt != "" {
		n++
	}
	if !byRef && req.ContinueFrom != "" && bus.ValidID(req.ContinueFrom) && req.ContinueFrom != r.id {
		prior, err := r.priorLen(ctx, req.ContinueFrom)
		if err != nil {
			r.log.Warn("give-up: cannot read the transcript the run continues; the restored messages' usage is left out of the run's",
				"continueFrom", req.ContinueFrom, "err", err)
			return 0, false
		}
		n += prior // published as the run's events before 1.9
	}
	return n, true
}

// requeue replaces a request whose deliveries ran out while drains
// handed its waiting run back: hand-backs while waiting must not use up
// MaxDeliver. First the run's record gets the requeue marker (compare-and-
// set: a holder that was only stalled loses its lease), naming the request
// replaced, the attempts used so far (attempts keep rising) and the
// deliveries that were not waiting hand-backs; then the copy is published
// (publishRequeue). The marker is what makes the copy's headers count: a
// request that merely carries them takes nothing over. The copy's record
// starts its waitingHandBacks again at 0, so a run that only crashes is
// given up as usual.
func (w *Worker) requeue(ctx context.Context, req *jetstream.RawStreamMsg, rec *bus.RunRecord, adv maxDeliveriesAdvisory, base, crashes int, removeRequest func() error) error {
	marked := *rec
	marked.Requeue = &bus.Requeue{From: adv.StreamSeq, AttemptBase: max(rec.Attempt, base+adv.Deliveries), Crashes: crashes}
	data, err := agent.MarshalJSON(&marked)
	if err != nil {
		return err
	}
	rev, err := w.kv.Update(ctx, rec.ID, data, rec.Revision)
	if err != nil {
		return fmt.Errorf("requeue marker: %w", err) // the advisory is handled again
	}
	marked.Revision = rev
	return w.publishRequeue(ctx, req, &marked, adv, removeRequest)
}

// publishRequeue publishes the copy of the request rec's marker names,
// binds it in the marker (its stream sequence: no other request naming
// the old one counts), then removes the old request. A copy published
// twice (this step retried) is dropped by its Nats-Msg-Id; a message
// already stored under that id that is not the copy is not taken for it.
func (w *Worker) publishRequeue(ctx context.Context, req *jetstream.RawStreamMsg, rec *bus.RunRecord, adv maxDeliveriesAdvisory, removeRequest func() error) error {
	if rec.Requeue.Copy == 0 {
		m := &nats.Msg{Subject: req.Subject, Data: req.Data, Header: nats.Header{}}
		msgID := rec.ID + ":requeue:" + strconv.FormatUint(adv.StreamSeq, 10)
		m.Header.Set(jetstream.MsgIDHeader, msgID)
		m.Header.Set(bus.HeaderRequeuedFrom, strconv.FormatUint(adv.StreamSeq, 10))
		m.Header.Set(bus.HeaderAttemptBase, strconv.Itoa(rec.Requeue.AttemptBase))
		copyTraceContext(m.Header, req.Header)
		ack, err := w.js.PublishMsg(ctx, m, jetstream.WithExpectStream(w.names.RunsStream()))
		if err != nil {
			return fmt.Errorf("requeue: %w", err)
		}
		if ack.Duplicate && !w.isRequeueCopy(ctx, ack.Sequence, m) {
			w.log.Warn("requeue: another message holds the copy's id; publishing the copy without it", "run", rec.ID)
			m.Header.Del(jetstream.MsgIDHeader)
			if ack, err = w.js.PublishMsg(ctx, m, jetstream.WithExpectStream(w.names.RunsStream())); err != nil {
				return fmt.Errorf("requeue: %w", err)
			}
		}
		bound := *rec
		q := *rec.Requeue
		q.Copy = ack.Sequence
		bound.Requeue = &q
		data, err := agent.MarshalJSON(&bound)
		if err != nil {
			return err
		}
		if _, err := w.kv.Update(ctx, rec.ID, data, rec.Revision); err != nil {
			return fmt.Errorf("requeue: binding the copy: %w", err) // handled again
		}
		rec = &bound
	}
	if err := removeRequest(); err != nil {
		return err
	}
	w.log.Info("request requeued: its deliveries ran out while the run waited (handed back by drains)",
		"run", rec.ID, "deliveries", adv.Deliveries, "waitingHandBacks", rec.WaitingHandBacks,
		"attemptBase", rec.Requeue.AttemptBase, "crashes", rec.Requeue.Crashes, "copy", rec.Requeue.Copy)
	return nil
}

// isRequeueCopy reports whether the stored message seq is the copy m.
func (w *Worker) isRequeueCopy(ctx context.Context, seq uint64, m *nats.Msg) bool {
	got, err := w.runsStream.GetMsg(ctx, seq)
	return err == nil && got.Subject == m.Subject && bytes.Equal(got.Data, m.Data) &&
		got.Header.Get(bus.HeaderRequeuedFrom) == m.Header.Get(bus.HeaderRequeuedFrom) &&
		got.Header.Get(bus.HeaderAttemptBase) == m.Header.Get(bus.HeaderAttemptBase)
}

// copyTraceContext keeps the submitter's trace on a copy of its request
// (a requeued copy, a dead letter).
func copyTraceContext(dst, src nats.Header) {
	for _, k := range []string{tracing.TraceparentHeader, tracing.TracestateHeader} {
		if v := src.Get(k); v != "" {
			dst.Set(k, v)
		}
	}
}
