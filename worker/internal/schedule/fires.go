// Package schedule turns schedule fires into run requests. The server
// keeps the schedules (AGENTS_SCHEDULES, message schedules) and publishes
// each fire; every worker pulls the shared durable consumer of fires, so
// no worker is the scheduler and a fire a dead worker took comes again.
//
// Invariants, for each fire (bus/schedule.go has those of the wire):
//
//  1. The run id is bus.ScheduleRunID of the fire's planned time
//     (bus.Schedule.FirePlanned: the spec and the fire, no clock), so a
//     fire handled twice (a redelivery, two workers) submits one run: the
//     work queue's dedupe stores the second submit as a duplicate.
//  2. The fire is acknowledged only after the request is stored (or the
//     fire skipped for a reason): a crash before that redelivers it.
//  3. A fire submits only to the queue of its subject, and its body must
//     name that queue and the schedule of its subject.
//  4. Overlap and catch-up decide from NATS state only (the schedule's
//     last run and its record; the newest stored fire), so any worker
//     decides the same.
//  5. A fire counts only when the server fired it from the def of its
//     own subject (Nats-Scheduler); a trigger only when no schedule fired
//     it (checkScheduler).
//  6. A run id another request holds (ErrRunIDTaken) is a fire done only
//     when that run is the schedule's own (ownRun); else the fire is
//     skipped as taken and .last is left alone.
//  7. Lateness (the catch-up policy's) is judged on the server's clock: a
//     first delivery by the server's current time, a redelivery only by
//     the fire's store time.
//  8. A fire runs only while its definition is the stored one, active
//     (a trigger: while the schedule exists).
//  9. A server fire stored more than bus.ScheduleOutageGap (and, for
//     @every, at least one interval) after the time the previous fire of
//     the same definition named (Nats-Schedule-Next) is the server's one
//     fire for what it missed while down (afterOutage, missedPlanned):
//     late, for the catch-up policy, whatever its own planned time says
//     (the server re-anchors @every at it, and a cron's is its newest
//     missed time).
package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/handoff"
)

// Skip reasons (the metric's label).
const (
	SkipOverlap = "overlap" // the previous run still goes (overlap skip)
	SkipMissed  = "missed"  // a late fire the catch-up policy does not run
	SkipInvalid = "invalid" // a fire whose body or subject is not a schedule's
	SkipTaken   = "taken"   // another request (not the schedule's) holds the fire's run id
	SkipStale   = "stale"   // a fire of a definition since paused, replaced or deleted
	SkipFailed  = "failed"  // given up after bus.FireMaxDeliver deliveries that failed
)

// Observer is told what each fire did.
type Observer interface {
	// ScheduleFired: a fire submitted a run; lateness is from its planned
	// time to now.
	ScheduleFired(lateness time.Duration)
	// ScheduleSkipped: a fire submitted nothing.
	ScheduleSkipped(reason string)
}

// Env is what handling fires needs.
type Env struct {
	Client *bus.Client
	Log    *slog.Logger
	Obs    Observer // nil: none
	// Late is how late a fire may be and still count as on time [30s];
	// a later one is a missed fire, for the catch-up policy.
	Late time.Duration
	Now  func() time.Time // [time.Now]

	setLast func(ctx context.Context, queue, name string, l bus.ScheduleLast) error // tests' [Client.SetLastScheduleRun]
}

func (e *Env) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// Start pulls the fires from cons until the returned stop is called; stop
// waits for those in progress. Each fire is handled on its own goroutine
// (it reads and writes NATS: never in the callback).
func (e *Env) Start(ctx context.Context, cons jetstream.Consumer) (stop func(), err error) {
	return handoff.Consume(ctx, cons, 64, "schedule fires consumer", e.Log, e.Handle)
}

func (e *Env) skipped(reason string) {
	if e.Obs != nil {
		e.Obs.ScheduleSkipped(reason)
	}
}

// Handle turns one fire into a run request, or skips it.
func (e *Env) Handle(ctx context.Context, m jetstream.Msg) {
	names := e.Client.Names()
	queue, name, kind, err := names.ParseScheduleSubject(m.Subject())
	var s bus.Schedule
	if err == nil && kind == "fire" {
		err = json.Unmarshal(m.Data(), &s)
	}
	if err == nil && (kind != "fire" || s.Queue != queue || s.Name != name) { // invariant 3
		err = errors.New("the body is not this subject's schedule")
	}
	if err == nil {
		// As a create would: an unknown overlap or request field is
		// refused, not read as something else.
		err = s.Validate()
	}
	md, merr := m.Metadata()
	if err == nil && merr != nil {
		err = merr
	}
	var planned time.Time
	var trigger bool
	if err == nil {
		planned, trigger, err = s.FirePlanned(m.Headers(), md.Timestamp)
	}
	if err == nil {
		err = checkScheduler(names, m.Headers().Get(bus.HeaderScheduler), queue, name, trigger)
	}
	if err != nil {
		e.Log.Warn("schedule fire dropped", "subject", m.Subject(), "err", err)
		e.skipped(SkipInvalid)
		_ = m.Term()
		return
	}
	hctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	// Invariant 8: a fire stored before a pause, resume, replace or delete
	// (fires live for FireTTL) is not the schedule's any more.
	cur, err := e.Client.ScheduleOn(hctx, queue, name)
	if errors.Is(err, bus.ErrScheduleNotFound) && s.At != nil && !trigger {
		// The server removes an @at schedule once it fired: only a
		// tombstone says it was deleted.
		if gone, gerr := e.defGone(hctx, queue, name); gerr != nil || gone {
			cur, err = &bus.ScheduleInfo{Schedule: s}, gerr
		}
	}
	switch {
	case errors.Is(err, bus.ErrScheduleNotFound):
		e.Log.Info("schedule fire skipped: the schedule is deleted", "schedule", name, "queue", queue)
		e.skipped(SkipStale)
		_ = m.Ack()
		return
	case err != nil:
		e.Log.Warn("schedule fire: reading the schedule failed; retrying", "schedule", name, "queue", queue, "err", err)
		e.retry(m, md)
		return
	case !trigger && (cur.Paused || !s.SameDefinition(cur)):
		e.Log.Info("schedule fire skipped: the schedule was paused or replaced since", "schedule", name, "queue", queue)
		e.skipped(SkipStale)
		_ = m.Ack()
		return
	}
	late := max(e.now().Sub(planned), 0) // for the log only
	log := e.Log.With("schedule", name, "queue", queue, "planned", planned.Format(time.RFC3339))
	id := bus.ScheduleRunID(queue, name, planned, trigger)

	// Lateness is judged on the server's clock only (a worker's clock may
	// be off). A first delivery waited for workers since it was stored:
	// judged by the server's current time (stream info's). Invariant 7: a
	// redelivery was offered before, its wait since is ours: judged by
	// its store time.
	judged := md.Timestamp.Sub(planned)
	if md.NumDelivered <= 1 && !trigger {
		st, err := e.Client.Stream(hctx, names.SchedulesStream())
		var info *jetstream.StreamInfo
		if err == nil {
			info, err = st.Info(hctx)
		}
		if err != nil {
			log.Warn("schedule fire: reading the server's time failed; retrying", "err", err)
			e.retry(m, md)
			return
		}
		if info.TimeStamp.After(md.Timestamp) {
			judged = info.TimeStamp.Sub(planned)
		}
	}
	outage := false
	if !trigger && judged <= e.lateLimit() { // invariant 9
		if outage, err = e.afterOutage(hctx, &s, m, md); err != nil {
			log.Warn("schedule fire: reading the previous fire failed; retrying", "err", err)
			e.retry(m, md)
			return
		}
	}
	if !trigger && (judged > e.lateLimit() || outage) {
		// The server's one fire for an outage is the run catch-up once
		// names, newer fires or not (they are on time); fires that waited
		// for workers run only the newest.
		run, err := outage && s.CatchUpPolicy() == bus.CatchUpOnce, error(nil)
		if !run {
			run, err = e.catchUp(hctx, &s, m, md)
		}
		if err != nil {
			log.Warn("schedule fire: reading the newest fire failed; retrying", "err", err)
			e.retry(m, md)
			return
		}
		if !run {
			log.Info("schedule fire skipped: missed (catch-up policy)", "late", judged.Round(time.Millisecond), "afterOutage", outage, "catchUp", s.CatchUpPolicy())
			e.skipped(SkipMissed)
			_ = m.Ack()
			return
		}
	}
	if pol := s.OverlapPolicy(); pol != bus.OverlapAllow {
		prev, err := e.stillGoing(hctx, queue, name, id, planned)
		if err != nil {
			log.Warn("schedule fire: reading the previous run failed; retrying", "err", err)
			e.retry(m, md)
			return
		}
		if prev != "" && pol == bus.OverlapSkip {
			log.Info("schedule fire skipped: the previous run still goes", "previous", prev)
			e.skipped(SkipOverlap)
			_ = m.Ack()
			return
		}
		if prev != "" {
			if _, err := e.Client.Abort(hctx, prev, "schedule "+name+": the next fire aborts the previous run (overlap abort)"); err != nil && !errors.Is(err, bus.ErrRunFinished) { // finished since: done
				log.Warn("schedule fire: aborting the previous run failed; retrying", "previous", prev, "err", err)
				e.retry(m, md)
				return
			}
		}
	}
	// Decoded as a direct submit is (unknown fields refused).
	dec, err := bus.DecodeRunRequest(s.Request, id)
	if err != nil {
		log.Warn("schedule fire dropped: its request does not decode", "err", err)
		e.skipped(SkipInvalid)
		_ = m.Term()
		return
	}
	req := *dec
	req.ID = id
	if req.Metadata == nil {
		req.Metadata = map[string]string{}
	}
	req.Metadata[bus.MetaSchedule] = name
	req.Metadata[bus.MetaScheduledFor] = planned.Format(time.RFC3339Nano)
	res, err := e.Client.Submit(hctx, queue, &req)
	switch {
	case bus.IsBadRequest(err):
		log.Warn("schedule fire dropped: its request is refused", "err", err)
		e.skipped(SkipInvalid)
		_ = m.Term()
		return
	case errors.Is(err, bus.ErrRunIDTaken):
		// Invariant 6: the id is computed from public data, so anyone may
		// have submitted it first. Only the schedule's own run (this
		// queue, this schedule and planned time: the schedule replaced
		// between deliveries) counts as fired.
		own, oerr := e.ownRun(hctx, queue, name, id, planned)
		if oerr != nil {
			log.Warn("schedule fire: reading the run that holds its id failed; retrying", "run", id, "err", oerr)
			e.retry(m, md)
			return
		}
		if !own {
			log.Warn("schedule fire skipped: another request holds its run id", "run", id)
			e.skipped(SkipTaken)
			_ = m.Ack()
			return
		}
	case err != nil:
		log.Warn("schedule fire: submit failed; retrying", "err", err)
		e.retry(m, md)
		return
	}
	setLast := e.Client.SetLastScheduleRun
	if e.setLast != nil {
		setLast = e.setLast
	}
	if err := setLast(hctx, queue, name, bus.ScheduleLast{Run: id, PlannedAt: planned, FiredAt: md.Timestamp.UTC(), Trigger: trigger, FireSeq: md.Sequence.Stream}); err != nil {
		log.Warn("schedule fire: recording the last run failed; retrying", "run", id, "err", err)
		e.retry(m, md)
		return
	}
	if err := m.DoubleAck(hctx); err != nil {
		log.Debug("schedule fire: ack failed (a redelivery submits the same run id)", "run", id, "err", err)
	}
	if !res.Duplicate && e.Obs != nil {
		e.Obs.ScheduleFired(e.now().Sub(planned)) // to the request stored
	}
	log.Debug("schedule fired", "run", id, "duplicate", res.Duplicate, "late", late)
}

// checkScheduler keeps invariant 5: the server fires a schedule onto any
// subject of the stream its message names (Nats-Schedule-Target), whoever
// published it, and marks the fire with the schedule's subject
// (Nats-Scheduler, which clients cannot set but to purge). A fire counts
// only when that is its own def; a trigger, which a user publishes, has
// none.
func checkScheduler(names bus.Names, scheduler, queue, name string, trigger bool) error {
	switch {
	case trigger && scheduler != "":
		return fmt.Errorf("a trigger fired by schedule %s", scheduler)
	case !trigger && scheduler != names.ScheduleDef(queue, name):
		return fmt.Errorf("a fire of %q, not of this subject's schedule", scheduler)
	}
	return nil
}

// retry hands a fire that failed back for a later delivery, backing off
// (retryDelay); at its bus.FireMaxDeliver-th delivery it is given up
// (terminated, counted failed): the consumer's MaxDeliver would drop it
// silently.
func (e *Env) retry(m jetstream.Msg, md *jetstream.MsgMetadata) {
	if md != nil && md.NumDelivered >= bus.FireMaxDeliver {
		e.Log.Error("schedule fire given up: it failed at each delivery", "subject", m.Subject(), "deliveries", md.NumDelivered)
		e.skipped(SkipFailed)
		_ = m.Term()
		return
	}
	_ = m.NakWithDelay(retryDelay(md))
}

// retryDelay backs a failing fire off, doubling from 1 s to 1 min by its
// deliveries: a persistent failure (an unknown queue, NATS trouble) must
// not redeliver every second and fill the consumer's MaxAckPending, which
// would stall every schedule.
func retryDelay(md *jetstream.MsgMetadata) time.Duration {
	n := uint64(1)
	if md != nil && md.NumDelivered > 1 {
		n = md.NumDelivered
	}
	return min(time.Second<<min(n-1, 6), time.Minute)
}

func (e *Env) lateLimit() time.Duration {
	if e.Late > 0 {
		return e.Late
	}
	return 30 * time.Second
}

// catchUp decides a late fire: with catch-up once, only the newest fire
// stored for the schedule runs (one run for what was missed); with none,
// no late fire runs.
func (e *Env) catchUp(ctx context.Context, s *bus.Schedule, m jetstream.Msg, md *jetstream.MsgMetadata) (bool, error) {
	if s.CatchUpPolicy() == bus.CatchUpNone {
		return false, nil
	}
	st, err := e.Client.Stream(ctx, e.Client.Names().SchedulesStream())
	if err != nil {
		return false, err
	}
	last, err := st.GetLastMsgForSubject(ctx, m.Subject())
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return last.Sequence == md.Sequence.Stream, nil
}

// maxLookBack bounds the fires afterOutage reads: past it (a long overlap
// skip), a fire is taken as in turn.
const maxLookBack = 10

// afterOutage reports whether fire m is the server's first after an
// outage: the previous server fire of the same definition, found walking
// forward from the fire of the schedule's last run (.last's FireSeq),
// named a next time m stands for but missed (missedPlanned).
func (e *Env) afterOutage(ctx context.Context, s *bus.Schedule, m jetstream.Msg, md *jetstream.MsgMetadata) (bool, error) {
	last, err := e.Client.LastScheduleRun(ctx, s.Queue, s.Name)
	if err != nil || last == nil || last.FireSeq == 0 || last.FireSeq >= md.Sequence.Stream {
		return false, err
	}
	st, err := e.Client.Stream(ctx, e.Client.Names().SchedulesStream())
	if err != nil {
		return false, err
	}
	def := e.Client.Names().ScheduleDef(s.Queue, s.Name)
	var prevNext time.Time
	seq := last.FireSeq
	for range maxLookBack {
		f, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(m.Subject()))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if f.Sequence >= md.Sequence.Stream {
			return missedPlanned(s, prevNext, md.Timestamp), nil
		}
		seq = f.Sequence + 1
		var fs bus.Schedule
		if f.Header.Get(bus.HeaderScheduler) != def || json.Unmarshal(f.Data, &fs) != nil || !fs.CreatedAt.Equal(s.CreatedAt) || !fs.UpdatedAt.Equal(s.UpdatedAt) {
			continue // a trigger, or another definition's (a resume re-anchors)
		}
		if next, err := time.Parse(time.RFC3339Nano, f.Header.Get("Nats-Schedule-Next")); err == nil {
			prevNext = next
		}
	}
	return false, nil
}

// missedPlanned reports whether a fire stored at stored, after a fire that
// named prevNext as its next time, stands for a planned time the server
// missed: stored more than bus.ScheduleOutageGap after prevNext and, for
// @every (the server re-anchors it at restart + interval), also at least
// one interval after it, so the restart came after prevNext.
func missedPlanned(s *bus.Schedule, prevNext, stored time.Time) bool {
	if prevNext.IsZero() {
		return false
	}
	gap := stored.Sub(prevNext)
	if gap <= bus.ScheduleOutageGap {
		return false
	}
	if s.Every != "" {
		d, err := time.ParseDuration(s.Every)
		return err == nil && gap >= d
	}
	return true
}

// defGone reports whether the schedule's def subject holds no message.
func (e *Env) defGone(ctx context.Context, queue, name string) (bool, error) {
	st, err := e.Client.Stream(ctx, e.Client.Names().SchedulesStream())
	if err != nil {
		return false, err
	}
	_, err = st.GetLastMsgForSubject(ctx, e.Client.Names().ScheduleDef(queue, name))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true, nil
	}
	return false, err
}

// ownRun reports whether run id is the schedule's own: on its queue, with
// its name and planned time in the metadata.
func (e *Env) ownRun(ctx context.Context, queue, name, id string, planned time.Time) (bool, error) {
	rec, err := e.Client.Status(ctx, id)
	if errors.Is(err, bus.ErrRunNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	meta := rec.Metadata
	if rec.State == bus.StateQueued && rec.RequestSeq > 0 { // no record yet: the request's
		st, err := e.Client.Stream(ctx, e.Client.Names().RunsStream())
		if err != nil {
			return false, err
		}
		m, err := st.GetMsg(ctx, rec.RequestSeq)
		if err != nil {
			return false, err
		}
		var req struct {
			Metadata map[string]string `json:"metadata"`
		}
		_ = json.Unmarshal(m.Data, &req)
		meta = req.Metadata
	}
	return rec.Queue == queue && meta[bus.MetaSchedule] == name &&
		meta[bus.MetaScheduledFor] == planned.Format(time.RFC3339Nano), nil
}

// stillGoing returns the schedule's previous run if it is still queued or
// running ("" if none); the fire's own run (a redelivery) is not previous,
// nor a newer fire's (this fire retried after it: never abort that one).
func (e *Env) stillGoing(ctx context.Context, queue, name, self string, planned time.Time) (string, error) {
	last, err := e.Client.LastScheduleRun(ctx, queue, name)
	if err != nil || last == nil || last.Run == self || last.PlannedAt.After(planned) {
		return "", err
	}
	rec, err := e.Client.Status(ctx, last.Run)
	if errors.Is(err, bus.ErrRunNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if rec.Finished() {
		return "", nil
	}
	return last.Run, nil
}
