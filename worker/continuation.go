package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// Continuations (continueFrom) since 1.9.
//
// The transcript a run continues is loaded from the prior run's snapshot
// (bus/snapshot.go) in one read, else folded from its events as before 1.9.
// It is not published again: the run's events have one
// transcript_restored {from, messages, bytes} per attempt instead, and its
// own messages after it. Invariants:
//
//   - a snapshot is loaded only within the worker's load budget
//     (Config.LoadBudget): the run reserves the snapshot's size before the
//     read and holds it until its attempt ends (the messages live in the
//     agent as long). A run that does not fit the free budget waits for it
//     without its concurrency slot; one larger than the whole budget is
//     refused (transcript_too_large), never waits;
//   - the agent starts with the prior messages (SetMessages) and is
//     prompted with the run's own: only those are published;
//   - a resume prepends the prior messages to what the earlier attempts
//     published, unless an earlier attempt published them itself (a worker
//     before 1.9: its events have no transcript_restored), and then it
//     publishes no transcript_restored either;
//   - a run's transcript bound (--max-transcript-bytes) counts the prior
//     bytes.

// maxContinueDepth bounds the events fallback's chain of continuations
// without snapshots (each names the run it continued).
const maxContinueDepth = 64

// priorTranscript is what a continuation starts from.
type priorTranscript struct {
	from  string
	msgs  []agent.Message
	bytes int64 // its JSON's size
	// held is the load budget the run holds until its attempt ends.
	held int64
	// inEvents: an earlier attempt of a worker before 1.9 published the
	// prior messages as events (resume).
	inEvents bool
}

// loadPrior loads the transcript of the finished run id (continueFrom),
// reserving its size in the load budget when it comes from a snapshot.
func (r *run) loadPrior(ctx context.Context, id string) (*priorTranscript, error) {
	rec, err := r.priorRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	w := r.w
	h, err := w.c.SnapshotInfo(ctx, id)
	switch {
	case err == nil && h.Attempt == rec.Attempt:
		p, err := r.loadSnapshot(ctx, id, h)
		if err == nil || bus.IsBadRequest(err) || ctx.Err() != nil {
			return p, err
		}
		r.log.Warn("continueFrom: cannot load the snapshot; reading the run's events", "continueFrom", id, "err", err)
	case err == nil:
		r.log.Warn("continueFrom: the snapshot is not the finished attempt's; reading the run's events",
			"continueFrom", id, "snapshotAttempt", h.Attempt, "attempt", rec.Attempt)
	case !errors.Is(err, bus.ErrNoSnapshot):
		r.log.Warn("continueFrom: cannot read the snapshot; reading the run's events", "continueFrom", id, "err", err)
	}
	msgs, err := r.priorFromEvents(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	return &priorTranscript{from: id, msgs: msgs, bytes: jsonSize(msgs)}, nil
}

// priorRecord checks that run id may be continued by this run.
func (r *run) priorRecord(ctx context.Context, id string) (*bus.RunRecord, error) {
	rec, err := r.w.getRecord(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, bus.BadRequest("continueFrom: run %s not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("continueFrom: %w", err)
	}
	if !rec.Finished() {
		return nil, bus.BadRequest("continueFrom: run %s has not finished (it is %s)", id, rec.State)
	}
	// Queues are the unit of permission (subject permissions): a run may
	// only read the transcript of a run of its own queue.
	if rec.Queue != r.queue {
		return nil, bus.BadRequest("continueFrom: run %s is on queue %q, this run is on queue %q; a run may only continue a run of its own queue",
			id, clipString(rec.Queue, 64), r.queue)
	}
	return rec, nil
}

// loadSnapshot reserves h.Bytes of the load budget and reads the snapshot.
func (r *run) loadSnapshot(ctx context.Context, id string, h bus.SnapshotHeader) (*priorTranscript, error) {
	w := r.w
	if h.Bytes > w.cfg.LoadBudget {
		r.refusal = bus.ReasonTranscriptTooLarge
		return nil, bus.BadRequest("transcript_too_large: continueFrom: run %s's transcript is %d bytes (%d messages), more than this worker's load budget of %d bytes (--load-budget)",
			id, h.Bytes, h.Messages, w.cfg.LoadBudget)
	}
	if err := r.reserveLoad(ctx, h.Bytes); err != nil {
		return nil, err
	}
	msgs, h, err := w.c.LoadSnapshot(ctx, id, h.Attempt, h.Bytes)
	if err != nil {
		r.releaseLoad()
		return nil, err
	}
	if err := checkPriorRoles(id, msgs); err != nil {
		r.releaseLoad()
		return nil, err
	}
	return &priorTranscript{from: id, msgs: msgs, bytes: h.Bytes, held: h.Bytes}, nil
}

// reserveLoad takes n bytes of the worker's load budget. When they are not
// free the run gives its slot back while it waits (the pickup beat keeps
// its request owned), and takes one again once it has them.
func (r *run) reserveLoad(ctx context.Context, n int64) error {
	w := r.w
	if w.loads.TryAcquire(n) {
		r.loadHeld = n
		return nil
	}
	r.log.Info("continueFrom: waiting for the load budget without a slot", "bytes", n, "budget", w.cfg.LoadBudget)
	r.slot.release()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(w.drainCtx(), cancel) // a draining worker hands the run back
	defer stop()
	if err := w.loads.Acquire(wctx, n); err != nil {
		return fmt.Errorf("continueFrom: waiting for %d bytes of the load budget: %w", n, err)
	}
	r.loadHeld = n
	if !r.slot.take(wctx) {
		r.releaseLoad()
		return fmt.Errorf("continueFrom: no slot after the load budget: %w", context.Cause(wctx))
	}
	return nil
}

// releaseLoad gives back the load budget the run holds.
func (r *run) releaseLoad() {
	if r.loadHeld > 0 {
		r.w.loads.Release(r.loadHeld)
		r.loadHeld = 0
	}
}

// priorFromEvents folds a finished run's events into its transcript (the
// fallback without a snapshot). A 1.9 continuation's events start with
// transcript_restored: the run it names is folded in front.
func (r *run) priorFromEvents(ctx context.Context, id string, depth int) ([]agent.Message, error) {
	// What is stored now, without waiting for more: the record says the
	// run finished, so its events must end with run_finished.
	envs, err := r.w.reads.Read(ctx, id, 0)
	if err != nil {
		return nil, fmt.Errorf("continueFrom: loading the events of run %s: %w", id, err)
	}
	t := &bus.Transcript{Run: id}
	for _, e := range envs {
		_ = t.Apply(e)
	}
	if !t.Done() {
		return nil, bus.BadRequest("continueFrom: the events of run %s do not end with run_finished", id)
	}
	msgs := t.Messages
	if ref := t.Restored; ref != nil {
		if depth >= maxContinueDepth || !bus.ValidID(ref.From) || ref.From == id {
			return nil, bus.BadRequest("continueFrom: run %s continues a chain of more than %d runs without snapshots", id, maxContinueDepth)
		}
		if _, err := r.priorRecord(ctx, ref.From); err != nil {
			return nil, err
		}
		// A snapshot of the earlier run, when it has one, is trusted here
		// only through the events path: its size is not budgeted.
		before, err := r.priorFromEvents(ctx, ref.From, depth+1)
		if err != nil {
			return nil, err
		}
		msgs = append(before[:min(ref.Messages, len(before)):min(ref.Messages, len(before))], msgs...)
	}
	// A compacted run is continued from its compacted context, as its
	// snapshot holds it.
	msgs = bus.CompactedContext(msgs, t.LastCompaction())
	if err := checkPriorRoles(id, msgs); err != nil {
		return nil, err
	}
	return msgs, nil
}

// checkPriorRoles refuses a transcript with system text in its messages.
// A run of a worker before 1.8 may have taken it; the model would get it
// as system text here too. Refused, as in messages: nothing of the
// conversation is dropped unsaid.
func checkPriorRoles(id string, msgs []agent.Message) error {
	for i := range msgs {
		if role := msgs[i].Role; role == agent.RoleSystem || role == agent.RoleDeveloper {
			return bus.BadRequest(`continueFrom: run %s has a message with role %q (message %d of its transcript, from a worker before 1.8): system text goes in "systemPrompt", and such a run cannot be continued`,
				id, role, i)
		}
	}
	return nil
}

// priorLen is how many messages the run continued from has (give-up's
// count): the snapshot's header, else its events.
func (r *run) priorLen(ctx context.Context, id string) (int, error) {
	rec, err := r.priorRecord(ctx, id)
	if err != nil {
		return 0, err
	}
	if h, err := r.w.c.SnapshotInfo(ctx, id); err == nil && h.Attempt == rec.Attempt {
		return h.Messages, nil
	}
	msgs, err := r.priorFromEvents(ctx, id, 0)
	return len(msgs), err
}

// restorePrior starts the agent's transcript with the prior messages
// (unless a resume restored them with the rest) and publishes
// transcript_restored: the prior messages by reference.
func (r *run) restorePrior(restored bool) {
	p := r.prior
	if p == nil {
		return
	}
	if !restored {
		r.agent.SetMessages(p.msgs)
	}
	if r.comp != nil { // a compacted prior's summary is the one to update
		r.comp.adopt(r.agent.Messages())
	}
	msgs := len(p.msgs)
	p.msgs = nil // the agent has them
	if p.inEvents {
		return
	}
	_, _ = r.pub.Fleet(bus.EventTranscriptRestored, bus.TranscriptRestored{Type: bus.EventTranscriptRestored,
		From: p.from, Messages: msgs, Bytes: p.bytes})
}

// restoredByReference reports whether an earlier attempt's events name
// the prior transcript instead of holding its messages.
func restoredByReference(envs []*bus.Envelope) bool {
	for _, e := range envs {
		if e.Type == bus.EventTranscriptRestored {
			return true
		}
	}
	return false
}

// writeSnapshot stores the finished run's transcript (the whole context)
// before its final record. A failure is logged: the run finishes, and a
// continuation reads its events instead.
func (r *run) writeSnapshot(ctx context.Context) {
	if r.agent == nil || r.req == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, r.w.cfg.AckWait/2)
	defer cancel()
	start := time.Now()
	msgs := r.contextMessages() // compacted: what a continuation goes on from
	h, err := r.w.c.PutSnapshot(ctx, bus.SnapshotHeader{Run: r.id, Attempt: r.attempt, From: r.req.ContinueFrom}, msgs)
	if err != nil {
		r.log.Warn("transcript snapshot not stored; a continuation will read the run's events", "err", err)
		return
	}
	r.log.Debug("transcript snapshot stored", "messages", h.Messages, "bytes", h.Bytes, "took", time.Since(start))
}

// jsonSize is the size of msgs as a JSON array.
func jsonSize(msgs []agent.Message) int64 {
	var n int64 = 2
	var buf []byte
	for i := range msgs {
		var err error
		if buf, err = agent.AppendJSON(buf[:0], &msgs[i]); err == nil {
			n += int64(len(buf)) + 1
		}
	}
	return n
}
