package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
)

// maxControlRejections bounds the control_rejected events of an attempt:
// anyone who may steer may steer any run with junk, and each rejection is
// an event of the run (docs/protocol.md §6). Later invalid messages are
// only logged.
const maxControlRejections = 16

// controlInbox bounds the live control messages waiting for a run's
// control owner. Past it the stream is read instead: a flood of control
// messages costs reads, not memory (and every run, also one waiting in a
// tool for hours, keeps its inbox).
const controlInbox = 8

// controls delivers a run's control messages to its Agent, each exactly
// once and in stream order per kind.
//
// One goroutine, the owner, applies them; nothing else takes a control
// message, so the owner needs no lock to decide, and reads the stream
// without holding one. Two paths feed it:
//
//   - the live path: the worker's wildcard subscription to the control
//     stream's republished messages (each carries its stream sequence and
//     the previous sequence of its subject). The NATS callback puts them
//     into a bounded inbox and never blocks: when the inbox is full it
//     drops the message and wakes the owner to read the stream.
//   - the stream, the source of truth: the owner reads what it has not
//     taken yet at pickup (a resume starts that read beside its read of
//     the events, after the run registered: prefetch; it is applied at
//     start all the same, before any live message, so a resumed attempt
//     first knows what earlier attempts delivered; a first attempt the
//     worker's coverage vouches for skips it, coverage.go), on a gap (a dropped
//     message, or a live message whose previous sequence it has not
//     taken), at every heartbeat (the republish is plain NATS: a
//     reconnect can drop one), and at the idle check.
//
// Sequences per kind make both paths idempotent. The idle check (nothing
// stored is left and the agent has nothing queued) and the close of intake
// are one step of the owner, so no control message slips between them.
//
// The owner runs only while it has work: a run waiting in a tool for
// hours keeps no goroutine for it. Whoever gives it work (a live message,
// a wake, an idle check, the quit) puts that into its channel first and
// then kicks: active goes false -> true for one owner goroutine at a
// time. An owner that finds nothing to do sets active false, then looks
// again, and goes on only if it wins active back; so work put in before
// its last look is seen by it, and work put in after finds active false.
// The owner that stops for good (quit, or the idle check closed intake)
// leaves active true, so none starts after it.
type controls struct {
	r     *run
	ctx   context.Context // the owner's; set by start
	inbox chan liveControl
	// dropped counts live messages the full inbox turned away.
	dropped atomic.Uint64
	wake    chan struct{} // a gap or a heartbeat: read the stream
	idle    chan chan int // one idle check at a time (finishIfIdle)
	quit    chan struct{}
	done    chan struct{} // the owner has stopped for good
	// closed: intake stopped, live messages are dropped.
	closed  atomic.Bool
	started atomic.Bool // start has run: kicks may start an owner
	active  atomic.Bool // an owner goroutine runs, or stopped for good
	running bool        // the owner was started (the run's goroutine only)

	// pre is the pickup's catch-up read, started ahead (prefetch); the
	// first owner takes it.
	pre chan caughtUp

	// The owner's own state.
	last      kindSeqs        // highest sequence taken, per kind
	max       uint64          // highest sequence taken; read after done
	delivered map[uint64]bool // put into the transcript by an earlier attempt
	rejected  int             // invalid steers and follow-ups taken

	// rejects carries the control_rejected events to their publisher, a
	// goroutine beside the owner that runs while it has some (rejecting,
	// as active); room for every one an attempt publishes. The owner
	// never waits for the run's publish window on junk, so an abort
	// behind it is taken at once. The owner that stops for good waits
	// for them (rejecters). Made at the first rejection, by an owner,
	// before the publisher that reads it starts: most runs have none,
	// and its room is about 1 KB a run.
	rejects   chan bus.ControlRejected
	rejecting atomic.Bool
	rejecters sync.WaitGroup

	// queued are control messages handed to the agent, not yet in the
	// transcript; the agent's listener stamps their sequence on their
	// message_start and message_end. mu is held only to touch the slice.
	mu          sync.Mutex
	queued      []queuedControl
	queuedBytes int
}

// kindSeqs is a sequence per control kind. The five kinds have their
// place (a map was part of a waiting run's heap: docs/benchmarks/2026-12.md,
// 2026-12-02 afternoon); any other kind, which take ignores, shares the last.
type kindSeqs [6]uint64

func kindIndex(kind string) int {
	switch kind {
	case bus.KindSteer:
		return 0
	case bus.KindFollowUp:
		return 1
	case bus.KindAbort:
		return 2
	case bus.KindApprove:
		return 3
	case bus.KindCompact:
		return 4
	}
	return 5
}

func (k *kindSeqs) get(kind string) uint64      { return k[kindIndex(kind)] }
func (k *kindSeqs) set(kind string, seq uint64) { k[kindIndex(kind)] = seq }

type liveControl struct {
	kind string
	m    *nats.Msg
}

type queuedControl struct {
	seq  uint64 // its stream sequence, and its message's agent.Message.Tag
	size int
}

func newControls(r *run) *controls {
	return &controls{r: r, inbox: make(chan liveControl, controlInbox), wake: make(chan struct{}, 1),
		idle: make(chan chan int, 1), quit: make(chan struct{}), done: make(chan struct{})}
}

// offer is the NATS callback's part: it never blocks (it runs under
// Worker.mu). It returns false when the run is finishing and the message
// is ignored.
func (c *controls) offer(kind string, m *nats.Msg) bool {
	if c.closed.Load() {
		return false
	}
	select {
	case c.inbox <- liveControl{kind, m}:
		c.kick()
	default:
		c.dropped.Add(1)
		c.poke()
	}
	return true
}

// refresh asks the owner to read the stream (a heartbeat); it never blocks.
func (c *controls) refresh() { c.poke() }

func (c *controls) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
	c.kick()
}

// kick starts an owner for work just put into its channels, unless one
// runs (or before start: the first owner takes what came before it).
func (c *controls) kick() {
	if c.started.Load() && c.active.CompareAndSwap(false, true) {
		go c.own(nil, false)
	}
}

// pending tells whether an owner has work.
func (c *controls) pending() bool {
	select {
	case <-c.quit:
		return true
	default:
	}
	return len(c.inbox) > 0 || len(c.wake) > 0 || len(c.idle) > 0
}

// skip marks control sequences as delivered by an earlier attempt. Call
// it before start.
func (c *controls) skip(seqs []uint64) {
	if c.delivered == nil {
		c.delivered = map[uint64]bool{}
	}
	for _, s := range seqs {
		c.delivered[s] = true
	}
}

// start runs the owner and returns once it has read what is stored (the
// pickup catch-up), unless read is false (nothing can be stored that the
// live path did not bring: coverage.go).
func (c *controls) start(ctx context.Context, read bool) {
	c.running = true
	c.ctx = ctx
	c.active.Store(true)
	c.started.Store(true)
	started := make(chan struct{})
	go c.own(started, read)
	select {
	case <-started:
	case <-c.done:
	}
}

// own is an owner goroutine (see controls): the first, started by start,
// first reads what is stored (read, or the inbox overflowed before start)
// and applies what came live since the run registered, so both reach the
// agent before its first model call.
func (c *controls) own(started chan<- struct{}, read bool) {
	if started != nil {
		poked := false
		select {
		case <-c.wake:
			poked = true
		default:
		}
		if pre := c.pre; pre != nil {
			// The read prefetch started is this catch-up (it came after the
			// run registered, so what was stored after it came live); a
			// failed one, or a poke since (an overflow, a gap), reads again.
			c.pre = nil
			res := <-pre
			c.takeAll(res.msgs)
			read = res.err != nil
		}
		if read || poked {
			c.catchUp(c.ctx)
		}
		for drained := false; !drained; {
			select {
			case lc := <-c.inbox:
				c.live(c.ctx, lc)
			default:
				drained = true
			}
		}
		close(started)
	}
	for {
		if c.serve() {
			c.rejecters.Wait() // the rejections are the run's, before its end
			close(c.done)      // active stays true: no owner after this one
			return
		}
		c.active.Store(false)
		if !c.pending() || !c.active.CompareAndSwap(false, true) {
			return
		}
	}
}

// serve does the owner's work until there is none left (false) or the
// owner stops for good (true).
func (c *controls) serve() bool {
	ctx := c.ctx
	for {
		select {
		case lc := <-c.inbox:
			c.live(ctx, lc)
		case <-c.wake:
			c.catchUp(ctx)
		case reply := <-c.idle:
			// What already came live is applied first; then the stream
			// says whether anything else is stored. Intake closes only on
			// a read that succeeded: a failed one could hide a message.
			for drained := false; !drained; {
				select {
				case lc := <-c.inbox:
					c.live(ctx, lc)
				default:
					drained = true
				}
			}
			if err := c.catchUp(ctx); err != nil {
				reply <- idleUnknown
				continue
			}
			if c.r.agent.HasQueuedMessages() && !c.r.tally.Stopping() {
				reply <- idleBusy
				continue
			}
			c.closed.Store(true)
			reply <- idleDone
			return true
		case <-c.quit:
			c.closed.Store(true)
			return true
		default:
			return false
		}
	}
}

// live takes a republished control message, or reads the stream when
// something of its kind came before it that was not taken yet.
func (c *controls) live(ctx context.Context, lc liveControl) {
	h := lc.m.Header
	seq, err := strconv.ParseUint(serverHeader(h, "Nats-Sequence"), 10, 64)
	if err != nil || seq <= c.last.get(lc.kind) {
		return // unusable, or taken already through a read
	}
	prev, _ := strconv.ParseUint(serverHeader(h, "Nats-Last-Sequence"), 10, 64)
	if prev != c.last.get(lc.kind) {
		c.catchUp(ctx)
		return
	}
	stored := time.Now()
	if ts := serverHeader(h, "Nats-Time-Stamp"); ts != "" {
		if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			stored = t
		}
	}
	c.take(lc.kind, seq, lc.m.Data, stored, lc.m.Header)
}

// catchUp reads the control messages stored but not taken yet, each
// kind's from after the last of it taken (controlReads.since), and takes
// them in stream order. Invariant: the messages of a kind taken so far
// are every one stored of it up to last[kind] (a read goes on to the
// first miss, and a message stored after a miss gets a higher sequence),
// so each read costs the new messages, not the run's whole history. A
// read that failed is returned, after what the others found is taken (a
// missing message is not an error).
func (c *controls) catchUp(ctx context.Context) error {
	msgs, err := c.r.w.controlReads.since(ctx, c.r.id, c.last, true)
	c.takeAll(msgs)
	if err != nil {
		c.r.log.Warn("control catch-up read failed", "err", err)
	}
	return err
}

// takeAll takes what a catch-up read found, in stream order.
func (c *controls) takeAll(msgs []*jetstream.RawStreamMsg) {
	for _, m := range msgs {
		kind := workerproto.ControlKind(m.Subject)
		if m.Sequence > c.last.get(kind) {
			c.take(kind, m.Sequence, m.Data, m.Time, m.Header)
		}
	}
}

// caughtUp is a catch-up read made ahead of start (prefetch).
type caughtUp struct {
	msgs []*jetstream.RawStreamMsg
	err  error
}

// prefetch starts the pickup's catch-up read now, beside the resume's
// read of the events, instead of after it: start takes what it found.
// Call it after the run registered (a message stored after the read then
// comes live) and before start; the read ends on its own (5 s a get).
func (c *controls) prefetch(ctx context.Context) {
	pre := make(chan caughtUp, 1)
	c.pre = pre
	r := c.r
	go func() {
		// A wake's run has its answer stored: no probe (see since).
		msgs, err := r.w.controlReads.since(ctx, r.id, kindSeqs{}, r.lease.WokenFrom == 0)
		pre <- caughtUp{msgs, err}
	}()
}

// controlReads is what runs read of the control stream.
type controlReads interface {
	// since reads run's messages of each kind stored after last[kind],
	// in stream order; on a failed read, the error with what the reads
	// found (each kind's from after last[kind], without a gap). probe:
	// when last is empty, first ask whether the run has any message.
	since(ctx context.Context, run string, last kindSeqs, probe bool) ([]*jetstream.RawStreamMsg, error)
	// lastSeq is the stream's last sequence (a gated call's fence).
	lastSeq(ctx context.Context) (uint64, error)
}

// streamControls reads the control stream Run opened.
type streamControls struct{ w *Worker }

// since reads the five kinds at once, each on its literal subject, not
// <run>.*: nats-server finds a literal subject's next message from its
// index, and scans every message after the sequence asked for a wildcard
// (docs/benchmarks/2026-12.md, 2026-12-07).
//
// Most runs have no control message at all, and their idle check made
// five reads that each found nothing. So when nothing was taken yet (last
// is empty) and probe is set, one read of <run>.* from sequence 1 asks
// first: from the stream's first sequence nats-server answers a wildcard
// from its subject index, without a scan. Nothing found means each
// literal read would have missed at its first get; anything found, or a
// failed probe, reads the five kinds as before.
func (s streamControls) since(ctx context.Context, run string, last kindSeqs, probe bool) ([]*jetstream.RawStreamMsg, error) {
	if probe && last == (kindSeqs{}) {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := s.w.controlStream.GetMsg(gctx, 1, jetstream.WithGetMsgSubject(s.w.names.ControlAll(run)))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, nil
		}
	}
	// The kinds AGENTS_CONTROL stores (its subjects).
	kinds := [...]string{bus.KindSteer, bus.KindFollowUp, bus.KindAbort, bus.KindApprove, bus.KindCompact}
	var found [len(kinds)][]*jetstream.RawStreamMsg
	var errs [len(kinds)]error
	var wg sync.WaitGroup
	for i, k := range kinds {
		wg.Go(func() { found[i], errs[i] = s.kind(ctx, s.w.names.Control(run, k), last.get(k)+1) })
	}
	wg.Wait()
	all := slices.Concat(found[:]...)
	slices.SortFunc(all, func(a, b *jetstream.RawStreamMsg) int { return cmp.Compare(a.Sequence, b.Sequence) })
	return all, errors.Join(errs[:]...)
}

// kind reads subj's messages from seq on, up to the first miss; on a
// failed read, those read before it.
func (s streamControls) kind(ctx context.Context, subj string, seq uint64) ([]*jetstream.RawStreamMsg, error) {
	var out []*jetstream.RawStreamMsg
	for {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := s.w.controlStream.GetMsg(gctx, seq, jetstream.WithGetMsgSubject(subj))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, m)
		seq = m.Sequence + 1
	}
}

func (s streamControls) lastSeq(ctx context.Context) (uint64, error) {
	info, err := s.w.controlStream.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// take delivers one control message.
func (c *controls) take(kind string, seq uint64, data []byte, stored time.Time, h nats.Header) {
	c.last.set(kind, seq)
	c.max = max(c.max, seq)
	r := c.r
	if c.delivered[seq] {
		r.log.Debug("control message already in the transcript; not delivered again", "kind", kind, "controlSeq", seq)
		return
	}
	// A control message stored before the request was published for a run
	// that did not exist yet (a guessed id): it is not the run's.
	if !r.submittedAt.IsZero() && stored.Before(r.submittedAt) {
		r.log.Warn("control message stored before the run's request; ignored", "kind", kind, "controlSeq", seq)
		return
	}
	r.traceControl(kind, seq, h)
	switch kind {
	case bus.KindAbort:
		reason := workerproto.DecodeAbort(data)
		r.log.Info("abort received", "controlSeq", seq, "reason", reason)
		r.abort(reason)
	case bus.KindApprove:
		a, err := decodeApproval(data)
		if err != nil {
			r.log.Warn("approval ignored", "controlSeq", seq, "err", err)
			r.rejectInvalidApproval(data, seq, err) // worker/approval.go
			return
		}
		r.deliverApproval(a, seq, stored, len(data)) // worker/approval.go
	case bus.KindCompact:
		if !r.compactControl(data, seq) { // worker/compaction.go
			return
		}
	case bus.KindSteer, bus.KindFollowUp:
		msg, err := workerproto.DecodeUserControl(data, stored)
		if err != nil {
			c.reject(kind, seq, err)
			return
		}
		// Known before the agent can emit it: the listener stamps it,
		// found by its tag.
		msg.Tag = seq
		c.mu.Lock()
		n, b := len(c.queued), c.queuedBytes
		over := n >= r.w.cfg.MaxQueuedControls || b+len(data) > r.w.cfg.MaxQueuedControlBytes
		if !over {
			c.queued = append(c.queued, queuedControl{seq: seq, size: len(data)})
			c.queuedBytes += len(data)
		}
		c.mu.Unlock()
		if over {
			r.overBudget(bus.ReasonControlBudget, fmt.Sprintf("%d steer/follow-up messages (%d bytes) were waiting for the agent; a run takes at most %d (--max-queued-controls) and %d bytes (--max-queued-control-bytes)",
				n+1, b+len(data), r.w.cfg.MaxQueuedControls, r.w.cfg.MaxQueuedControlBytes))
			return
		}
		if kind == bus.KindSteer {
			r.agent.Steer(msg)
		} else {
			r.agent.FollowUp(msg)
		}
		r.log.Info("control message queued", "kind", kind, "controlSeq", seq)
	default:
		return
	}
	// Reported once applied: a steer is in the agent's queue.
	r.w.obs.ControlReceived(kind)
}

// reject tells the sender of an invalid steer or follow-up why it was not
// taken (its sender reads the run's events, not the worker's log): the
// first maxControlRejections of the attempt get a control_rejected,
// published beside the owner; later ones are only logged.
func (c *controls) reject(kind string, seq uint64, err error) {
	r := c.r
	c.rejected++
	switch {
	case c.rejected > maxControlRejections:
		r.log.Debug("control message ignored", "kind", kind, "controlSeq", seq, "err", err)
		return
	case c.rejected == maxControlRejections:
		r.log.Warn("control message ignored; this attempt reports no more invalid control messages on its events",
			"kind", kind, "controlSeq", seq, "err", err, "reported", maxControlRejections)
	default:
		r.log.Warn("control message ignored", "kind", kind, "controlSeq", seq, "err", err)
	}
	if c.rejects == nil {
		c.rejects = make(chan bus.ControlRejected, maxControlRejections)
	}
	c.rejects <- bus.ControlRejected{Type: bus.EventControlRejected, Kind: kind,
		Reason: clipString(err.Error(), bus.MaxErrorBytes), ControlSeq: seq} // room for each
	if c.rejecting.CompareAndSwap(false, true) {
		c.rejecters.Add(1)
		go c.publishRejections()
	}
}

// publishRejections publishes the queued control_rejected events, in
// order, and stops when none is left (see controls.rejects).
func (c *controls) publishRejections() {
	defer c.rejecters.Done()
	for {
		for drained := false; !drained; {
			select {
			case ev := <-c.rejects:
				_, _ = c.r.pub.Fleet(bus.EventControlRejected, ev)
			default:
				drained = true
			}
		}
		c.rejecting.Store(false)
		if len(c.rejects) == 0 || !c.rejecting.CompareAndSwap(false, true) {
			return
		}
	}
}

// seqOf returns the control sequence of a user message the agent emitted
// (0 for messages that did not come from a control message). At the
// message's end the entry is dropped.
func (c *controls) seqOf(m *agent.Message, end bool) uint64 {
	if m == nil || m.Role != agent.RoleUser || m.Tag == 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, q := range c.queued {
		if q.seq == m.Tag {
			if end {
				c.queuedBytes -= q.size
				c.queued = append(c.queued[:i:i], c.queued[i+1:]...)
			}
			return q.seq
		}
	}
	return 0
}

// The owner's answers to an idle check.
const (
	idleDone    = iota // nothing is queued: intake is closed
	idleBusy           // messages are queued: run the agent again
	idleUnknown        // the stream could not be read: ask again
)

// finishIfIdle has the owner apply what came and read what is stored and,
// when the agent has nothing queued, close intake. It reports whether it
// closed; if not, the caller runs the agent again. While the stream cannot
// be read it asks again, with backoff, until ctx ends (a timeout or a
// drain: then the run stops anyway) or one AckWait has passed (then the
// run is handed back).
func (c *controls) finishIfIdle(ctx context.Context) bool {
	wait := 100 * time.Millisecond
	// Past one AckWait of failed reads the run is handed back (another
	// attempt resumes it) rather than holding its slot until its timeout.
	giveUp := time.Now().Add(c.r.w.cfg.AckWait)
	for {
		reply := make(chan int, 1)
		select {
		case c.idle <- reply: // room: the last check was answered
		case <-c.done:
			return true
		}
		c.kick()
		var answer int
		select {
		case answer = <-reply:
		case <-c.done:
			return true
		}
		switch answer {
		case idleDone:
			return true
		case idleBusy:
			return false
		}
		if time.Now().After(giveUp) {
			c.r.publishFailed(fmt.Errorf("the control stream could not be read for %s at the run's end", c.r.w.cfg.AckWait))
			return true
		}
		select {
		case <-time.After(wait):
			wait = min(2*wait, 2*time.Second)
		case <-ctx.Done():
			return true
		}
	}
}

// close stops intake and the owner, and returns the highest sequence
// taken.
func (c *controls) close() uint64 {
	c.closed.Store(true)
	if !c.running {
		return 0
	}
	select {
	case <-c.quit:
	default:
		close(c.quit)
	}
	c.kick()
	<-c.done
	return c.max
}
