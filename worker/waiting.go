package worker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// errWaitHandedBack ends a wait when the worker starts draining: the run
// is handed back (handBackWaiting) instead of holding the drain.
var errWaitHandedBack = errors.New("the worker is stopping: the waiting run is handed back")

// Waiting without a slot.
//
// A run that waits for something outside the worker (a person's approval,
// a budget's next period) need not hold one of the worker's concurrency
// slots: (*run).waitOffSlot gives the run's slot back while it waits, so a
// worker with a few slots can keep thousands of runs waiting, and takes a
// slot again when the wait ends (blocking on the slot channels: no busy
// waiting). While a run waits:
//
//   - its request stays unacknowledged: the heartbeat goes on sending
//     InProgress and renewing the lease, so the record stays the lease
//     and the readers' rules hold unchanged (it counts against the queue
//     consumer's MaxAckPending: docs/operations.md sizes it);
//   - the run's timeout clock is paused (internal/runclock) while one of
//     its waits is not a wait for children (pausesClock): waiting for a
//     person or a budget does not count against limits.timeoutSeconds,
//     and the time waited is written to the record (waitedMs) so a later
//     attempt keeps it out as well; a wait for child runs counts (the
//     parent's timeout bounds its tree, worker/children.go);
//   - the record says what it waits for (waiting: {for, since, ...}),
//     written by the heartbeat, which is woken at once when a wait starts
//     or ends;
//   - a run off its slot holds one of the worker's Config.MaxWaiting
//     places, from when it first needs one until none of its waits (and
//     no gated call about to ask: claimWaitPlace) is left. Past them a
//     new gated call is refused before it asks (approval.go), and any
//     other wait (a resumed gated call's, a budget's) keeps the run's slot
//     (still paused and shown as waiting) until a place frees.
//
// Places freed (invariants):
//
//   - a run that would leave its slot but finds every place taken queues
//     for one (Worker.placeQueue, FIFO; in it at most once), in the same
//     critical section of Worker.waitMu as the failed take: no place
//     frees unseen between them;
//   - a freed place goes to the queue's first run, else back to the pool:
//     while the queue is not empty every place is taken, so a new call
//     cannot take a place ahead of a queued run;
//   - the giver hands it over (takeHandedPlace) after releasing its own
//     wait.mu: a run's wait.mu is never held while taking another's (lock
//     order: one run's wait.mu, then Worker.waitMu). The receiver takes
//     it and leaves its slot if it still waits with none of its calls
//     running, else passes it on; it queues again when it next would
//     leave its slot;
//   - a run leaves the queue when its last wait ends.
//
// Waits of one run nest: parallel calls of a batch may wait together. The
// run leaves its slot once a wait started and none of its tool calls runs
// (toolBusy: the listener counts calls from tool_execution_start to
// tool_execution_end; a wait inside a tool call brackets itself with
// toolBusy(-1) / toolBusy(+1), inside the wait's own start and end with
// waitInCall (approvals), a wait outside one needs nothing), and
// takes one again as soon as a wait ends (the call runs on), even while
// others still wait. A wait whose context ends (abort, timeout, lost
// lease) returns without a slot; the run then finishes without one
// (finishing needs no slot). When the worker starts draining, waits end
// with errWaitHandedBack: the caller then calls handBackWhileWaiting and
// returns; the record keeps the wait (the next attempt takes it over) and
// execute hands the run back (handBackWaiting) without using up a
// delivery (giveup.go requeues).
//
// Use (tenant budgets, approvals):
//
//	err := r.waitOffSlot(ctx, "budget", time.Now(), func(ctx context.Context) error {
//		select { case <-rollover: return nil; case <-ctx.Done(): return ctx.Err() }
//	})
//	if errors.Is(err, errWaitHandedBack) { r.handBackWhileWaiting(); return err }

// slotHold is the concurrency slot (shared, plus its queue's own) a run
// was started with. The run releases it once its run_finished is stored
// (endings.go), else the pull loop's goroutine when the run returns, unless
// the run gave it up and did not take it back.
type slotHold struct {
	w     *Worker
	queue string
	mu    sync.Mutex
	held  bool
}

func (w *Worker) newSlotHold(queue string) *slotHold {
	return &slotHold{w: w, queue: queue, held: true}
}

// release gives the slot back if it is held: a run's slot is given back
// twice (once its run_finished is stored, again when its goroutine
// returns), and back once.
func (h *slotHold) release() {
	if h == nil {
		return
	}
	h.mu.Lock()
	held := h.held
	h.held = false
	h.mu.Unlock()
	if held {
		h.w.releaseSlots(h.queue, 1)
	}
}

// take blocks until a slot is free (the queue's own first, as the pull
// loop takes them) or ctx ends; it reports whether it holds one.
func (h *slotHold) take(ctx context.Context) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held {
		return true
	}
	if ctx.Err() != nil {
		return false // a stopped run finishes without a slot (a select may pick a free one)
	}
	w := h.w
	qs := w.queueSlots[h.queue]
	if qs != nil {
		select {
		case qs <- struct{}{}:
		case <-ctx.Done():
			return false
		}
	}
	select {
	case w.slots <- struct{}{}:
	case <-ctx.Done():
		if qs != nil {
			<-qs
		}
		return false
	}
	h.held = true
	w.obs.Slots(len(w.slots), w.cfg.Concurrency)
	return true
}

// waitPlaces are the worker's waiting runs (guarded by mu): waiting of
// them wait now, offSlot of them without a slot; held places (at most
// MaxWaiting) are held by the runs off their slots and those about to
// be; queue are the runs waiting on their slots for a place, first come
// first.
type waitPlaces struct {
	mu      sync.Mutex
	waiting int
	offSlot int
	held    int
	queue   []*run
}

// waitState is a run's waits now (guarded by its own mutex; see
// waitOffSlot).
type waitState struct {
	mu      sync.Mutex // held across a wait's start and end, not the wait
	n       int        // waits in progress
	busy    int        // tool calls that run, not wait (toolBusy)
	offSlot bool       // the run gave its slot up
	// place: the run holds one of the worker's MaxWaiting places; claims
	// counts its gated calls that need it (claimWaitPlace).
	place  bool
	claims int
	idle   chan struct{} // closed when busy drops to 0 (awaitToolsIdle)
	// handBack is the hand-back of a run whose wait the drain ended.
	handBack sync.Once
	// now is what the record shows (nil: not waiting); read by the
	// heartbeat without mu, which a wait's end holds while it takes a slot.
	now atomic.Pointer[waitInfo]
	// other counts the waits in progress that are not approvals' (a
	// budget's): a run with one never parks (worker/park.go).
	other int
	// pausing counts the waits in progress that pause the run's clock
	// (pausesClock): it is paused while pausing > 0.
	pausing int
	// The park timer, armed while the run is off its slot (park.go);
	// parkGen tells a timer that fires late from the one armed now.
	parkArmed bool
	parkGen   uint64
	parkTimer *time.Timer
}

type waitInfo struct {
	what  string // the record's waiting.for
	since time.Time
}

// waitOffSlot runs wait with the run's slot given up (up to MaxWaiting
// runs per worker) and its timeout clock paused from since (time.Now()
// for a new wait; the original start for a wait a resumed attempt takes
// over). what is the record's waiting.for ("approval", ...). wait gets a
// context that also ends when the worker starts draining; waitOffSlot
// then returns errWaitHandedBack. After wait returns, the run takes a slot
// again (blocking until one is free) unless ctx ended.
func (r *run) waitOffSlot(ctx context.Context, what string, since time.Time, wait func(ctx context.Context) error) error {
	return r.waitOff(ctx, what, since, false, wait)
}

// waitInCall is waitOffSlot for a wait inside a running tool call (an
// approval's): it is the call's toolBusy(-1) / toolBusy(+1) bracket, the
// +1 in the same critical section of wait.mu as the wait's end, so a
// hand-back never finds the run idle between a wait that took its answer
// and its call running on (awaitToolsIdle). A wait handed back is not
// counted again: the caller calls toolBusy(1) after handBackWhileWaiting.
func (r *run) waitInCall(ctx context.Context, what string, since time.Time, wait func(ctx context.Context) error) error {
	return r.waitOff(ctx, what, since, true, wait)
}

func (r *run) waitOff(ctx context.Context, what string, since time.Time, inCall bool, wait func(ctx context.Context) error) error {
	r.enterWait(what, since, inCall)
	wctx, cancel := context.WithCancel(ctx)
	stopDrain := context.AfterFunc(r.w.drainCtx(), cancel)
	// A park ends an approval's wait as a drain does (worker/park.go);
	// other waits never park. A wait that got its answer as the park
	// fired returns nil and is not parked: an answer the wait took is
	// applied, so none is taken and lost.
	parkSignal := r.parkSignal
	if parkSignal == nil || !parkableWait(what) {
		parkSignal = context.Background() // a run not from newRun (tests)
	}
	stopPark := context.AfterFunc(parkSignal, cancel)
	wctx, endSpan := r.traceWait(wctx, what, since) // trace.go
	err := wait(wctx)
	parked := !stopPark() && err != nil
	drained := (!stopDrain() || parked) && ctx.Err() == nil
	cancel()
	endSpan(err, drained)
	r.leaveWait(ctx, what, drained, inCall)
	if drained {
		return errWaitHandedBack
	}
	return err
}

func (r *run) enterWait(what string, since time.Time, inCall bool) {
	ws := &r.wait
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if inCall {
		ws.busy = max(ws.busy-1, 0) // the call waits, not runs
	}
	ws.n++
	if !parkableWait(what) {
		ws.other++
		r.disarmParkLocked()
	}
	if pausesClock(what) {
		if ws.pausing++; ws.pausing == 1 && r.clock != nil {
			r.clock.Pause(since)
		}
	}
	if ws.n > 1 {
		r.leaveSlotLocked()
		return
	}
	ws.now.Store(&waitInfo{what: what, since: since})
	w := r.w
	w.places.mu.Lock()
	w.places.waiting++
	n := w.places.waiting
	w.places.mu.Unlock()
	w.obs.RunsWaiting(r.info(), n)
	r.leaveSlotLocked()
	r.hb.now()
}

// leaveSlotLocked gives the run's slot up when it waits and none of its
// tool calls runs (ungated calls of the batch keep it until they end),
// with a MaxWaiting place. ws.mu is held.
func (r *run) leaveSlotLocked() {
	ws := &r.wait
	if ws.n == 0 || ws.busy > 0 || ws.offSlot || r.slot == nil {
		return
	}
	if !ws.place && !r.takePlaceLocked(true) {
		return // queued: takeHandedPlace leaves the slot once a place frees
	}
	w := r.w
	w.places.mu.Lock()
	w.places.offSlot++
	w.places.mu.Unlock()
	ws.offSlot = true
	r.slot.release()
	r.armParkLocked() // park.go
}

// takePlaceLocked takes one of the worker's MaxWaiting places for the
// run; without one free, queue queues the run for the next one freed
// (with MaxWaiting above 0). ws.mu is held.
func (r *run) takePlaceLocked(queue bool) bool {
	w := r.w
	w.places.mu.Lock()
	ok := w.places.held < w.cfg.MaxWaiting
	if ok {
		w.places.held++
	} else if queue && w.cfg.MaxWaiting > 0 && !slices.Contains(w.places.queue, r) {
		w.places.queue = append(w.places.queue, r)
	}
	w.places.mu.Unlock()
	r.wait.place = ok
	return ok
}

// dropPlaceLocked gives the run's place back once nothing needs it: no
// wait, no claim, not off its slot. ws.mu is held. It returns the queued
// run the place goes to (freePlace): the caller hands it over with
// handPlace once ws.mu is released.
func (r *run) dropPlaceLocked() *run {
	ws := &r.wait
	if !ws.place || ws.n > 0 || ws.claims > 0 || ws.offSlot {
		return nil
	}
	ws.place = false
	return r.w.freePlace()
}

// freePlace gives a place back: to the first queued run (returned, to be
// handed it with handPlace), else to the pool.
func (w *Worker) freePlace() *run {
	w.places.mu.Lock()
	defer w.places.mu.Unlock()
	if len(w.places.queue) > 0 {
		next := w.places.queue[0]
		w.places.queue = slices.Delete(w.places.queue, 0, 1)
		return next
	}
	w.places.held--
	return nil
}

// handPlace hands a freed place to the queued run next (nil: none), and
// on while runs pass it on. No run's wait.mu is held.
func handPlace(next *run) {
	for next != nil {
		next = next.takeHandedPlace()
	}
}

// takeHandedPlace is a queued run's, handed a place: it takes it and
// leaves its slot if it still waits with none of its calls running;
// otherwise it passes the place on (returning the next run, as
// dropPlaceLocked).
func (r *run) takeHandedPlace() *run {
	ws := &r.wait
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.place || ws.n == 0 || ws.busy > 0 || ws.offSlot || r.slot == nil {
		return r.w.freePlace()
	}
	ws.place = true
	r.leaveSlotLocked()
	return nil
}

// leavePlaceQueueLocked takes the run out of the queue for a place (its
// last wait ended). ws.mu is held.
func (r *run) leavePlaceQueueLocked() {
	w := r.w
	w.places.mu.Lock()
	defer w.places.mu.Unlock()
	if i := slices.Index(w.places.queue, r); i >= 0 {
		w.places.queue = slices.Delete(w.places.queue, i, i+1)
	}
}

// claimWaitPlace is a gated call's, before it asks: it makes sure the run
// holds a MaxWaiting place (taking one if free) and keeps it until
// unclaimWaitPlace, so the call's wait can leave the slot. It reports
// false, holding nothing, when every place is taken, unless the call was
// asked by an earlier attempt (resumed: its answer may be stored, so it
// waits, on its slot until a place frees: see "Places freed"). With a
// negative MaxWaiting (waits keep their slots) it always succeeds.
func (r *run) claimWaitPlace(resumed bool) bool {
	ws := &r.wait
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if r.w.cfg.MaxWaiting >= 0 && !ws.place && !r.takePlaceLocked(false) && !resumed {
		return false
	}
	ws.claims++
	return true
}

func (r *run) unclaimWaitPlace() {
	ws := &r.wait
	ws.mu.Lock()
	ws.claims--
	next := r.dropPlaceLocked()
	ws.mu.Unlock()
	handPlace(next)
}

// toolBusy counts the run's tool calls that run (not wait): +1 at a
// call's tool_execution_start and when its wait ends, -1 when it starts
// waiting and at its tool_execution_end. A wait that is not a tool call's
// (none runs meanwhile) need not call it.
func (r *run) toolBusy(d int) {
	ws := &r.wait
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.busy = max(ws.busy+d, 0)
	r.signalIdleLocked()
	if d < 0 {
		r.leaveSlotLocked()
	}
}

// signalIdleLocked wakes awaitToolsIdle once the run is idle: none of
// its tool calls runs and none of its approval waits is still in progress
// (one the park or drain ended may yet return with its answer, and its
// call then runs: see waitInCall). ws.mu is held.
func (r *run) signalIdleLocked() {
	ws := &r.wait
	if ws.busy == 0 && ws.n == ws.other && ws.idle != nil {
		close(ws.idle)
		ws.idle = nil
	}
}

// leaveWait ends a wait. A wait ended by the drain (handedBack) stays on
// the record and keeps the clock paused: the attempt ends, and the next
// one takes the wait over from the record. A wait in a call (inCall) not
// handed back counts its call running again.
func (r *run) leaveWait(ctx context.Context, what string, handedBack, inCall bool) {
	ws := &r.wait
	var next *run
	defer func() { handPlace(next) }() // after the unlock (deferred below)
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.n--
	if !parkableWait(what) {
		ws.other--
	}
	if pausesClock(what) {
		// A handed-back wait keeps the clock paused: the attempt ends
		// and the next one takes the wait over from the record.
		if ws.pausing--; ws.pausing == 0 && !handedBack && r.clock != nil {
			r.clock.Resume()
		}
	}
	if inCall && !handedBack {
		ws.busy++
	}
	defer r.signalIdleLocked() // before the unlock
	w := r.w
	if ws.offSlot {
		r.disarmParkLocked()
		// The call runs now: it needs a slot, even while other calls of
		// the run still wait. This blocks until one is free; the run's
		// stop (ctx) lets it finish without one. A handed-back run ends.
		if !handedBack {
			r.slot.take(ctx)
		}
		ws.offSlot = false
		w.places.mu.Lock()
		w.places.offSlot--
		w.places.mu.Unlock()
	}
	next = r.dropPlaceLocked()
	if ws.n > 0 {
		return
	}
	r.leavePlaceQueueLocked()
	if !handedBack {
		ws.now.Store(nil)
	}
	w.places.mu.Lock()
	w.places.waiting--
	n := w.places.waiting
	w.places.mu.Unlock()
	w.obs.RunsWaiting(r.info(), n)
	r.hb.now()
}

// pausesClock reports whether a wait for what leaves its time out of the
// run's timeout: every wait but one for child runs, which the parent's
// timeout bounds (docs/protocol.md §17, Timeouts).
func pausesClock(what string) bool { return what != waitingChildren }

// waiting returns what the run waits for now ("" when it does not).
func (r *run) waiting() (what string, since time.Time) {
	if i := r.wait.now.Load(); i != nil {
		return i.what, i.since
	}
	return "", time.Time{}
}

// drainCtx ends when the worker starts draining (Run's context).
func (w *Worker) drainCtx() context.Context {
	if w.runCtx == nil {
		return context.Background()
	}
	return w.runCtx
}

// OffSlot returns how many runs wait without a slot now.
func (w *Worker) OffSlot() int {
	w.places.mu.Lock()
	defer w.places.mu.Unlock()
	return w.places.offSlot
}

// handBackWhileWaiting stops a run whose wait the worker's drain ended:
// the run's tool calls that run (not wait), e.g. ungated calls of the
// batch, finish first, within DrainTimeout, so their results are stored;
// what it published is stored, then nothing more is (the gated calls stay
// pending in its events, for the next attempt), and mustNotFinish hands
// it back. Every waiting call of the run calls it; all return once the
// run is fenced. A call whose wait took its answer as the drain or park
// ended the others runs on and is waited for (awaitToolsIdle): its
// result is stored, not fenced (else its tool could run again after the
// wake).
func (r *run) handBackWhileWaiting() {
	r.wait.handBack.Do(func() {
		r.awaitToolsIdle(r.w.hardCtx)
		r.waitHandedBack.Store(true)
		if r.parks() {
			r.announcePark() // park.go
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.w.hardCtx), 5*time.Second)
		_ = r.pub.Sync(ctx)
		cancel()
		r.pub.Fence()
		r.stop()
	})
}

// awaitToolsIdle returns when none of the run's tool calls runs and none
// of its approval waits is in progress (signalIdleLocked), or ctx ends.
// The caller's own wait has left: every other approval wait was ended by
// the same park or drain, so it leaves soon, handed back or with its
// answer (then its call runs first).
func (r *run) awaitToolsIdle(ctx context.Context) {
	ws := &r.wait
	ws.mu.Lock()
	if ws.busy == 0 && ws.n == ws.other {
		ws.mu.Unlock()
		return
	}
	if ws.idle == nil {
		ws.idle = make(chan struct{})
	}
	idle := ws.idle
	ws.mu.Unlock()
	select {
	case <-idle:
	case <-ctx.Done():
	}
}

// handBackWaiting is the hand-back of a run stopped by
// handBackWhileWaiting. Its Nak would count as a delivery: the record
// counts waiting hand-backs (waitHandBacks) so the give-up leaves them out.
func (r *run) handBackWaiting() {
	r.endHeartbeat()
	r.pub.Abandon()
	ctx, cancel := r.finishContext()
	defer cancel()
	r.earlier.waitingHandBacks++
	if err := r.lease.Renew(ctx, r.record(bus.StateRunning)); err != nil {
		if leaseGone(err) {
			r.log.Warn("run stopped: lease lost to a newer attempt")
			return
		}
		r.log.Warn("cannot count the waiting hand-back in the record; it counts as a delivery", "err", err)
	}
	r.log.Info("worker stopping: waiting run handed back")
	// After this worker's pulls have stopped, so none of them takes it
	// again (each take would use up a delivery).
	_ = r.msg.NakWithDelay(r.w.cfg.PollWait + time.Second)
}
