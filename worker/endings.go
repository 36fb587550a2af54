package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
	"github.com/agentfleet/agentfleet/worker/internal/eventpub"
	"github.com/agentfleet/agentfleet/worker/internal/lease"
	"github.com/agentfleet/agentfleet/worker/internal/runtrace"
)

// Every way an attempt ends, in one place:
//
//   - conclude: the agent's run ended; the attempt finishes or is handed
//     back (mustNotFinish).
//   - finish: events stored, the final record, run_finished, then the
//     request settled (ackRequest, termRequest); an ending says what.
//   - handBack: the request goes back to the queue for another attempt.
//   - abandon: another attempt owns the run; nothing more is published.
//   - refuse, alreadyFinished, reusedID, badRequest, refuseAtPickup: a
//     request that may not run ends without a turn.
//   - finishFromRecord: a run_finished the events lack, from the record.
//   - finishGaveUp: the give-up's own attempt fails the run (giveup.go
//     decides when: internal/giveup).

// ending is how an attempt ends: what it publishes and writes, and what
// then happens to its request.
type ending struct {
	// started is published first by an attempt that never started (a
	// refused request).
	started *bus.RunStarted
	// msgIDHead is the envelopes' Nats-Msg-Id before their seq when the
	// finish creates the publisher; "": the attempt's own (workerproto.MsgID).
	msgIDHead string
	// record is the final record, written with the lease's last
	// compare-and-set; nil when it is written already (a bad request
	// takes the lease with it) or is not this request's (a reused id).
	record *bus.RunRecord
	fin    bus.RunFinished
	settle settlement
}

// settlement is what happens to the request once its run_finished is
// stored (done), or when it could not be (retry; nil: the caller retries
// on the returned error).
type settlement struct {
	done  func(ctx context.Context) error
	retry func()
}

// ackRequest settles a run that finished.
func (r *run) ackRequest() settlement {
	return settlement{
		done: func(ctx context.Context) error {
			if err := r.msg.DoubleAck(ctx); err != nil {
				r.log.Warn("ack failed", "err", err)
			}
			return nil
		},
		retry: func() { _ = r.msg.NakWithDelay(time.Second) },
	}
}

// termRequest settles a request that must not run.
func (r *run) termRequest(reason string) settlement {
	return settlement{
		done:  func(context.Context) error { return r.msg.TermWithReason(reason) },
		retry: func() { _ = r.msg.NakWithDelay(time.Second) },
	}
}

// finishContext bounds a finish (and a lease take): one AckWait from now,
// not cancelled when the run stops or the worker drains.
func (r *run) finishContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.w.hardCtx), r.w.cfg.AckWait)
}

// finish ends an attempt: every event before run_finished is stored, then
// the final record (the lease's last compare-and-set), then run_finished,
// then the request is settled. So a follower that saw run_finished reads
// the final record, and an attempt that lost the lease publishes no
// run_finished. It returns errLeaseLost when another attempt owns the
// run (nothing more is published and the request is left alone), or the
// error that kept the run from finishing (the request was handed back
// through settle.retry).
func (r *run) finish(e ending) error {
	ctx, cancel := r.finishContext()
	defer cancel()
	if r.hb != nil {
		r.hb.stopRenewing()
	}
	if r.lease.Lost() {
		// The renewal stopRenewing waited for found a newer attempt.
		r.abandon("run stopped at its end: lease lost to a newer attempt")
		return errLeaseLost
	}
	if r.pub == nil {
		r.pub = eventpub.New(r.w.events, eventpub.Attempt{Run: r.id, Attempt: r.attempt, MsgIDHead: e.msgIDHead}, nil)
	}
	if e.started != nil {
		_, _ = r.pub.Fleet(bus.EventRunStarted, *e.started)
	}
	// The snapshot is written beside the events' flush, not after it:
	// both come before the final record (a continuation that finds the
	// run finished finds its snapshot, continuation.go), and a snapshot
	// is trusted only when its attempt is the finished record's, so one
	// stored for events that then fail to store is never read.
	snapped := make(chan struct{})
	if e.record != nil {
		go func() {
			defer close(snapped)
			r.writeSnapshot(ctx)
		}()
	} else {
		close(snapped)
	}
	if f := r.w.cfg.beforeEventsSync; f != nil {
		f(ctx, r.id)
	}
	err := r.pub.Sync(ctx)
	<-snapped
	if err != nil {
		return r.notStored(ctx, e.settle, "events not stored", err)
	}
	if e.record != nil {
		start := time.Now()
		err := r.lease.WriteFinal(ctx, e.record)
		r.traceStep(runtrace.SpanRecord, start, err)
		if leaseGone(err) {
			r.abandon("run stopped at its end: lease lost to a newer attempt")
			return err
		}
		if err != nil {
			return r.notStored(ctx, e.settle, "final record not stored", err)
		}
	}
	if err := r.storeFinished(ctx, e.fin, e.settle); err != nil {
		return err
	}
	link := r.childLink()
	if e.record != nil {
		link = e.record.Child
	}
	woken := r.wakeParent(ctx, link) // worker/children.go
	r.left = true
	r.traceFinished(e.fin)
	r.w.obs.RunFinished(r.info(), e.fin)
	// The run is over for everyone: the next request need not wait out
	// the settlement's round trip (a lost ack redelivers a finished run,
	// which pickup acks). Reported finished first, so runs in flight
	// never pass the slots.
	r.slot.release()
	r.releaseKey(ctx) // keys.go: after run_finished is stored
	if woken != nil && e.settle.retry != nil {
		e.settle.retry() // the redelivery finds the run finished and wakes again
		return nil
	}
	return e.settle.done(ctx)
}

// storeFinished publishes run_finished and waits until every event is
// stored; if they are not, it hands the request back through s.
func (r *run) storeFinished(ctx context.Context, fin bus.RunFinished, s settlement) error {
	_, _ = r.pub.Fleet(bus.EventRunFinished, fin)
	if err := r.pub.Flush(ctx); err != nil {
		return r.notStored(ctx, s, "run_finished not stored", err)
	}
	r.endHeartbeat()
	return nil
}

// notStored hands the request back after a failed finish, unless the
// lease is gone.
func (r *run) notStored(ctx context.Context, s settlement, what string, err error) error {
	_ = r.pub.Flush(ctx)
	r.endHeartbeat()
	if !r.stillOwned(ctx) {
		r.abandon("run stopped at its end: lease lost to a newer attempt")
		return errLeaseLost
	}
	if s.retry == nil {
		r.log.Error(what+"; to be tried again", "err", err) // a give-up: its advisory
	} else {
		r.log.Error(what+"; handing the request back", "err", err)
		s.retry()
	}
	return fmt.Errorf("%s: %w", what, err)
}

// stillOwned re-checks the lease (a compare-and-set) before a nak: the
// server does not tell a request's deliveries apart, so a nak from an
// attempt that lost its lease would reschedule the newer attempt's
// delivery. Call it once the heartbeat no longer renews.
func (r *run) stillOwned(ctx context.Context) bool {
	if r.lease.Lost() {
		return false
	}
	if !r.lease.Written() {
		return true // never taken (a reused id): the request is this attempt's to settle
	}
	return !leaseGone(r.lease.Renew(ctx, r.record(bus.StateRunning)))
}

// abandon stops an attempt whose lease a newer attempt took: nothing more
// is published and the request is neither acked nor naked.
func (r *run) abandon(why string) {
	r.endHeartbeat()
	r.pub.Abandon()
	r.log.Warn(why)
}

// handBack stops an attempt that must not finish: what it published is
// stored (the next attempt resumes from it) and the request is naked,
// unless the lease is gone.
func (r *run) handBack(delay time.Duration, why string, err error) {
	ctx, cancel := r.finishContext()
	defer cancel()
	_ = r.pub.Flush(ctx)
	r.endHeartbeat()
	if !r.stillOwned(ctx) {
		r.abandon("run stopped: lease lost to a newer attempt")
		return
	}
	if err != nil {
		r.log.Error(why, "err", err)
	} else {
		r.log.Warn(why)
	}
	if delay > 0 {
		_ = r.msg.NakWithDelay(delay)
	} else {
		_ = r.msg.Nak()
	}
}

// refuse handles a request that must not run: its run has finished, or the
// record belongs to another request or a newer attempt.
func (r *run) refuse(o lease.Outcome, rec *bus.RunRecord) {
	// The copy must not run: its keep-alive ends first (and a beat under
	// way is waited for). A stale copy's InProgress would extend the
	// newer delivery's AckWait (the server matches it by stream sequence).
	r.pickupBeat.stop()
	switch o {
	case lease.Finished:
		if rec.RequestSeq == 0 || rec.RequestSeq == r.reqSeq || rec.RequestSeq == r.lease.RequeuedFrom {
			// This request already ran to its end; only the ack was lost.
			r.alreadyFinished(rec)
			return
		}
		r.reusedID(rec)
	case lease.Reused:
		// Another request with this id is running: nothing may touch its
		// record or events.
		r.log.Warn("bad request: run id in use by another running request; terminated", "recordRequestSeq", rec.RequestSeq)
		_ = r.msg.TermWithReason("bad_request: run id in use by another request")
	case lease.Newer:
		// A newer delivery owns the run; this one is stale. Neither ack nor
		// nak: either would act on the newer delivery.
		r.log.Warn("stale delivery of a run a newer attempt owns; ignored", "recordAttempt", rec.Attempt)
	case lease.Unread:
		// worker/internal/lease: the redelivery reads the record at pickup.
		r.log.Info("first delivery found a run record it did not read; handing the request back", "recordAttempt", rec.Attempt)
		_ = r.msg.Nak()
	}
}

// alreadyFinished acks a redelivered request whose run has finished,
// after publishing its run_finished if a crash lost it (finishFromRecord).
func (r *run) alreadyFinished(rec *bus.RunRecord) {
	ctx, cancel := r.finishContext()
	defer cancel()
	// A crash (or a failed wake) may have come before the child's wake:
	// the parent comes from the record, this delivery has no request
	// (worker/children.go). The wake comes before the ack: a failed one
	// hands the request back to wake again.
	ack := r.ackRequest()
	ack.done = func(ctx context.Context) error {
		if r.wakeParent(ctx, rec.Child) != nil {
			ack.retry()
			return nil
		}
		if err := r.msg.DoubleAck(ctx); err != nil {
			r.log.Warn("ack failed", "err", err)
		}
		return nil
	}
	switch missing, err := r.finishFromRecord(ctx, rec, ack); {
	case err != nil && !missing:
		r.log.Warn("cannot read the run's events; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
	case missing:
		// Published, woken and acked, or handed back (storeFinished).
	default:
		r.log.Info("request already finished; acknowledging", "state", rec.State)
		_ = ack.done(ctx)
	}
}

// finishFromRecord publishes run_finished from a finished record when the
// run's events lack it (a crash came between the final record and
// run_finished): continuing the last attempt's seq, with the same
// Nats-Msg-Id as the one its worker would have used, so it is stored
// once. It reports whether the events lacked it; s is then settled (done
// once stored, retry if not).
func (r *run) finishFromRecord(ctx context.Context, rec *bus.RunRecord, s settlement) (bool, error) {
	envs, err := r.w.reads.Read(ctx, r.id, 0)
	if err != nil {
		return false, fmt.Errorf("reading the run's events: %w", err)
	}
	t := &bus.Transcript{}
	for _, e := range envs {
		_ = t.Apply(e)
	}
	if t.Done() {
		return false, nil
	}
	att := max(t.Attempt, 1)
	r.pub = eventpub.New(r.w.events, eventpub.Attempt{Run: r.id, Attempt: att, LastSeq: t.LastSeq}, nil)
	if t.Attempt == 0 {
		// No event at all (the record is written first): run_started
		// still comes first.
		started := r.runStarted()
		started.Attempt = att
		_, _ = r.pub.Fleet(bus.EventRunStarted, started)
	}
	fin := bus.RunFinished{Type: bus.EventRunFinished, Status: rec.State, Reason: rec.Reason, Error: rec.Error,
		Usage: rec.Usage, Cost: rec.Cost, Turns: rec.Turns, LastControlSeq: rec.LastControlSeq, TreeCost: rec.TreeCost}
	if fin.LastControlSeq == 0 {
		// A record of a worker before 1.6: the transcript's control
		// messages were taken (a lower bound; 0 would say none were).
		for _, s := range t.ControlSeqs() {
			fin.LastControlSeq = max(fin.LastControlSeq, s)
		}
	}
	if !rec.FinishedAt.IsZero() && !rec.StartedAt.IsZero() {
		fin.DurationMs = rec.FinishedAt.Sub(rec.StartedAt).Milliseconds()
	}
	if err := r.storeFinished(ctx, fin, s); err != nil {
		return true, err
	}
	r.log.Warn("finished run had no run_finished; published it from the record", "state", rec.State)
	return true, s.done(ctx)
}

// reusedID rejects a new request whose id belongs to a finished run. It
// gets run_started and run_finished (bad_request) on the run's subject,
// after the original's run_finished, so readers of the original (who stop
// at its run_finished) never see them; the record is not touched. The
// envelopes' Nats-Msg-Id carries the request's stream sequence so they are
// not mistaken for the original's events.
func (r *run) reusedID(rec *bus.RunRecord) {
	text := fmt.Sprintf("run id %q is already used by a finished run (%s); submit with a new id", r.id, rec.State)
	r.log.Warn("bad request: run id already used by a finished run; terminated", "state", rec.State)
	started := r.runStarted()
	_ = r.finish(ending{started: &started, msgIDHead: fmt.Sprintf("%s:req%d:", r.id, r.reqSeq),
		fin: r.badRequestFinished(text), settle: r.termRequest("bad_request: run id already used by a finished run")})
}

// badRequest fails a request that cannot run.
func (r *run) badRequest(err error) {
	reason := bus.ReasonBadRequest
	if r.refusal != "" {
		reason = r.refusal // transcript_too_large (continuation.go)
	}
	r.refuseAtPickup(reason, clipString(err.Error(), bus.MaxErrorBytes))
}

// refuseAtPickup fails a request before it runs, as failed/reason (a bad
// request, or a tenant without budget), and terminates it (not retried).
// The final record is written first, as the lease's compare-and-set (it
// must not overwrite a finished run or a newer attempt), then the events.
// It reports whether the refusal was stored.
func (r *run) refuseAtPickup(reason, text string) bool {
	r.log.Warn("request refused", "reason", reason, "err", text)
	r.dropInvalidFields()
	started := r.runStarted()
	if r.req != nil {
		started.Model = r.req.Model
		// A bad request's tool list can be huge: its first names tell.
		started.Tools = append([]string{}, r.req.Tools[:min(len(r.req.Tools), maxToolsShown)]...)
	}
	rec := r.record(bus.StatusFailed)
	rec.Reason, rec.Error, rec.FinishedAt = reason, text, time.Now()
	ctx, cancel := r.finishContext()
	defer cancel()
	switch o, cur, err := r.lease.Take(ctx, r.prev, rec); {
	case err != nil:
		// Without its record the run would look unknown: try again later.
		r.log.Warn("refused request: record not written; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return false
	case o != lease.Taken:
		r.refuse(o, cur)
		return false
	}
	fin := r.badRequestFinished(text)
	fin.Reason = reason
	_ = r.finish(ending{started: &started, fin: fin, settle: r.termRequest(reason + ": " + clipString(text, 200))})
	return true
}

// dropInvalidFields forgets the model and metadata of a bad request when
// they are what is wrong with it: copied into its record and run_started
// they could make the record too large to store (then the request would be
// retried until it gave up, never failing bad_request).
func (r *run) dropInvalidFields() {
	if r.req == nil {
		return
	}
	if r.req.Model != nil && (&bus.RunRequest{Prompt: "x", Model: r.req.Model}).Validate("") != nil {
		r.req.Model, r.modelRef = nil, bus.ModelRef{}
	}
	if (&bus.RunRequest{Prompt: "x", Metadata: r.req.Metadata}).Validate("") != nil {
		r.req.Metadata = nil
	}
}

// maxToolsShown bounds the tool names a bad request's run_started lists.
const maxToolsShown = 64

// badRequestFinished is the run_finished of a bad request.
func (r *run) badRequestFinished(text string) bus.RunFinished {
	return bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusFailed, Reason: bus.ReasonBadRequest,
		Error: text, DurationMs: time.Since(r.startedAt).Milliseconds()}
}

// conclude settles the attempt once the agent has stopped. It is its own
// frame so that execute's, on the stack while the run's tools run, stays
// small (see agent's loop.go).
//
//go:noinline
func (r *run) conclude(runErr error, finished bool, timeout time.Duration) {
	// Read when the agent stopped, not after the close below: a run that
	// ended just before its deadline did not time out.
	timedOut := r.clock.TimedOut()
	lastControl := r.ctl.close()
	if finished {
		r.ackResumedFinished()
		return
	}
	if r.mustNotFinish(timedOut) {
		return
	}
	fin := r.tally.Outcome(runErr, timedOut, timeout, r.runStart)
	// Error texts come from models, tools and submitters: bounded in the
	// event, the record and the log.
	fin.Error = clipString(fin.Error, bus.MaxErrorBytes)
	fin.LastControlSeq = lastControl
	final := r.record(fin.Status)
	final.Reason, final.Error, final.FinishedAt = fin.Reason, fin.Error, time.Now()
	final.LastControlSeq = lastControl
	if tc, ok := r.treeCost(final.Cost); ok { // worker/children.go
		final.TreeCost, fin.TreeCost = tc, tc
	}
	if r.finish(ending{record: final, fin: fin, settle: r.ackRequest()}) == nil {
		r.log.Info("run finished", "status", fin.Status, "reason", fin.Reason, "turns", fin.Turns,
			"tokens", fin.Usage.TotalTokens, "durationMs", fin.DurationMs)
	}
}

// finishGaveUp marks the run failed/gave_up under the lease, with its own
// attempt: run_started, run_resumed (the transcript so far, and the usage
// of calls cut off, as a resume's), then the finish, whose settlement
// removes the request (the caller then acks the advisory). request is the
// request's body.
func (r *run) finishGaveUp(ctx context.Context, prev *bus.RunRecord, request []byte, deliveries int, removeRequest func() error) error {
	if prev != nil && prev.Model != "" {
		if m, err := bus.ParseModelRef(prev.Model); err == nil {
			r.modelRef = m
		}
	}
	rec := r.record(bus.StateRunning)
	if prev != nil {
		rec.Model, rec.Metadata, rec.Turns, rec.Usage, rec.Cost = prev.Model, prev.Metadata, prev.Turns, prev.Usage, prev.Cost
		rec.WaitedMs, rec.Requeue = prev.WaitedMs, prev.Requeue
	}
	o, cur, err := r.lease.Take(ctx, prev, rec)
	if err != nil {
		return err
	}
	if o != lease.Taken {
		if o == lease.Finished {
			r.log.Info("give-up: run finished meanwhile", "state", cur.State)
		}
		return nil
	}
	r.pub = eventpub.New(r.w.events, eventpub.Attempt{Run: r.id, Attempt: r.attempt}, nil)
	_, _ = r.pub.Fleet(bus.EventRunStarted, r.runStarted())
	// Readers restore messagesRestored messages: an unreadable history is
	// an error to retry (the advisory is handled again), not an empty one.
	seq, err := r.pub.StartedAt(ctx)
	if err != nil {
		_ = r.pub.Flush(ctx)
		return fmt.Errorf("give-up: run_started not stored: %w", err)
	}
	envs, err := r.w.reads.Read(ctx, r.id, seq)
	if err != nil {
		_ = r.pub.Flush(ctx)
		return fmt.Errorf("give-up: reading the run's events: %w", err)
	}
	rc := workerproto.Recover(envs, time.Now().UnixMilli())
	resumed := bus.RunResumed{Type: bus.EventRunResumed, Attempt: r.attempt, MessagesRestored: len(rc.Messages)}
	cut, usage := r.gaveUpUsage(ctx, rc, request, restoredByReference(envs))
	if cut != (agent.Usage{}) {
		resumed.CutOffUsage = &cut
	}
	_, _ = r.pub.Fleet(bus.EventRunResumed, resumed)
	// The events say what the run was charged, unless the last attempt's
	// record says more (a call whose message it did not store).
	if usage.Cost.Total > rec.Usage.Cost.Total || (usage.Cost.Total == rec.Usage.Cost.Total && usage.TotalTokens > rec.Usage.TotalTokens) {
		rec.Usage, rec.Cost = usage, usage.Cost.Total
	}
	text := fmt.Sprintf("gave up after %d deliveries: every attempt ended without finishing (worker crashed, stalled or stopped); the request is on %s",
		deliveries, r.w.names.Dead(r.queue, r.id))
	rec.State, rec.Reason, rec.Error, rec.FinishedAt, rec.HeartbeatAt = bus.StatusFailed, bus.ReasonGaveUp, text, time.Now(), time.Now()
	fin := bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusFailed, Reason: bus.ReasonGaveUp, Error: text,
		Usage: rec.Usage, Cost: rec.Cost, Turns: rec.Turns, DurationMs: time.Since(r.runStart).Milliseconds()}
	return r.finish(ending{record: rec, fin: fin,
		settle: settlement{done: func(context.Context) error { return removeRequest() }}})
}
