package intake

// A run's first attempt reads the control stream at pickup only when a
// control message may be stored for it that the worker's live
// subscription did not hand to it. That read was the costliest step of a
// short run (a JetStream API request, most often answered "not found");
// the worker's own view of the control stream answers the question for
// most runs instead.
//
// Invariants, kept under the caller's lock (the worker's mu: onControl, register and the pickup
// check all take it, so a control message either finds the run
// registered or is noted before the run looks):
//
//  1. Within an epoch, the sequences onControl saw are contiguous from
//     first to last: every republished message in between reached it.
//     A gap, a sequence going back (the stream was recreated), a
//     reconnect or a dropped message (the subscription's counts differ
//     from the epoch's) ends the epoch; so does, once valid with nothing
//     seen, a first message past ctlBase+1.
//  2. unclaimed holds the run of every message of the epoch that found no
//     run of this worker registered.
//  3. valid: a renew read the control stream's last sequence ctlBase (its
//     configuration republishing every message) and then the runs
//     stream's last sequence runsBase within this epoch, and first <=
//     ctlBase+1 (or nothing was seen): every control message stored after
//     ctlBase was seen in the epoch.
//
// A control message counts only when stored after its run's request
// (controls.take). A request above runsBase was stored after the runs
// stream's read, so such a message was stored after ctlBase, and (1, 2)
// it was handed to the run or noted in unclaimed. So a first attempt
// whose request is above runsBase and whose run is not in unclaimed has
// nothing stored to read at pickup. A message lost between servers
// (nothing later arrives to show the gap) is read at the run's next
// heartbeat, as for a running run; and an audit every coverageAudit ends
// the epoch when what the stream held at the audit before has not come
// (or the stream stopped republishing everything), so such a loss, or a
// dead subscription, leaves first attempts unread for two intervals at
// most (the audit after the loss reads it, the next one misses it).
type ControlCoverage struct {
	epoch      uint64
	first      uint64 // first sequence seen in the epoch; 0: none yet
	last       uint64
	valid      bool
	ctlBase    uint64
	runsBase   uint64
	reconnects uint64 // the connection's reconnects when the epoch's renew began
	dropped    int    // the subscription's dropped messages then
	unclaimed  map[string]struct{}
	renew      chan struct{} // 1-buffered: a renew is due
	// off: the last look at the control stream found it not republishing
	// every message; an audit that finds it back renews.
	off bool
}

// maxUnclaimed bounds the runs noted (a fleet's other runs, a flood of
// control messages to made-up runs): past it the epoch ends.
const maxUnclaimed = 4096

// NewControlCoverage starts with no epoch valid: every first attempt reads.
func NewControlCoverage() *ControlCoverage {
	return &ControlCoverage{unclaimed: map[string]struct{}{}, renew: make(chan struct{}, 1)}
}

// Saw notes a republished control message; claimed tells whether a run of
// this worker took it. The caller's lock is held.
func (cv *ControlCoverage) Saw(seq uint64, run string, claimed bool) {
	if seq == 0 {
		return
	}
	if seq == cv.last {
		// The same sequence again: a copy, or the real message after one
		// that claimed its number (a spoofed header, a recreated stream).
		// Its run is noted all the same.
		cv.note(run, claimed)
		return
	}
	switch {
	case cv.last != 0 && seq != cv.last+1:
		cv.Lose() // a gap, or the stream started again
	case cv.last == 0 && cv.valid && seq > cv.ctlBase+1:
		cv.Lose() // what came after ctlBase before seq was lost
	}
	if cv.first == 0 {
		cv.first = seq
	}
	cv.last = seq
	cv.note(run, claimed)
}

// note records the run of a message no run took (invariant 2).
func (cv *ControlCoverage) note(run string, claimed bool) {
	if claimed {
		return
	}
	cv.unclaimed[run] = struct{}{}
	if len(cv.unclaimed) > maxUnclaimed {
		cv.Lose()
	}
}

// Lose ends the epoch and asks for a renew. The caller's lock is held.
func (cv *ControlCoverage) Lose() {
	cv.epoch++
	cv.first, cv.last, cv.valid = 0, 0, false
	clear(cv.unclaimed)
	select {
	case cv.renew <- struct{}{}:
	default:
	}
}

// Covers tells whether a first attempt of run, whose request has stream
// sequence reqSeq, may skip the pickup read (see invariant 3). It forgets
// the run: the read it gets instead takes what was noted. The caller's lock is
// held.
func (cv *ControlCoverage) Covers(run string, reqSeq, reconnects uint64, dropped int) bool {
	if cv.valid && (reconnects != cv.reconnects || dropped != cv.dropped) {
		cv.Lose()
	}
	_, noted := cv.unclaimed[run]
	delete(cv.unclaimed, run)
	return cv.valid && reqSeq > cv.runsBase && !noted
}

// Renewed ends a renew that began in epoch with these counts and bases.
// The caller's lock is held.
func (cv *ControlCoverage) Renewed(epoch, reconnects uint64, dropped int, ctlBase, runsBase uint64) {
	if epoch != cv.epoch {
		return // lost meanwhile: the renew due does it again
	}
	if cv.first > ctlBase+1 {
		cv.Lose() // messages after ctlBase were not seen
		return
	}
	cv.valid, cv.reconnects, cv.dropped, cv.ctlBase, cv.runsBase = true, reconnects, dropped, ctlBase, runsBase
}

// Disable ends the epoch without a renew: the stream does not republish
// every message. The caller's lock is held.
func (cv *ControlCoverage) Disable() {
	cv.Lose()
	select {
	case <-cv.renew:
	default:
	}
	cv.off = true
}

// Audited applies an audit's look at the control stream: whether it
// republishes every message, and the last sequence the audit before read
// (prev). What was stored then has had an audit interval to come: if it
// has not, it was lost with nothing after it to show the gap (or the
// subscription is dead). The caller's lock is held.
func (cv *ControlCoverage) Audited(republishes bool, prev uint64) {
	switch {
	case !republishes:
		cv.Disable()
	case cv.off:
		cv.off = false
		cv.Lose() // back: renew
	case cv.valid && max(cv.last, cv.ctlBase) < prev:
		cv.Lose()
	}
}

// Epoch is the current epoch, where a renew begins. The caller's lock is
// held.
func (cv *ControlCoverage) Epoch() uint64 { return cv.epoch }

// RenewDue receives when a renew is due.
func (cv *ControlCoverage) RenewDue() <-chan struct{} { return cv.renew }

// Off tells whether the last look found the stream not republishing
// every message. The caller's lock is held.
func (cv *ControlCoverage) Off() bool { return cv.off }

// Valid tells whether the epoch covers first attempts, and the last
// sequence it saw (for tests and logs). The caller's lock is held.
func (cv *ControlCoverage) Valid() (bool, uint64) { return cv.valid, cv.last }
