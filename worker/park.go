package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/intake"
	"github.com/agentfleet/agentfleet/worker/internal/lease"
	"github.com/agentfleet/agentfleet/worker/internal/park"
)

// Parking (protocol 1.9; the steps' invariants: worker/internal/park).
//
// A run parks when it has waited Config.ParkAfter off its slot with only
// approvals (waiting.go: every wait of it an approval's, none of its tool
// calls running, no model call: a run off its slot has none). Then:
//
//   - the park timer (armed when the run leaves its slot, disarmed when
//     it takes one again or starts another kind of wait) ends the run's
//     waits as a drain does (errWaitHandedBack): the calls stay pending
//     in its events and its record, their answers unapplied;
//   - handBackWhileWaiting waits for the calls that run, including one
//     whose wait took its answer as the park fired (it runs on:
//     waitInCall counts it running in the critical section that ends its
//     wait, and the run is idle only with no approval wait left), then
//     publishes run_parked, stores every event
//     (flush) and fences the publisher; execute then calls parkWaiting
//     instead of handBackWaiting:
//   - the heartbeat ends, the control owner stops (what it took is
//     known: ctl.last), the request's copy is kept (park.Keep), the
//     timer of its first approval's expiry is stored (park.Arm), the
//     record gets parked with the lease's compare-and-set (lost: a newer
//     attempt owns the run, nothing more is done);
//   - an answer the wake consumer saw before the record said parked is
//     not lost: once the record says parked, the attempt looks for an
//     approve or abort stored after those its control owner took, or one
//     it took that no call applied (the park cut its wait), and wakes the
//     run itself if there is one;
//   - only then is the request acknowledged (DoubleAck: a lost ack
//     redelivers it, and the redelivery resumes the run). Look and wake
//     before the ack: a crash anywhere before it redelivers the request,
//     which resumes the run, so an answer that came while parking is
//     never left to the timer (a wake published too races the
//     redelivery for the lease: one of them runs, the other is dropped);
//   - the run's goroutine returns: its slot, place, agent and control
//     state go as any ended attempt's.
//
// A failure before the record write hands the run back as a drain does
// (Nak, counted as a waiting hand-back): the run is not parked and its
// next delivery resumes it.

// openParking opens AGENTS_PARKED; without it (EnsureStreams skipped on an
// older fleet) runs never park.
func (w *Worker) openParking(setup context.Context) {
	if w.cfg.ParkAfter < 0 {
		return
	}
	s, err := w.js.Stream(setup, w.names.ParkedStream())
	if err != nil {
		w.log.Warn("parking off: no parked-requests stream (create the streams with EnsureStreams)", "err", err)
		return
	}
	w.parking = w.parkEnv(s)
	w.parking.KeepFor = s.CachedInfo().Config.MaxAge
}

// parkEnv is what parking and waking use of the worker, with AGENTS_PARKED s.
func (w *Worker) parkEnv(s jetstream.Stream) *park.Env {
	return &park.Env{JS: w.js, Names: w.names, Runs: w.runsStream, Parked: s, Read: w.getRecord, Log: w.log,
		Woke: w.obs.WakePublished}
}

// startWake pulls the wake consumer (worker/internal/park). Every worker
// does, parking or not: a parked run is woken by any of them.
func (w *Worker) startWake(setup context.Context) (func(), error) {
	env := w.parking
	if env == nil {
		s, err := w.js.Stream(setup, w.names.ParkedStream())
		if err != nil {
			return func() {}, nil
		}
		env = w.parkEnv(s)
	}
	cons, err := w.js.Consumer(setup, w.names.ControlStream(), w.names.WakeConsumer())
	if err != nil {
		w.log.Warn("waking parked runs off: no wake consumer (create the streams with EnsureStreams)", "err", err)
		return func() {}, nil
	}
	stop, err := env.Start(w.hardCtx, cons)
	if err != nil {
		w.log.Warn("waking parked runs off", "err", err)
		return func() {}, nil
	}
	tcons, err := w.js.Consumer(setup, w.names.ParkedStream(), w.names.TimersConsumer())
	if err != nil {
		w.log.Warn("parked runs' timers off: no timers consumer (create the streams with EnsureStreams)", "err", err)
		return stop, nil
	}
	stopTimers, err := env.StartTimers(w.hardCtx, tcons)
	if err != nil {
		w.log.Warn("parked runs' timers off", "err", err)
		return stop, nil
	}
	return func() { stopTimers(); stop() }, nil
}

// armParkLocked starts the park timer of a run that just left its slot.
// ws.mu is held.
func (r *run) armParkLocked() {
	ws := &r.wait
	if r.w.parking == nil || r.w.cfg.ParkAfter <= 0 || ws.other > 0 || ws.parkArmed || r.parking.Load() {
		return
	}
	ws.parkArmed = true
	ws.parkGen++
	gen := ws.parkGen
	ws.parkTimer = time.AfterFunc(r.w.cfg.ParkAfter, func() { r.parkFired(gen) })
}

// disarmParkLocked stops the park timer. ws.mu is held.
func (r *run) disarmParkLocked() {
	ws := &r.wait
	if !ws.parkArmed {
		return
	}
	ws.parkArmed = false
	ws.parkGen++ // a timer that fires now finds another generation
	ws.parkTimer.Stop()
	ws.parkTimer = nil
}

// parkFired parks the run if it still waits as when the timer was armed,
// and AGENTS_PARKED keeps its copy until its timer fires (park.Env.Keeps;
// else it keeps waiting off its slot).
func (r *run) parkFired(gen uint64) {
	due := r.parkDue() // gate.calls.mu, not under ws.mu
	keeps := r.w.parking.Keeps(time.Now(), due)
	ws := &r.wait
	ws.mu.Lock()
	ok := ws.parkArmed && ws.parkGen == gen && ws.offSlot && ws.n > 0 && ws.busy == 0 && ws.other == 0
	declined := ok && !keeps
	if ok {
		ws.parkArmed, ws.parkTimer = false, nil
		ok = keeps
		r.parking.Store(ok)
	}
	ws.mu.Unlock()
	if declined {
		r.log.Info("run does not park: its approval expires after the parked-requests stream's max age; it waits off its slot",
			"expiresAt", due, "keepFor", r.w.parking.KeepFor)
	}
	if ok {
		r.log.Info("run parks: it waited off its slot for approvals", "parkAfter", r.w.cfg.ParkAfter)
		r.parkNow()
	}
}

// parks reports whether a run whose waits ended is parked rather than
// handed back: the park timer fired, and it waits for approvals only (a
// timer that fired as the run's last answer came leaves parking set;
// a later wait for something else is handed back, not parked).
func (r *run) parks() bool {
	if !r.parking.Load() {
		return false
	}
	what, _ := r.waiting()
	ws := &r.wait
	ws.mu.Lock()
	other := ws.other
	ws.mu.Unlock()
	return parkableWait(what) && other == 0
}

// parkableWait reports whether a wait may park its run: an approval's,
// or a run_agent call's for its child (worker/children.go, invariant 6).
func parkableWait(what string) bool {
	return what == bus.WaitingApproval || what == bus.WaitingChildren
}

// announcePark publishes run_parked (handBackWhileWaiting, before the
// flush): before the park is certain, since the events are stored before
// the record may say parked. A park that fails later leaves it in the
// events (docs/protocol.md §4: parked is what the record says).
func (r *run) announcePark() {
	p := bus.RunParked{Type: bus.EventRunParked, Attempt: r.attempt}
	if what, since := r.waiting(); what != "" {
		p.Waiting = &bus.Waiting{For: what, Since: since, Approvals: r.pendingApprovals()}
	}
	_, _ = r.pub.Fleet(bus.EventRunParked, p)
}

// firstExpiry is the earliest expiry of the run's pending approvals
// (zero: none asked), when its park timer would fire.
func (r *run) firstExpiry() time.Time {
	var due time.Time
	for _, a := range r.pendingApprovals() {
		if t := time.UnixMilli(a.ExpiresAt); due.IsZero() || t.Before(due) {
			due = t
		}
	}
	return due
}

// parkDue is when a parked run's timer must wake it: its first
// approval's expiry, or, for a run waiting for children, its deadline if
// that comes first (a wait for children counts against the timeout,
// waiting.go: the woken attempt times out and aborts its children, so a
// child that never finishes, or never gets a record, cannot keep its
// parent parked). Zero: no timer (a run that waits for approvals too has
// its clock paused: their expiry wakes it, and its next park arms again).
func (r *run) parkDue() time.Time {
	due := r.firstExpiry()
	if r.clock == nil || !r.awaitsChildren() {
		return due
	}
	if d := r.clock.Deadline(); !d.IsZero() && (due.IsZero() || d.Before(due)) {
		due = d
	}
	return due
}

// answersQueued reports whether a pending call holds an answer it did not
// apply (the park ended its wait first).
func (r *run) answersQueued() bool {
	ap := &r.gate.calls
	ap.mu.Lock()
	defer ap.mu.Unlock()
	for _, c := range ap.pending {
		if len(c.answers) > 0 {
			return true
		}
	}
	return false
}

// parkWaiting parks a run whose waits the park timer ended (see the top).
func (r *run) parkWaiting() {
	r.endHeartbeat()
	r.pub.Abandon()
	r.ctl.close()
	approveAfter, abortAfter := r.ctl.last.get(bus.KindApprove), r.ctl.last.get(bus.KindAbort)
	queued := r.answersQueued()
	ctx, cancel := r.finishContext()
	defer cancel()
	env := r.w.parking
	req, err := r.w.runsStream.GetMsg(ctx, r.reqSeq)
	var seq uint64
	var digest, state string
	if err == nil {
		state = r.parkState(len(req.Data)) // parkstate.go
		seq, digest, err = env.KeepState(ctx, r.queue, r.id, r.attempt, req, state)
	}
	rec := r.record(bus.StateRunning)
	if due := r.parkDue(); err == nil && !due.IsZero() {
		err = env.Arm(ctx, r.id, r.attempt, due) // the time parkFired checked
	}
	if err != nil {
		r.log.Warn("cannot park the run; handing it back", "err", err)
		r.handBackWaiting()
		return
	}
	rec.Parked = &bus.Parked{At: time.Now(), Seq: seq, Attempt: r.attempt, Digest: digest}
	if state != "" {
		rec.Parked.State = bus.StateDigest(state)
	}
	if err := r.lease.WriteFinal(ctx, rec); err != nil {
		if errors.Is(err, lease.ErrLost) {
			r.log.Warn("run stopped: lease lost to a newer attempt")
			return
		}
		r.log.Warn("cannot write the parked record; handing the run back", "err", err)
		_ = r.msg.NakWithDelay(r.w.cfg.PollWait + time.Second)
		return
	}
	if rec.Waiting != nil {
		r.w.obs.RunParked(r.info(), rec.Waiting.For)
	}
	// The heartbeat ended before Keep: the request's AckWait starts again
	// here, so the look and the wake below do not let it come again.
	_ = r.msg.InProgress()
	// A parked run holds no key place (keys.go, invariant 4): the line
	// moves now, and the woken run takes a place again.
	r.releaseKey(ctx)
	// The look for answers and the wake come before the ack: until the
	// ack, a crash redelivers the request, which resumes the run (and a
	// wake published meanwhile loses the lease race to it or wins it);
	// after the ack, nothing would look again until the timer.
	wake := queued
	if !wake {
		if wake, err = env.AnswerAfter(ctx, r.w.controlStream, r.id, approveAfter, abortAfter); err != nil {
			r.log.Warn("cannot look for answers that came while parking; waking the run", "err", err)
			wake = true
		}
	}
	if !wake {
		// A child that finished before the record said parked found its
		// parent not parked (worker/children.go, invariant 6).
		wake = r.childFinished(ctx)
	}
	if wake {
		if err := env.WakeBy(ctx, rec, park.ByParking, time.Time{}); err != nil {
			// Not acknowledged: the request comes again and resumes the
			// run, which takes the answer.
			r.log.Warn("cannot wake the run for an answer that came while it parked; handing its request back", "err", err)
			_ = r.msg.NakWithDelay(r.w.cfg.PollWait + time.Second)
			return
		}
	}
	if err := r.msg.DoubleAck(ctx); err != nil {
		// The record says parked; the request comes again after AckWait
		// and its attempt resumes the run (or a wake takes it first).
		r.log.Warn("parked run's request not acknowledged; it comes again", "err", err)
	}
	r.log.Info("run parked", "parkedSeq", seq, "woken", wake)
	r.w.trim.Left()
}

// startTrim runs the memory trim (internal/memtrim): after a burst of
// parks, the parked runs' memory goes back to the system at once.
func (w *Worker) startTrim() func() {
	ctx, cancel := context.WithCancel(w.hardCtx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.trim.Run(ctx)
	}()
	return func() { cancel(); <-done }
}

// takeWake is the pickup's look at a request's wake header: take is false
// when the request was settled (a wake the record does not confirm is
// dropped; a failed read hands it back), after stopBeat.
func (w *Worker) takeWake(m jetstream.Msg, acks intake.RequestAcks, stopBeat func() time.Time, queue, runID string, reqSeq uint64) (park.Confirmation, bool) {
	woken, err := w.confirmWake(m, queue, runID, reqSeq)
	switch {
	case err != nil:
		w.log.Warn("cannot confirm a wake; handing the request back", "run", runID, "err", err)
		stopBeat()
		_ = acks.NakWithDelay(2 * time.Second)
		return woken, false
	case woken.Wake && !woken.OK:
		w.log.Info("wake the run's record does not confirm (a duplicate, or not a worker's): dropped", "run", runID, "requestSeq", reqSeq)
		stopBeat()
		_ = acks.Ack()
		return woken, false
	}
	return woken, true
}

// confirmWake checks a request's wake header at pickup (park.Confirm):
// drop: a wake the record does not confirm (acknowledged, no event).
func (w *Worker) confirmWake(m jetstream.Msg, queue, runID string, reqSeq uint64) (c park.Confirmation, err error) {
	if m.Headers().Get(bus.HeaderWokenFrom) == "" {
		return c, nil
	}
	env := w.parking
	if env == nil {
		// A worker that does not park still runs the wakes of others.
		s, err := w.js.Stream(w.hardCtx, w.names.ParkedStream())
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			// No run was parked on this fleet: nothing to confirm.
			return park.Confirmation{Wake: true}, nil
		}
		if err != nil {
			return c, err
		}
		env = w.parkEnv(s)
	}
	return env.Confirm(w.hardCtx, queue, runID, reqSeq, m.Headers(), m.Data())
}

// forgetParked removes a woken park's request copy once the woken attempt
// holds the lease (best effort), beside the run: the run waits for
// nothing of it. The worker's drain waits for it as for a run (w.wg).
func (r *run) forgetParked() {
	if r.wokenFrom == 0 || r.w.parking == nil {
		return
	}
	w, seq := r.w, r.wokenFrom
	w.wg.Go(func() {
		ctx, cancel := context.WithTimeout(w.hardCtx, 5*time.Second)
		defer cancel()
		w.parking.Forget(ctx, seq)
	})
}
