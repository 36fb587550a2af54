package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
	"github.com/agentfleet/agentfleet/worker/internal/eventpub"
	"github.com/agentfleet/agentfleet/worker/internal/genai"
	"github.com/agentfleet/agentfleet/worker/internal/intake"
	"github.com/agentfleet/agentfleet/worker/internal/lease"
	"github.com/agentfleet/agentfleet/worker/internal/outcome"
	"github.com/agentfleet/agentfleet/worker/internal/runclock"
	"github.com/agentfleet/agentfleet/worker/internal/runtrace"
)

// A run request is picked up (its record read, the request decoded and
// planned), then goes through three steps, each in its own function:
//
//   - acquire: take the run's lease (its record), then start the
//     publisher, the control intake and the heartbeat, and publish
//     run_started. Nothing is published before the lease is taken.
//   - drive: resume what earlier attempts stored, read the control
//     messages stored so far, then Prompt or Continue the agent until it
//     is idle with nothing queued, the run is stopped (abort, limit,
//     failure) or its deadline passes.
//   - finish (endings.go): with its own deadline of one AckWait, counted
//     from when it starts and not cancelled by the run's stop, store every
//     event, write the final record, publish run_finished and settle the
//     request. A run of any length finishes on its attempt.
//
// Refused requests (bad, or a run id already used) and give-ups go
// through the same finish. An attempt that must not finish (its lease was
// lost, its events could not be stored, the worker is stopping) is handed
// back instead; every attempt that started tells the observer exactly once
// that it left: finished or handed back.

// run is one attempt at one run request.
type run struct {
	w          *Worker
	msg        intake.RequestAcks // nil for a give-up; only the reply subject (internal/intake)
	request    jetstream.Msg      // until pickup: its bytes
	pickupBeat *pickupBeat        // until the heartbeat starts
	id, queue  string
	lane       bus.Lane // where its request waited (since 1.10)
	// The run's concurrency key, its limit in force, and whether it holds
	// a place (keys.go).
	key         string
	keyLimit    int
	heldKey     bool
	attempt     int
	reqSeq      uint64
	submittedAt time.Time
	startedAt   time.Time // this attempt's pickup
	runStart    time.Time // the first attempt's start: timeout and duration count from it
	log         *slog.Logger
	prev        *bus.RunRecord // the record read at pickup

	runPlan // plan.go
	agent   *agent.Agent

	lease  *lease.Hold
	tally  outcome.Tally
	ctl    *controls
	pub    *eventpub.Publisher
	hb     *heartbeat
	cancel context.CancelFunc // stops the drive
	left   bool               // the observer was told the run finished

	waitingModel atomic.Bool // a model call queues for the shared rate limits
	// childrenStarted counts the run_agent calls of this attempt (and
	// those it resumed) against the tree's bound (worker/children.go).
	childrenStarted atomic.Int64
	// awaiting are the children this attempt's run_agent calls wait for
	// (worker/children.go, invariant 6).
	awaiting struct {
		sync.Mutex
		ids map[string]bool
	}
	// childKeys are the keys of every run_agent call of the run, earlier
	// attempts' included (from the events, takeChildCalls): its treeCost
	// reads their children, also those of calls a compaction took out of
	// the context (worker/children.go).
	childKeys struct {
		sync.Mutex
		keys map[string]bool
	}
	// strayCharge is the charge of the last model call whose consumer
	// stopped before its final event (the run's listener failed mid-call):
	// the error message the agent then ends the run with carries it
	// (observeStream, listener.onEvent).
	strayCharge atomic.Pointer[agent.Usage]

	gate gate // approval of tool calls (approval.go)

	slot  *slotHold       // nil for a give-up
	clock *runclock.Clock // the timeout, waits left out (waiting.go)
	wait  waitState
	// waitHandedBack: a wait ended because the worker is draining; the
	// run is handed back without publishing more.
	waitHandedBack atomic.Bool
	// parking: the park timer ended the run's waits (worker/park.go);
	// parkSignal ends when it fires (parkNow).
	parking    atomic.Bool
	parkSignal context.Context
	parkNow    context.CancelFunc
	// wokenFrom is the park this attempt's request woke (its parked.seq);
	// confirmed is the record its confirmation read, for the pickup.
	wokenFrom uint64
	// stateEnvs are the run's events from its wake's parked state
	// (parkstate.go), nil when it has none: the resume reads no events.
	stateEnvs [][]byte
	confirmed *bus.RunRecord
	// wakeStored is when the wake that woke this attempt from its park
	// was stored (zero: not a wake, or a redelivered one): the wake's
	// latency to run_started (Observer.WokenStarted).
	wakeStored time.Time
	// pickupPaused: the clock was paused at pickup for an earlier
	// attempt's wait (endPickupPause ends it).
	pickupPaused bool
	// carried is the earlier attempt's wait (its record's waiting, one
	// the index lists) while this attempt does not know yet whether it
	// goes on: the records written meanwhile (the take's, heartbeats')
	// keep it, so the run keeps its place in the waiting index (the time
	// its wait began) across the take. endPickupPause clears it.
	carried atomic.Pointer[bus.Waiting]
	earlier earlier          // what the record and earlier attempts left this one
	trace   runtrace.Attempt // spans (trace.go)
}

// runPlan is the request resolved against the worker.
type runPlan struct {
	req      *bus.RunRequest
	limits   bus.Limits
	modelRef bus.ModelRef
	model    agent.Model
	stream   agent.StreamFn // the provider's call, metered, or the faux script's (plan.go streamFn wraps it)
	// modelLimit is the model's shared rate limit, nil without
	// (ratelimit.go).
	modelLimit *ModelLimit
	tools      []*agent.Tool
	toolList   []string
	notice     string
	prompt     []agent.Message
	// prior is the transcript the run continues (continuation.go); nil
	// without continueFrom. loadHeld is the load budget it holds.
	prior    *priorTranscript
	loadHeld int64
	// refusal is the reason of a bad request other than bad_request.
	refusal  string
	fauxSkip func(turns int) // a faux script skips the turns a resume restored
	tenant   tenancy         // tenant.go
	// comp compacts the context of a long run (compaction.go); nil when
	// the model's window is unknown.
	comp     *compactor
	listener *listener
}

func (w *Worker) newRun(id, queue string, attempt int, reqSeq uint64, submittedAt time.Time) *run {
	r := &run{w: w, id: id, queue: queue, attempt: max(attempt, 1), reqSeq: reqSeq,
		submittedAt: submittedAt, startedAt: time.Now()}
	r.runStart = r.startedAt
	r.log = w.log.With("run", id, "queue", queue, "attempt", r.attempt)
	r.lease = lease.New(w.leases, id, r.attempt, reqSeq, r.leaseLost)
	r.ctl = newControls(r)
	r.parkSignal, r.parkNow = context.WithCancel(context.Background())
	return r
}

func (w *Worker) handle(m jetstream.Msg, slot *slotHold) {
	lane, runID, err := w.names.ParseRequest(m.Subject())
	queue := lane.Queue
	if err != nil {
		// No events: the subject cannot name a run safely.
		w.junk.Note(w.log, m.Subject(), err)
		_ = m.TermWithReason("invalid subject: " + clipString(err.Error(), 200))
		return
	}
	// Until the run's heartbeat starts, its pickup keeps the request owned
	// (heartbeat.go): its reads and lease take may outlast AckWait.
	acks := intake.SlimAcks(w.wire, m)
	beat := startPickupBeat(acks, w.cfg.HeartbeatInterval)
	attempt, reqSeq, submittedAt := 1, uint64(0), time.Time{}
	if md, err := m.Metadata(); err == nil {
		attempt, reqSeq, submittedAt = int(md.NumDelivered), md.Sequence.Stream, md.Timestamp
	}
	// A wake of a parked run (worker/park.go) goes on counting attempts
	// from the one that parked, if the run's record confirms it.
	woken, take := w.takeWake(m, acks, beat.stop, queue, runID, reqSeq)
	if !take {
		return
	}
	// A requeued request (giveup.go) goes on counting attempts from the
	// one it replaced, if the run's record confirms the requeue.
	requeue, err := w.confirmRequeue(m.Headers(), runID, reqSeq)
	if err != nil {
		w.log.Warn("cannot read the run record; handing the request back", "run", runID, "err", err)
		beat.stop()
		_ = acks.NakWithDelay(2 * time.Second)
		return
	}
	if requeue != nil {
		attempt += requeue.AttemptBase
	}
	if woken.OK {
		attempt += woken.Base
	}
	r := w.newRun(runID, queue, attempt, reqSeq, submittedAt)
	r.lane = lane
	if woken.OK {
		r.wokenFrom, r.lease.WokenFrom = woken.From, woken.From
		if p := woken.Rec.Parked; p != nil && p.Seq == woken.From {
			r.wakeStored = submittedAt
		}
		r.confirmed = woken.Rec
		if woken.State != "" {
			envs, err := decodeParkState(woken.State)
			if err != nil {
				r.log.Warn("cannot decode the wake's parked state; reading the run's events", "err", err)
			}
			r.stateEnvs = envs
		}
	}
	if requeue != nil {
		r.lease.RequeuedFrom, r.earlier.requeue = requeue.From, requeue
	}
	r.msg, r.request, r.pickupBeat = acks, m, beat
	r.slot = slot
	r.execute()
	r.releaseLoad()
	r.pickupBeat.stop() // the run did not start (acquire stops it otherwise)
}

// confirmRequeue returns the requeue marker a request with the requeue
// headers is the copy for, or nil. Anyone may set the headers: they count
// only when the run's record carries the give-up's marker for the request
// they name, bound to this request's stream sequence (the record is still
// that request's, or already this copy's); otherwise the request is a
// plain one (a reused id is then refused). A copy picked up before the
// give-up bound it waits for the binding (a record write) for a while.
func (w *Worker) confirmRequeue(h nats.Header, runID string, reqSeq uint64) (*bus.Requeue, error) {
	fromText := h.Get(bus.HeaderRequeuedFrom)
	if fromText == "" {
		return nil, nil
	}
	from, err := strconv.ParseUint(fromText, 10, 64)
	if err != nil || from == 0 {
		w.log.Warn("request with an invalid requeue header: a plain request", "run", runID)
		return nil, nil
	}
	rec, err := w.getRecord(w.hardCtx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		rec, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	if rec != nil && rec.Requeue != nil && rec.Requeue.From == from && rec.Requeue.Copy == 0 && rec.RequestSeq == from {
		if rec, err = w.awaitRequeueCopy(runID, from); err != nil {
			return nil, err
		}
	}
	if rec == nil || rec.Requeue == nil || rec.Requeue.From != from || rec.Requeue.Copy != reqSeq ||
		(rec.RequestSeq != from && rec.RequestSeq != reqSeq) {
		w.log.Warn("requeue headers the run's record does not confirm: a plain request", "run", runID, "requeuedFrom", from)
		return nil, nil
	}
	q := *rec.Requeue
	return &q, nil
}

// awaitRequeueCopy watches the run's record until the give-up binds the
// copy of request from (or the record moves on), for up to requeueBindWait.
func (w *Worker) awaitRequeueCopy(runID string, from uint64) (*bus.RunRecord, error) {
	ctx, cancel := context.WithTimeout(w.hardCtx, requeueBindWait)
	defer cancel()
	watch, err := w.kv.Watch(ctx, runID)
	if err != nil {
		return nil, fmt.Errorf("run record: %w", err)
	}
	defer func() { _ = watch.Stop() }()
	for {
		select {
		case e := <-watch.Updates():
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			rec, err := bus.DecodeRecord(e)
			if err != nil {
				return nil, err
			}
			if rec.Requeue == nil || rec.Requeue.From != from || rec.Requeue.Copy != 0 || rec.RequestSeq != from {
				return rec, nil
			}
		case <-ctx.Done():
			return nil, errors.New("run record: the requeued copy was not bound in time")
		}
	}
}

func (r *run) info() RunInfo {
	i := RunInfo{ID: r.id, Queue: r.queue, Attempt: r.attempt, Model: r.modelRef.String(),
		SubmittedAt: r.submittedAt, StartedAt: r.startedAt}
	if r.req != nil && r.req.Child != nil {
		i.Depth = r.req.Child.Depth
	}
	if !r.lane.Old() && r.lane.Tenant != bus.NoTenant {
		i.Tenant = r.lane.Tenant
	}
	if r.clock != nil {
		i.Deadline = r.clock.Deadline()
	} else if r.limits.TimeoutSeconds > 0 {
		i.Deadline = r.runStart.Add(time.Duration(r.limits.TimeoutSeconds) * time.Second)
	}
	return i
}

func (r *run) execute() {
	r.traceBegin()
	defer r.traceEnd()
	if !r.pickup() {
		return
	}
	if !r.takeKey() { // keys.go: parked, its key full
		return
	}
	// The run keeps its request's acknowledgements, not its bytes.
	r.request = nil
	// The timeout counts from the run's first start: a crash does not
	// extend a run's budget.
	// Time spent waiting (for an approval) is left out (waiting.go).
	timeout := time.Duration(r.limits.TimeoutSeconds) * time.Second
	ctx, cancelCause := context.WithCancelCause(r.w.hardCtx)
	cancel := func() { cancelCause(context.Canceled) }
	defer cancel()
	var pausedSince time.Time
	if w := r.prev; w != nil && w.Waiting != nil && bus.Indexed(w.Waiting.For) && w.Waiting.For != bus.WaitingKey {
		// (A key wait ended with takeKey.)
		r.carried.Store(w.Waiting)
	}
	if w := r.prev; w != nil && w.Waiting != nil && parkableWait(w.Waiting.For) && pausesClock(w.Waiting.For) {
		// The earlier attempt was waiting: its wait goes on until the
		// resume knows whether calls still wait (endPickupPause).
		pausedSince = w.Waiting.Since
		if pausedSince.IsZero() {
			pausedSince = time.Now()
		}
		r.pickupPaused = true
	}
	r.clock = runclock.New(r.runStart.Add(timeout), r.earlier.waited, pausedSince, func() { cancelCause(context.DeadlineExceeded) })
	defer r.clock.Stop()
	r.cancel = cancel
	ctx = context.WithValue(ctx, runKey{}, r)
	ctx = r.traceContext(ctx)

	if !r.acquire() {
		return
	}
	defer r.release()
	r.forgetParked() // worker/park.go
	runErr, finished := r.drive(ctx)
	r.conclude(runErr, finished, timeout)
}

// pickup reads the run's record and prepares the request. It reports
// whether the run may start; if not, the request is settled (refused, a
// bad request finished, or handed back on NATS trouble).
func (r *run) pickup() bool {
	w := r.w
	var rec *bus.RunRecord
	var err error
	switch {
	case r.confirmed != nil:
		// A wake's confirmation read it just now (worker/park.go): the
		// lease take's compare-and-set catches a write since.
		rec, r.confirmed = r.confirmed, nil
	case r.attempt == 1 && r.lease.RequeuedFrom == 0 && w.pickupReads.skip.Skip(r.queue):
		r.lease.Unread = true // worker/internal/lease: taken with Create
	default:
		rec, err = w.getRecord(w.hardCtx, r.id)
	}
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		r.log.Warn("cannot read the run record; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return false
	}
	if rec != nil {
		if o := r.lease.Classify(rec); o != lease.Taken {
			r.refuse(o, rec)
			return false
		}
		if !rec.StartedAt.IsZero() && rec.StartedAt.Before(r.runStart) {
			r.runStart = rec.StartedAt
		}
		r.earlier.waited = time.Duration(rec.WaitedMs) * time.Millisecond
		if wt := rec.Waiting; wt != nil && wt.For == bus.WaitingKey && rec.Parked != nil && !wt.Since.IsZero() {
			// A wait for the key is no part of the timeout (keys.go).
			r.earlier.waited += time.Since(wt.Since)
		}
		if rec.RequestSeq == r.reqSeq {
			r.earlier.waitingHandBacks = rec.WaitingHandBacks
		}
		if r.lease.RequeuedFrom != 0 && rec.RequestSeq == r.lease.RequeuedFrom && !rec.SubmittedAt.IsZero() {
			r.submittedAt = rec.SubmittedAt // the run's, not the requeue's
		}
		if r.wokenFrom != 0 && !rec.SubmittedAt.IsZero() {
			// The run's: answers stored before the wake are its own.
			r.submittedAt = rec.SubmittedAt
		}
	}
	r.prev = rec
	if r.attempt > 1 {
		r.log.Info("redelivered request: resuming the run")
	}
	switch err := r.prepare(w.hardCtx); {
	case bus.IsBadRequest(err):
		r.badRequest(err)
		return false
	case err != nil:
		// NATS trouble while planning (loading continueFrom's run): not the
		// request's fault, so try again later instead of failing it.
		r.log.Warn("cannot prepare the run; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return false
	}
	return r.admitTenant(w.hardCtx) // worker/tenant.go
}

// acquire takes the lease, then starts the publisher, the control intake
// and the heartbeat, and publishes run_started. It reports whether the
// attempt holds the run; if not, the request is settled.
func (r *run) acquire() bool {
	w := r.w
	ctx, cancel := r.finishContext()
	defer cancel()
	start := time.Now()
	o, cur, err := r.lease.Take(ctx, r.prev, r.record(bus.StateRunning))
	r.traceStep(runtrace.SpanLeaseTake, start, err)
	switch {
	case err != nil:
		r.log.Warn("cannot take the run's lease; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return false
	case o != lease.Taken:
		r.refuse(o, cur)
		return false
	}
	r.pub = eventpub.New(w.events, eventpub.Attempt{Run: r.id, Attempt: r.attempt}, r.publishFailed)
	if r.keepsState() {
		r.pub.KeepEnvelopes(parkStateKeep, r.stateEnvs) // parkstate.go
	}
	w.register(r)
	kept := r.pickupBeat.stop()
	r.pickupBeat = nil // a waiting run holds no more than it needs
	r.hb = r.startHeartbeat(kept)
	if r.notice != "" {
		r.log.Warn(r.notice)
	}
	_, _ = r.pub.Fleet(bus.EventRunStarted, r.runStarted())
	w.obs.RunStarted(r.info())
	if !r.wakeStored.IsZero() {
		w.obs.WokenStarted(r.info(), time.Since(r.wakeStored))
	}
	r.log.Debug("run started", "model", r.modelRef.String())
	return true
}

// release undoes acquire. An attempt that did not finish counts as handed
// back (a drain, a lost lease, a failed publish).
func (r *run) release() {
	r.ctl.close()
	r.logUnmatchedApprovals()
	r.endHeartbeat()
	r.w.unregister(r)
	if !r.left {
		r.w.obs.RunHandedBack(r.info())
	}
}

// drive runs the agent until the run may finish. finished reports that a
// resume found the run's run_finished already stored.
func (r *run) drive(ctx context.Context) (runErr error, finished bool) {
	restored := false
	if r.attempt > 1 {
		// A resume reads its controls too (pickupRead): both reads at once.
		r.ctl.prefetch(r.w.hardCtx)
		var err error
		// Resume even when the run was aborted or its deadline passed
		// meanwhile: the outcome then says so, instead of the attempt
		// being handed back (and redelivered until it gives up).
		restored, err = r.resume(r.w.hardCtx) // not the run's deadline; a drain timeout stops it
		r.traceResumed(restored, err)         // trace.go
		switch {
		case errors.Is(err, errAlreadyFinished):
			return nil, true
		case err == nil || r.lease.Lost():
		case r.w.hardCtx.Err() != nil && errors.Is(err, context.Canceled):
			r.publishFailed(fmt.Errorf("resume: %w: %w", errWorkerStopping, err))
		default:
			r.publishFailed(fmt.Errorf("resume: %w", err))
		}
	}
	// Before anything may stop the run: its snapshot at the end holds the
	// continued messages even when it never calls the model.
	r.restorePrior(restored) // continuation.go
	r.ctl.start(r.w.hardCtx, r.w.pickupRead(r))
	if r.tally.Stopping() {
		r.abortChildrenLeft() // worker/children.go
		return nil, false
	}
	if err := r.awaitBudget(ctx); err != nil || r.tally.Stopping() { // worker/tenant.go
		return nil, false
	}
	if restored && len(r.earlier.pendingCalls) > 0 {
		// Gated calls an earlier attempt left waiting wait again (their
		// answers may be in the stream already: the control owner has
		// read it).
		err := r.runPendingCalls(ctx)
		r.endPickupPause()
		if err != nil || r.tally.Stopping() || ctx.Err() != nil {
			return err, false
		}
	}
	r.endPickupPause()
	if restored && len(r.earlier.childCalls) > 0 {
		// run_agent calls an earlier attempt left without a result find
		// their children again (worker/children.go, invariant 2).
		if err := r.runChildCallsLeft(ctx); err != nil || r.tally.Stopping() || ctx.Err() != nil || r.waitHandedBack.Load() {
			return err, false
		}
	}
	switch {
	case !restored:
		runErr = r.agent.PromptMessages(ctx, r.prompt...)
	case workerproto.EndsWithAnswer(r.agent.Messages()):
		// The transcript has its final answer: no model call, unless
		// controls are queued (the loop below).
	default:
		runErr = r.agent.Continue(ctx)
	}
	// A steer or follow-up that came after the agent's last poll is still
	// delivered: go on while messages remain.
	for runErr == nil && ctx.Err() == nil && !r.tally.ModelFailed() && !r.idleAndDone(ctx) {
		runErr = r.agent.Continue(ctx)
	}
	return runErr, false
}

// idleAndDone is called when the agent went idle: it reports whether the
// run may finish (no late control message is queued).
func (r *run) idleAndDone(ctx context.Context) bool {
	return r.ctl.finishIfIdle(ctx)
}

// ackResumedFinished acks a request whose resume found run_finished
// stored: an earlier attempt finished it, only its ack was lost.
func (r *run) ackResumedFinished() {
	r.endHeartbeat()
	ctx, cancel := r.finishContext()
	defer cancel()
	_ = r.pub.Flush(ctx)
	r.log.Info("run already has its run_finished; acknowledging")
	_ = r.msg.Ack()
}

// mustNotFinish hands back an attempt that stopped without the right to
// finish, and reports whether it did.
func (r *run) mustNotFinish(timedOut bool) bool {
	pubErr := r.tally.PublishErr()
	if pubErr == nil {
		// Its onFail, which tells the tally, may not have run yet; a fence
		// is not a failure to store (a hand-back while waiting fences).
		if err := r.pub.Failure(); !errors.Is(err, eventpub.ErrFenced) {
			pubErr = err
		}
	}
	switch {
	case r.waitHandedBack.Load() && !r.lease.Lost() && !r.tally.Aborted() && !timedOut && r.parks():
		r.parkWaiting() // worker/park.go
	case r.waitHandedBack.Load() && !r.lease.Lost() && !r.tally.Aborted() && !timedOut:
		r.handBackWaiting()
	case r.lease.Lost():
		r.endHeartbeat()
		r.pub.Abandon()
		r.log.Warn("run stopped: lease lost to a newer attempt")
	case errors.Is(pubErr, errWorkerStopping):
		// Even an aborted or timed-out run: its end cannot be published.
		r.handBack(0, "worker stopping: run stopped and handed back", nil)
	case pubErr != nil:
		r.handBack(time.Second, "events could not be stored; handing the run back", pubErr)
	case r.w.hardCtx.Err() != nil && !r.tally.Aborted() && !timedOut:
		// The next attempt resumes from the events.
		r.handBack(0, "worker stopping: run stopped and handed back", nil)
	default:
		return false
	}
	return true
}

// abort stops the run at the user's request.
func (r *run) abort(reason string) {
	r.tally.Abort(reason)
	r.stop()
}

// overBudget stops a run that crossed one of its per-run bounds; it fails
// with reason.
func (r *run) overBudget(reason, text string) {
	if r.tally.OverBudget(reason, text) {
		r.log.Error("run over a per-run bound; failing it", "reason", reason, "err", text)
		r.stop()
	}
}

func (r *run) publishFailed(err error) {
	r.tally.PublishFailed(err)
	r.stop()
}

// leaseLost stops the run at once: another attempt owns it. Nothing more
// is published; the request is neither acked nor naked.
func (r *run) leaseLost() {
	r.log.Warn("lease lost: another attempt owns this run; stopping it without publishing more")
	if r.pub != nil {
		r.pub.Fence()
	}
	r.stop()
}

func (r *run) stop() {
	if r.cancel != nil {
		r.cancel()
	}
	if r.agent != nil {
		r.agent.Abort()
	}
}

func (r *run) endHeartbeat() {
	if r.hb != nil {
		r.hb.end()
	}
}

func (r *run) runStarted() bus.RunStarted {
	s := bus.RunStarted{Type: bus.EventRunStarted, Protocol: bus.ProtocolVersion, Queue: r.queue, Worker: r.w.id, Attempt: r.attempt,
		Tools: r.toolList, Notice: r.notice}
	if s.Tools == nil {
		s.Tools = []string{}
	}
	if !r.modelRef.IsZero() {
		m := r.modelRef
		s.Model = &m
	}
	if r.req != nil {
		s.ContinueFrom, s.Metadata, s.Child = r.req.ContinueFrom, r.req.Metadata, r.req.Child
	}
	if !r.submittedAt.IsZero() {
		s.SubmittedAt = r.submittedAt.UnixMilli()
	}
	s.Traceparent = r.traceparent()
	return s
}

// record is the run record now, in a state.
func (r *run) record(state string) *bus.RunRecord {
	turns, usage := r.tally.Counts()
	rec := &bus.RunRecord{ID: r.id, Queue: r.queue, State: state, Attempt: r.attempt, Worker: r.w.id,
		RequestSeq: r.reqSeq, SubmittedAt: r.submittedAt, StartedAt: r.runStart, HeartbeatAt: time.Now(),
		Turns: turns, Usage: usage, Cost: usage.Cost.Total}
	if !r.modelRef.IsZero() {
		rec.Model = r.modelRef.String()
	}
	if r.req != nil {
		rec.Metadata, rec.Title, rec.Tenant = r.req.Metadata, bus.RunTitle(r.req), r.req.Metadata[DefaultTenantKey]
		if rec.Tenant == "" && bus.ValidTenant(r.lane.Tenant) {
			rec.Tenant = r.lane.Tenant // the subject's (since 1.10), which Names.CheckTenant keeps equal
		}
		rec.Priority = r.lane.RecordPriority()
	}
	if r.req != nil {
		rec.Child = r.req.Child // worker/children.go
	}
	if r.w.ledger != nil { // budgets on: the tenant they charge (tenant.go)
		rec.Tenant = r.tenant.name
	}
	rec.WaitingHandBacks = r.earlier.waitingHandBacks
	rec.Requeue = r.earlier.requeue
	if r.clock != nil {
		waited, _ := r.clock.State()
		rec.WaitedMs = waited.Milliseconds()
	} else {
		rec.WaitedMs = r.earlier.waited.Milliseconds()
	}
	if state != bus.StateRunning {
		return rec
	}
	if what, since := r.waiting(); what != "" {
		rec.Waiting = &bus.Waiting{For: what, Since: since}
		if what == bus.WaitingApproval {
			rec.Waiting.Approvals = r.pendingApprovals()
		}
	} else if c := r.carried.Load(); c != nil {
		rec.Waiting = c
	} else if r.waitingModel.Load() {
		rec.Waiting = &bus.Waiting{For: bus.WaitingModel} // worker/ratelimit.go
	}
	return rec
}

func (w *Worker) getRecord(ctx context.Context, id string) (*bus.RunRecord, error) {
	e, err := w.records.read(ctx, id)
	if err != nil {
		return nil, err
	}
	return bus.DecodeRecord(e)
}

// recordReader reads runs' records.
type recordReader interface {
	read(ctx context.Context, id string) (jetstream.KeyValueEntry, error)
}

// kvRecords reads the records bucket Run opened, within 5 s.
type kvRecords struct{ w *Worker }

func (k kvRecords) read(ctx context.Context, id string) (jetstream.KeyValueEntry, error) {
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return k.w.kv.Get(gctx, id)
}

func clipString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return genai.ClipUTF8(s, n) + "…"
}

// earlier is what the run's record and its earlier attempts left this
// attempt.
type earlier struct {
	// requeue is the marker under which this request, a requeued copy,
	// took the run (giveup.go); its records keep it.
	requeue *bus.Requeue
	// waitingHandBacks is the record's count for this request.
	waitingHandBacks int
	// waited is the wait time earlier attempts recorded (waitedMs).
	waited time.Duration
	// pendingCalls are gated calls an earlier attempt left waiting.
	pendingCalls []workerproto.PendingCall
	// usedCallKeys are the call keys earlier attempts' events name, set
	// by resume before the agent runs (internal/callkey, invariant 1).
	usedCallKeys map[string]bool
	// childCalls are run_agent calls an earlier attempt left without a
	// result: they wait for their children again (worker/children.go).
	childCalls []agent.Content
}
