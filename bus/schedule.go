package bus

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/cronspec"
)

// Schedules (since 1.10): runs submitted at a time, every interval or on
// a cron, kept by NATS itself. Invariants (docs/protocol.md §12):
//
//  1. A schedule is the newest message on <prefix>.schedule.<queue>.<name>.def
//     in AGENTS_SCHEDULES (a rollup per subject keeps only it). An active
//     one carries the Nats-Schedule headers, so the server fires it onto
//     <prefix>.schedule.<queue>.<name>.fire with its body (this definition);
//     a paused one carries none (the same rollup removed the server's
//     schedule); a deleted one is a tombstone (HeaderScheduleDeleted).
//  2. Only workers write AGENTS_SCHEDULES. A user asks a worker of the
//     queue (a request on <prefix>.schedop.<queue>.<name>.<op>,
//     scheduleops.go), which checks and writes it: the server lets a
//     message stored in the stream purge (Nats-Scheduler), replace
//     (Nats-Schedule-Target) or roll up (Nats-Rollup: all) any schedule of
//     the stream whoever publishes it, and permissions cannot refuse a
//     header. The queue is a subject token: a user allowed only
//     <prefix>.schedop.team-a.> schedules only onto team-a, and a worker
//     submits a fire only to the queue of its subject (and refuses a body
//     naming another).
//  3. A fire's run id is ScheduleRunID(queue, name, planned), where the
//     planned time comes from the spec and the fire alone (FirePlanned),
//     never from the worker's clock: every delivery of one fire, and every
//     worker, submits the same run id, which the work queue's dedupe
//     (Nats-Msg-Id) stores once.
//  4. Workers write <prefix>.schedule.<queue>.<name>.last (the newest run
//     a fire submitted) after the submit; the overlap policy reads it. It
//     only moves forward, by planned time (SetLastScheduleRun).

// Overlap policies: what a fire does while the schedule's previous run is
// still queued or running.
const (
	OverlapSkip  = "skip"  // the fire is skipped (the default)
	OverlapAllow = "allow" // the fire runs beside it
	OverlapAbort = "abort" // the previous run is aborted, the fire runs
)

// Catch-up policies: what fires found late (after an outage) do.
const (
	CatchUpOnce = "once" // the newest late fire runs, the older are skipped (the default)
	CatchUpNone = "none" // no late fire runs
)

// Headers of schedule messages.
const (
	// HeaderScheduleTrigger marks a fire a user asked for (trigger):
	// its value is the planned time, RFC 3339.
	HeaderScheduleTrigger = "Agentfleet-Schedule-Trigger"
	// HeaderScheduleDeleted marks the tombstone of a deleted schedule.
	HeaderScheduleDeleted = "Agentfleet-Schedule-Deleted"
	// HeaderScheduler is the server's mark on a message a schedule
	// fired: the schedule's subject. Clients cannot set it (but to purge
	// a schedule), so it tells a fire from a user's message, and a
	// message some schedule fired onto a .def or .last (any schedule may
	// target any subject of the stream) from the one a user or worker
	// wrote: readers ignore those.
	HeaderScheduler = "Nats-Scheduler"
)

// Metadata keys a fire's run carries (reserved: a schedule's request may
// not set them).
const (
	MetaSchedule     = "schedule"     // the schedule's name
	MetaScheduledFor = "scheduledFor" // the fire's planned time, RFC 3339
)

// FireTTL is how long a fire message is kept (Nats-Schedule-TTL): workers
// take it within seconds; the rest is a short history of what fired.
const FireTTL = time.Hour

// ScheduleOutageGap is how much later than its previous fire named a
// server fire may be stored and still be the next fire in turn: a later
// one is the server's one fire for what it missed while down, late for
// the catch-up policy (worker/internal/schedule, invariant 9; for @every
// also at least one interval later). The server
// stores a fire within milliseconds of its time; a restart takes longer.
const ScheduleOutageGap = 2 * time.Second

// MaxFiresKept bounds the messages kept per subject of AGENTS_SCHEDULES:
// each fire copies the definition (up to MaxScheduleBytes) for FireTTL, so
// an @every 1s schedule would keep 3,600; catch-up needs only the newest.
// Defs and .last keep one each (rollup) whatever it is.
const MaxFiresKept = 100

// MaxScheduleBytes bounds a schedule's definition (its request included).
const MaxScheduleBytes = MaxRequestBytes + 16<<10

// Schedule is a schedule's definition, the body of its def message and of
// each of its fires.
type Schedule struct {
	Name  string `json:"name"`
	Queue string `json:"queue"`
	// Exactly one of Cron, Every, At.
	Cron     string     `json:"cron,omitempty"`     // six fields, seconds first
	TimeZone string     `json:"timeZone,omitempty"` // IANA zone, cron only
	Every    string     `json:"every,omitempty"`    // Go duration, whole seconds, at least 1s
	At       *time.Time `json:"at,omitempty"`
	Overlap  string     `json:"overlap,omitempty"` // skip (default), allow, abort
	CatchUp  string     `json:"catchUp,omitempty"` // once (default), none
	Paused   bool       `json:"paused,omitempty"`
	// Request is the run request each fire submits (without id).
	Request   json.RawMessage `json:"request"`
	CreatedAt time.Time       `json:"createdAt"`
	UpdatedAt time.Time       `json:"updatedAt,omitzero"`
}

// Pattern is the schedule's Nats-Schedule value.
func (s *Schedule) Pattern() string {
	switch {
	case s.Every != "":
		return "@every " + s.Every
	case s.At != nil:
		return "@at " + s.At.UTC().Format(time.RFC3339)
	}
	return s.Cron
}

// OverlapPolicy is Overlap with its default.
func (s *Schedule) OverlapPolicy() string { return cmp(s.Overlap, OverlapSkip) }

// CatchUpPolicy is CatchUp with its default.
func (s *Schedule) CatchUpPolicy() string { return cmp(s.CatchUp, CatchUpOnce) }

func cmp(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// Validate lists every problem of the definition.
func (s *Schedule) Validate() error {
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	if !ValidID(s.Name) {
		add("schedule name %q must match [A-Za-z0-9_-]{1,64}", truncate(s.Name, 80))
	}
	if !ValidQueue(s.Queue) {
		add("queue %q must match [A-Za-z0-9_-]{1,64}", truncate(s.Queue, 80))
	}
	n := 0
	for _, set := range []bool{s.Cron != "", s.Every != "", s.At != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		add("give exactly one of cron, every and at (got %d)", n)
	}
	if s.Every != "" {
		d, err := time.ParseDuration(s.Every)
		switch {
		case err != nil:
			add("every %q is not a duration (e.g. 90s, 1h)", truncate(s.Every, 40))
		case d < time.Second || d%time.Second != 0:
			add("every %s must be whole seconds, at least 1s", d)
		}
	}
	if s.Cron != "" {
		if err := cronspec.Check(s.Cron); err != nil {
			add("cron %q: %v (six fields: second minute hour day-of-month month day-of-week)", truncate(s.Cron, 80), err)
		}
	}
	if s.TimeZone != "" {
		if s.Cron == "" {
			add("a time zone applies only to a cron schedule: the server refuses one with @every and @at (those are absolute)")
		} else if s.TimeZone == "Local" {
			// Each worker's and the server's own zone: fires and planned
			// times would disagree between machines.
			add("time zone Local is each machine's own: name an IANA zone such as Europe/Berlin (or UTC)")
		} else if _, err := time.LoadLocation(s.TimeZone); err != nil {
			add("time zone %q is not known (an IANA name such as Europe/Berlin)", truncate(s.TimeZone, 64))
		}
	}
	if !slices.Contains([]string{"", OverlapSkip, OverlapAllow, OverlapAbort}, s.Overlap) {
		add("overlap %q: use skip, allow or abort", truncate(s.Overlap, 40))
	}
	if !slices.Contains([]string{"", CatchUpOnce, CatchUpNone}, s.CatchUp) {
		add("catchUp %q: use once or none", truncate(s.CatchUp, 40))
	}
	if len(s.Request) == 0 {
		add("request is missing")
	} else {
		var raw struct {
			ID       string            `json:"id"`
			Metadata map[string]string `json:"metadata"`
		}
		_ = json.Unmarshal(s.Request, &raw)
		if raw.ID != "" {
			add("request.id must be empty: each fire gets its own run id")
		}
		for _, k := range []string{MetaSchedule, MetaScheduledFor} {
			if _, ok := raw.Metadata[k]; ok {
				add("request.metadata %q is set by each fire", k)
			}
		}
		if len(raw.Metadata) > MaxMetadata-2 {
			add("request.metadata has %d entries; a fire adds 2, the limit is %d", len(raw.Metadata), MaxMetadata)
		}
		// A stand-in for the fires' ids (the id's own problem is above).
		stand := "schedule-fire"
		if ValidID(raw.ID) {
			stand = raw.ID
		}
		if _, err := DecodeRunRequest(s.Request, stand); err != nil {
			var re *RequestError
			if errors.As(err, &re) {
				for _, q := range re.Problems {
					add("request: %s", q)
				}
			} else {
				add("request: %v", err)
			}
		}
	}
	if len(p) > 0 {
		return &RequestError{Problems: p}
	}
	return nil
}

// location is the cron's time zone (nil: UTC).
func (s *Schedule) location() *time.Location {
	if s.TimeZone == "" {
		return nil
	}
	loc, err := time.LoadLocation(s.TimeZone)
	if err != nil {
		return nil
	}
	return loc
}

// NextAfter is the schedule's first fire time after t, as the server
// computes it (@every is anchored at updated, the def's store time); zero
// when it fires no more.
func (s *Schedule) NextAfter(t, updated time.Time) time.Time {
	switch {
	case s.At != nil:
		if s.At.After(t) {
			return *s.At
		}
		return time.Time{}
	case s.Every != "":
		d, err := time.ParseDuration(s.Every)
		if err != nil || d <= 0 {
			return time.Time{}
		}
		base := updated.UTC().Round(time.Second).Add(d)
		if !base.After(t) {
			base = base.Add(d * (t.Sub(base)/d + 1))
		}
		return base
	}
	n, err := cronspec.Next(s.Cron, s.location(), t)
	if err != nil {
		return time.Time{}
	}
	return n
}

// FirePlanned is a fire's planned time and whether a user triggered it,
// from the spec and the fire alone (invariant 3): a trigger's header; @at
// its time; @every the Nats-Schedule-Next header the server sets, less
// one interval; a cron its latest time at or before the fire was stored.
func (s *Schedule) FirePlanned(h nats.Header, stored time.Time) (planned time.Time, trigger bool, err error) {
	if v := h.Get(HeaderScheduleTrigger); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return time.Time{}, true, fmt.Errorf("trigger time %q: %w", truncate(v, 40), err)
		}
		return t.UTC(), true, nil
	}
	switch {
	case s.At != nil:
		return s.At.UTC(), false, nil
	case s.Every != "":
		d, err := time.ParseDuration(s.Every)
		if err != nil {
			return time.Time{}, false, err
		}
		next, err := time.Parse(time.RFC3339Nano, h.Get("Nats-Schedule-Next"))
		if err != nil {
			// Not the server's fire: the stored second stands in.
			return stored.UTC().Truncate(time.Second), false, nil
		}
		return next.Add(-d).UTC(), false, nil
	}
	p, err := cronspec.Prev(s.Cron, s.location(), stored)
	return p.UTC(), false, err
}

// ScheduleRunID is the run id of a schedule's fire planned at planned: a
// hash, so every delivery of the fire names the same run (invariant 3).
// A trigger's fires are hashed apart from the schedule's own.
func ScheduleRunID(queue, name string, planned time.Time, trigger bool) string {
	kind := "fire"
	if trigger {
		kind = "trigger"
	}
	sum := sha256.Sum256([]byte(queue + "\x00" + name + "\x00" + kind + "\x00" + planned.UTC().Format(time.RFC3339Nano)))
	return "sch-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
}

// ScheduleLast is the body of <prefix>.schedule.<queue>.<name>.last.
type ScheduleLast struct {
	Run       string    `json:"run"`
	PlannedAt time.Time `json:"plannedAt"`
	FiredAt   time.Time `json:"firedAt"`
	Trigger   bool      `json:"trigger,omitempty"`
	// FireSeq is the stream sequence of the fire that submitted Run: the
	// next fire's look back for an outage starts there (since 1.10).
	FireSeq uint64 `json:"fireSeq,omitempty"`
}

// ScheduleInfo is a stored schedule, as ListSchedules returns it.
type ScheduleInfo struct {
	Schedule
	// Seq is its def message's stream sequence; StoredAt its store time.
	Seq      uint64    `json:"seq"`
	StoredAt time.Time `json:"storedAt"`
	// Next is the next fire time (zero: paused, or an @at in the past).
	Next time.Time `json:"next,omitzero"`
	// Last is the newest run a fire submitted, if any.
	Last *ScheduleLast `json:"last,omitempty"`
}

// ErrScheduleNotFound: no schedule has the name.
var ErrScheduleNotFound = errors.New("schedule not found")

// ErrScheduleExists: create found a schedule with the name.
var ErrScheduleExists = errors.New("schedule exists")

func (c *Client) scheduleMsg(s *Schedule) (*nats.Msg, error) {
	body, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	if len(body) > MaxScheduleBytes {
		return nil, fmt.Errorf("schedule %s: %d bytes, the limit is %d", s.Name, len(body), MaxScheduleBytes)
	}
	m := &nats.Msg{Subject: c.names.ScheduleDef(s.Queue, s.Name), Data: body, Header: nats.Header{}}
	// The rollup keeps only this message: a paused schedule's plain
	// message removes the server's schedule (invariant 1).
	m.Header.Set(nats.MsgRollup, nats.MsgRollupSubject)
	if !s.Paused {
		m.Header.Set("Nats-Schedule", s.Pattern())
		m.Header.Set("Nats-Schedule-Target", c.names.ScheduleFire(s.Queue, s.Name))
		m.Header.Set("Nats-Schedule-TTL", FireTTL.String())
		if s.Cron != "" && s.TimeZone != "" {
			m.Header.Set("Nats-Schedule-Time-Zone", s.TimeZone)
		}
	}
	return m, nil
}

// storeSchedule stores a new schedule; with replace it may replace one of
// the same name and queue (workers: ApplyScheduleOp).
func (c *Client) storeSchedule(ctx context.Context, s *Schedule, replace bool) (uint64, error) {
	if s.CreatedAt.IsZero() {
		s.CreatedAt = time.Now().UTC().Truncate(time.Millisecond)
	}
	if err := s.Validate(); err != nil {
		return 0, err
	}
	// The write expects the subject's last sequence as read (a tombstone's,
	// or none): of two creates, one fails rather than one replacing the
	// other.
	var seq uint64
	if st, err := c.Stream(ctx, c.names.SchedulesStream()); err != nil {
		return 0, err
	} else if m, err := st.GetLastMsgForSubject(ctx, c.names.ScheduleDef(s.Queue, s.Name)); err == nil {
		seq = m.Sequence
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, err
	}
	opts := []jetstream.PublishOpt{jetstream.WithExpectLastSequencePerSubject(seq)}
	if cur, err := c.findSchedule(ctx, s.Name); err == nil {
		if !replace {
			return 0, fmt.Errorf("%w: %s (on queue %s); replace it with --replace, or delete it first", ErrScheduleExists, s.Name, cur.Queue)
		}
		if cur.Queue != s.Queue {
			return 0, fmt.Errorf("%w: %s is on queue %s: delete it to move it to %s", ErrScheduleExists, s.Name, cur.Queue, s.Queue)
		}
		s.CreatedAt = cur.CreatedAt
		s.UpdatedAt = time.Now().UTC().Truncate(time.Millisecond)
		opts = []jetstream.PublishOpt{jetstream.WithExpectLastSequencePerSubject(cur.Seq)}
	} else if !errors.Is(err, ErrScheduleNotFound) {
		return 0, err
	}
	return c.publishSchedule(ctx, s, opts...)
}

func (c *Client) publishSchedule(ctx context.Context, s *Schedule, opts ...jetstream.PublishOpt) (uint64, error) {
	m, err := c.scheduleMsg(s)
	if err != nil {
		return 0, err
	}
	ack, err := c.js.PublishMsg(ctx, m, append(opts, jetstream.WithExpectStream(c.names.SchedulesStream()))...)
	if err != nil {
		return 0, fmt.Errorf("schedule %s: %w", s.Name, err)
	}
	return ack.Sequence, nil
}

// setPaused keeps the definition without the server's schedule, so
// nothing fires, or puts it back (workers: ApplyScheduleOp).
func (c *Client) setPaused(ctx context.Context, queue, name string, paused bool) error {
	cur, err := c.ScheduleOn(ctx, queue, name)
	if err != nil {
		return err
	}
	if cur.Paused == paused {
		return nil
	}
	s := cur.Schedule
	s.Paused = paused
	s.UpdatedAt = time.Now().UTC().Truncate(time.Millisecond)
	_, err = c.publishSchedule(ctx, &s, jetstream.WithExpectLastSequencePerSubject(cur.Seq))
	return err
}

// deleteSchedule removes a schedule (a tombstone replaces it); its runs
// are left alone (workers: ApplyScheduleOp).
func (c *Client) deleteSchedule(ctx context.Context, queue, name string) error {
	cur, err := c.ScheduleOn(ctx, queue, name)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: c.names.ScheduleDef(cur.Queue, name), Header: nats.Header{}}
	m.Header.Set(nats.MsgRollup, nats.MsgRollupSubject)
	m.Header.Set(HeaderScheduleDeleted, "true")
	if _, err := c.js.PublishMsg(ctx, m, jetstream.WithExpectStream(c.names.SchedulesStream()),
		jetstream.WithExpectLastSequencePerSubject(cur.Seq)); err != nil {
		return fmt.Errorf("schedule %s: %w", name, err)
	}
	return nil
}

// triggerSchedule fires a schedule now, paused or not; it returns the run
// id the fire submits (workers: ApplyScheduleOp).
func (c *Client) triggerSchedule(ctx context.Context, queue, name string) (string, error) {
	cur, err := c.ScheduleOn(ctx, queue, name)
	if err != nil {
		return "", err
	}
	now := time.Now().UTC()
	body, err := json.Marshal(&cur.Schedule)
	if err != nil {
		return "", err
	}
	m := &nats.Msg{Subject: c.names.ScheduleFire(cur.Queue, name), Data: body, Header: nats.Header{}}
	m.Header.Set(HeaderScheduleTrigger, now.Format(time.RFC3339Nano))
	id := ScheduleRunID(cur.Queue, name, now, true)
	if _, err := c.js.PublishMsg(ctx, m, jetstream.WithExpectStream(c.names.SchedulesStream()), jetstream.WithMsgID(id),
		jetstream.WithMsgTTL(FireTTL)); err != nil {
		return "", fmt.Errorf("schedule %s: %w", name, err)
	}
	return id, nil
}

// GetSchedule returns a schedule with its next fire and last run.
func (c *Client) GetSchedule(ctx context.Context, name string) (*ScheduleInfo, error) {
	info, err := c.findSchedule(ctx, name)
	if err != nil {
		return nil, err
	}
	c.fillSchedule(ctx, info)
	return info, nil
}

// ListSchedules returns every schedule, by name.
func (c *Client) ListSchedules(ctx context.Context) ([]ScheduleInfo, error) {
	s, err := c.js.Stream(ctx, c.names.SchedulesStream())
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", c.names.SchedulesStream(), err)
	}
	si, err := s.Info(ctx, jetstream.WithSubjectFilter(c.names.ScheduleDefs()))
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", c.names.SchedulesStream(), err)
	}
	out := []ScheduleInfo{}
	for subj := range si.State.Subjects {
		info, err := c.readSchedule(ctx, s, subj)
		if errors.Is(err, ErrScheduleNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		c.fillSchedule(ctx, info)
		out = append(out, *info)
	}
	slices.SortFunc(out, func(a, b ScheduleInfo) int { return strings.Compare(a.Name+"\x00"+a.Queue, b.Name+"\x00"+b.Queue) })
	return out, nil
}

func (c *Client) fillSchedule(ctx context.Context, info *ScheduleInfo) {
	now := time.Now()
	if !info.Paused {
		info.Next = info.NextAfter(now, info.StoredAt)
		// The server's own word, when its newest fire has one: it
		// re-anchors an @every schedule after a restart.
		if s, err := c.Stream(ctx, c.names.SchedulesStream()); err == nil && info.At == nil {
			if m, err := s.GetLastMsgForSubject(ctx, c.names.ScheduleFire(info.Queue, info.Name)); err == nil && m.Sequence > info.Seq {
				if next, err := time.Parse(time.RFC3339Nano, m.Header.Get("Nats-Schedule-Next")); err == nil && next.After(now) {
					info.Next = next
				}
			}
		}
	}
	info.Last, _ = c.LastScheduleRun(ctx, info.Queue, info.Name)
}

// LastScheduleRun reads the newest run a fire of the schedule submitted
// (nil, nil: none).
func (c *Client) LastScheduleRun(ctx context.Context, queue, name string) (*ScheduleLast, error) {
	s, err := c.Stream(ctx, c.names.SchedulesStream())
	if err != nil {
		return nil, err
	}
	m, err := s.GetLastMsgForSubject(ctx, c.names.ScheduleLast(queue, name))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var l ScheduleLast
	if m.Header.Get(HeaderScheduler) != "" { // fired there by a schedule, not a worker's
		return nil, nil
	}
	if err := json.Unmarshal(m.Data, &l); err != nil || !ValidID(l.Run) {
		return nil, nil
	}
	return &l, nil
}

// SetLastScheduleRun records the newest run of a schedule (workers). It
// only moves forward (invariant 4): a fire retried after a newer one ran
// leaves that newer one; the write expects the sequence it read, so two
// workers' writes cannot cross.
func (c *Client) SetLastScheduleRun(ctx context.Context, queue, name string, l ScheduleLast) error {
	body, err := json.Marshal(l)
	if err != nil {
		return err
	}
	st, err := c.Stream(ctx, c.names.SchedulesStream())
	if err != nil {
		return err
	}
	subj := c.names.ScheduleLast(queue, name)
	for range 5 {
		var seq uint64
		cur, err := st.GetLastMsgForSubject(ctx, subj)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return err
		default:
			seq = cur.Sequence
			var have ScheduleLast
			if cur.Header.Get(HeaderScheduler) == "" && json.Unmarshal(cur.Data, &have) == nil &&
				(have.Run == l.Run || have.PlannedAt.After(l.PlannedAt)) {
				return nil // already there, or a newer fire's
			}
		}
		m := &nats.Msg{Subject: subj, Data: body, Header: nats.Header{}}
		m.Header.Set(nats.MsgRollup, nats.MsgRollupSubject)
		_, err = c.js.PublishMsg(ctx, m, jetstream.WithExpectStream(c.names.SchedulesStream()),
			jetstream.WithExpectLastSequencePerSubject(seq))
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			continue // another worker wrote: read again
		}
		return err
	}
	return fmt.Errorf("schedule %s: last run: the writes of other workers kept crossing", name)
}

// ScheduleOn reads the schedule of a queue and name as it is stored now.
func (c *Client) ScheduleOn(ctx context.Context, queue, name string) (*ScheduleInfo, error) {
	if !ValidQueue(queue) || !ValidID(name) {
		return nil, fmt.Errorf("%w: %s on queue %s", ErrScheduleNotFound, truncate(name, 80), truncate(queue, 80))
	}
	s, err := c.Stream(ctx, c.names.SchedulesStream())
	if err != nil {
		return nil, err
	}
	return c.readSchedule(ctx, s, c.names.ScheduleDef(queue, name))
}

// SameDefinition reports whether a fire's body is the definition info
// holds (a pause, resume or replace writes a new one).
func (s *Schedule) SameDefinition(info *ScheduleInfo) bool {
	return s.CreatedAt.Equal(info.CreatedAt) && s.UpdatedAt.Equal(info.UpdatedAt) && s.Pattern() == info.Pattern()
}

// findSchedule reads the schedule named name, on whichever queue.
func (c *Client) findSchedule(ctx context.Context, name string) (*ScheduleInfo, error) {
	if !ValidID(name) {
		return nil, fmt.Errorf("invalid schedule name %q: it must match [A-Za-z0-9_-]{1,64}", truncate(name, 80))
	}
	s, err := c.Stream(ctx, c.names.SchedulesStream())
	if err != nil {
		return nil, err
	}
	// Each queue's def subject on its own: the newest message of the
	// wildcard would let another queue's schedule of the name shadow this.
	si, err := s.Info(ctx, jetstream.WithSubjectFilter(c.names.ScheduleDef("*", name)))
	if err != nil {
		return nil, err
	}
	var found []*ScheduleInfo
	var queues []string
	for subj := range si.State.Subjects {
		info, err := c.readSchedule(ctx, s, subj)
		if errors.Is(err, ErrScheduleNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		found = append(found, info)
		queues = append(queues, info.Queue)
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("%w: %s", ErrScheduleNotFound, name)
	case 1:
		return found[0], nil
	}
	slices.Sort(queues)
	return nil, fmt.Errorf("%w: schedule %s is on queues %s; delete all but one", ErrScheduleAmbiguous, name, strings.Join(queues, ", "))
}

// ErrScheduleAmbiguous: a name is on several queues (written around
// CreateSchedule, which refuses that).
var ErrScheduleAmbiguous = errors.New("schedule name on several queues")

func (c *Client) readSchedule(ctx context.Context, s jetstream.Stream, subject string) (*ScheduleInfo, error) {
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrScheduleNotFound, scheduleNameOf(subject))
	}
	if err != nil {
		return nil, err
	}
	if m.Header.Get(HeaderScheduleDeleted) != "" {
		return nil, fmt.Errorf("%w: %s", ErrScheduleNotFound, scheduleNameOf(subject))
	}
	if by := m.Header.Get(HeaderScheduler); by != "" {
		return nil, fmt.Errorf("%w: %s (its definition was replaced by a fire of %s: create it again)", ErrScheduleNotFound, scheduleNameOf(subject), by)
	}
	info := &ScheduleInfo{Seq: m.Sequence, StoredAt: m.Time}
	dec := json.NewDecoder(bytes.NewReader(m.Data))
	if err := dec.Decode(&info.Schedule); err != nil {
		return nil, fmt.Errorf("schedule at %s: %w", subject, err)
	}
	// The subject is what permissions checked: a body naming another
	// queue or name is not this subject's schedule.
	if q, n, _, err := c.names.ParseScheduleSubject(m.Subject); err != nil || q != info.Queue || n != info.Name {
		return nil, fmt.Errorf("%w: %s (the message there names %s on queue %s)", ErrScheduleNotFound, scheduleNameOf(m.Subject), truncate(info.Name, 80), truncate(info.Queue, 80))
	}
	return info, nil
}

func scheduleNameOf(subject string) string {
	t := strings.Split(subject, ".")
	if len(t) < 3 {
		return subject
	}
	return t[len(t)-2]
}

// ParseScheduleSubject splits a def, fire or last subject into queue,
// name and kind (def, fire, last).
func (n Names) ParseScheduleSubject(subject string) (queue, name, kind string, err error) {
	rest, ok := strings.CutPrefix(subject, n.prefix+".schedule.")
	t := strings.Split(rest, ".")
	if !ok || len(t) != 3 || !ValidQueue(t[0]) || !ValidID(t[1]) || !slices.Contains([]string{"def", "fire", "last"}, t[2]) {
		return "", "", "", fmt.Errorf("subject %q is not %s.schedule.<queue>.<name>.<def|fire|last>", truncate(subject, 120), n.prefix)
	}
	return t[0], t[1], t[2], nil
}

// schedulesStreamConfig is AGENTS_SCHEDULES (since 1.10). Schedules need
// the stream to allow them, and such a stream can be neither DiscardNew
// nor sourced: AGENTS_RUNS cannot hold them, so a worker turns each fire
// into a request (worker/internal/schedule). No max age: a schedule lives
// until deleted; fires expire by their TTL (FireTTL).
func schedulesStreamConfig(n Names, cfg StreamsConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              n.SchedulesStream(),
		Description:       "agentfleet schedules (message schedules), their fires and last runs",
		Subjects:          []string{n.ScheduleDefs(), n.ScheduleFires(), n.ScheduleLast("*", "*")},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		AllowMsgSchedules: true,
		AllowRollup:       true,
		AllowMsgTTL:       true,
		MaxMsgsPerSubject: MaxFiresKept,
		MaxMsgSize:        MaxScheduleBytes + 16<<10,
		Duplicates:        2 * time.Minute,
		Storage:           cfg.Storage,
		Replicas:          cfg.Replicas,
	}
}

// schedulesConsumerConfig is the durable consumer of fires that every
// worker pulls: no worker is the scheduler.
func schedulesConsumerConfig(n Names, replicas int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       n.FiresConsumer(),
		Description:   "agentfleet workers turning schedule fires into run requests",
		FilterSubject: n.ScheduleFires(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		// Fires stored before the consumer existed are not run.
		DeliverPolicy: jetstream.DeliverNewPolicy,
		AckWait:       30 * time.Second,
		// A fire failing at each delivery (backing off to a minute) is
		// given up by the worker at its last (counted failed), about
		// 15 min after its first.
		MaxDeliver:    FireMaxDeliver,
		MaxAckPending: 1000,
		Replicas:      replicas,
	}
}

// FireMaxDeliver is the fires consumer's MaxDeliver.
const FireMaxDeliver = 20
