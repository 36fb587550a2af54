package bus

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// DefaultPrefix is the subject prefix of the protocol.
const DefaultPrefix = "agents"

// DefaultQueue is the queue of a request that names none.
const DefaultQueue = "default"

// Control kinds: the last token of a control subject.
const (
	KindSteer    = "steer"
	KindFollowUp = "followup"
	KindAbort    = "abort"
	// KindApprove answers a gated tool call (since 1.3): body Approval.
	KindApprove = "approve"
	// KindCompact compacts the run's context now (since 1.10): body
	// Control, its Text the summary's instructions.
	KindCompact = "compact"
)

var tokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidID reports whether s may be a run id: [A-Za-z0-9_-]{1,64}. A run id
// becomes a subject token, so this is also the guard against subject
// injection (no '.', '*', '>' or spaces).
func ValidID(s string) bool { return tokenRE.MatchString(s) }

// ValidQueue reports whether s may be a queue name (same rule as ids).
func ValidQueue(s string) bool { return tokenRE.MatchString(s) }

// CheckID returns a readable error for an invalid run id.
func CheckID(s string) error {
	if !ValidID(s) {
		return fmt.Errorf("invalid run id %q: it must match [A-Za-z0-9_-]{1,64}", truncate(s, 80))
	}
	return nil
}

// CheckQueue returns a readable error for an invalid queue name.
func CheckQueue(s string) error {
	if !ValidQueue(s) {
		return fmt.Errorf("invalid queue name %q: it must match [A-Za-z0-9_-]{1,64}", truncate(s, 80))
	}
	return nil
}

// Names derives every subject and JetStream name from a prefix. The zero
// value is not usable; use NewNames.
type Names struct {
	prefix string // subject prefix, e.g. "agents"
	upper  string // stream name prefix, e.g. "AGENTS"
	lower  string // bucket prefix, e.g. "agents"
}

// NewNames checks the prefix (one or more dot-separated tokens of
// [A-Za-z0-9_-]) and returns its names. "" means DefaultPrefix.
func NewNames(prefix string) (Names, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	for _, tok := range strings.Split(prefix, ".") {
		if !tokenRE.MatchString(tok) {
			return Names{}, fmt.Errorf("invalid subject prefix %q: use dot-separated tokens of [A-Za-z0-9_-]", prefix)
		}
	}
	flat := strings.ReplaceAll(prefix, ".", "_")
	return Names{prefix: prefix, upper: strings.ToUpper(flat), lower: flat}, nil
}

// MustNames is NewNames that panics; for constant prefixes.
func MustNames(prefix string) Names {
	n, err := NewNames(prefix)
	if err != nil {
		panic(err)
	}
	return n
}

// Prefix returns the subject prefix.
func (n Names) Prefix() string { return n.prefix }

// RunsStream is the work-queue stream of run requests (AGENTS_RUNS).
func (n Names) RunsStream() string { return n.upper + "_RUNS" }

// EventsStream is the stream of run events (AGENTS_EVENTS).
func (n Names) EventsStream() string { return n.upper + "_EVENTS" }

// ControlStream is the stream of control messages (AGENTS_CONTROL).
func (n Names) ControlStream() string { return n.upper + "_CONTROL" }

// RecordsBucket is the KV bucket of run records (agents_runs).
func (n Names) RecordsBucket() string { return n.lower + "_runs" }

// TranscriptsBucket is the object store of finished runs' transcripts
// (agents_transcripts, since 1.9): one object per run, named by its id.
func (n Names) TranscriptsBucket() string { return n.lower + "_transcripts" }

// DeadStream keeps dead-lettered requests (AGENTS_DEAD).
func (n Names) DeadStream() string { return n.upper + "_DEAD" }

// Dead is the dead-letter subject of a request that was given up:
// <prefix>.dead.<queue>.<run>.
func (n Names) Dead(queue, run string) string { return n.prefix + ".dead." + queue + "." + run }

// DeadAll matches every dead-letter subject: <prefix>.dead.*.*.
func (n Names) DeadAll() string { return n.prefix + ".dead.*.*" }

// AdvisoriesStream captures the MAX_DELIVERIES advisories of the request
// consumers (AGENTS_ADVISORIES), so giving up survives any one worker.
func (n Names) AdvisoriesStream() string { return n.upper + "_ADVISORIES" }

// MaxDeliveriesAdvisories is the subject of the server's advisories for
// requests that reached MaxDeliver on any queue consumer.
func (n Names) MaxDeliveriesAdvisories() string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + n.RunsStream() + ".*"
}

// GiveUpConsumer is the durable consumer of AGENTS_ADVISORIES that workers
// share.
func (n Names) GiveUpConsumer() string { return "giveup" }

// ParkedStream keeps a copy of each parked run's request (AGENTS_PARKED,
// since 1.9) for its wake, and the timers of parked approvals.
func (n Names) ParkedStream() string { return n.upper + "_PARKED" }

// Parked is the subject of a parked run's request copy:
// <prefix>.parked.<queue>.<run> (the newest per subject is kept).
func (n Names) Parked(queue, run string) string { return n.prefix + ".parked." + queue + "." + run }

// ParkedAll matches every parked request copy: <prefix>.parked.*.*.
func (n Names) ParkedAll() string { return n.prefix + ".parked.*.*" }

// ParkTimer is the subject of a parked run's timer, a message schedule
// (@at the expiry of its first pending approval): <prefix>.parktimer.<run>.at.
func (n Names) ParkTimer(run string) string { return n.prefix + ".parktimer." + run + ".at" }

// ParkTimerDue is where the server publishes a parked run's timer when it
// is due: <prefix>.parktimer.<run>.due.
func (n Names) ParkTimerDue(run string) string { return n.prefix + ".parktimer." + run + ".due" }

// ParkTimersAll matches the timers' subjects: <prefix>.parktimer.*.*.
func (n Names) ParkTimersAll() string { return n.prefix + ".parktimer.*.*" }

// TimersConsumer is the durable consumer of due timers of parked runs
// (AGENTS_PARKED) that workers share.
func (n Names) TimersConsumer() string { return "waketimers" }

// WakeConsumer is the durable consumer of AGENTS_CONTROL's approve and
// abort messages that workers share to wake parked runs.
func (n Names) WakeConsumer() string { return "wake" }

// Consumer is the durable consumer of a queue (workers-<queue>).
func (n Names) Consumer(queue string) string { return "workers-" + queue }

// Submit is the subject of a run request: <prefix>.submit.<queue>.<run>.
func (n Names) Submit(queue, run string) string { return n.prefix + ".submit." + queue + "." + run }

// SubmitFilter matches a queue's requests: <prefix>.submit.<queue>.*, the
// subject AGENTS_RUNS takes for a declared queue.
func (n Names) SubmitFilter(queue string) string { return n.prefix + ".submit." + queue + ".*" }

// QueueFilter is the filter of a queue's consumer (since 1.8):
// <prefix>.submit.<queue>.>. It delivers every message the stream stores
// for the queue. A client may publish a literal '*' or '>' token (only a
// pedantic connection is refused), and the stream's subject
// <prefix>.submit.<queue>.* takes it like any token; but a stored literal
// '>' matches only a filter with '>' at or before its place (nats-server
// isSubsetMatchTokenized), so the former filter SubmitFilter passed such a
// request over, and a work queue keeps what no consumer acks.
func (n Names) QueueFilter(queue string) string { return n.prefix + ".submit." + queue + ".>" }

// SubmitAll matches every request subject: <prefix>.submit.*.*.
func (n Names) SubmitAll() string { return n.prefix + ".submit.*.*" }

// Events is the subject of a run's events: <prefix>.run.<run>.events.
func (n Names) Events(run string) string { return n.prefix + ".run." + run + ".events" }

// EventBatches is where workers send the commits of their event batches
// (fast batch publishing into AGENTS_EVENTS): <prefix>.eventbatch. A commit
// is never stored, and no reader of a run's events sees it.
func (n Names) EventBatches() string { return n.prefix + ".eventbatch" }

// Control is a control subject: <prefix>.run.<run>.<kind>.
func (n Names) Control(run, kind string) string { return n.prefix + ".run." + run + "." + kind }

// ControlAll matches every control message of a run: <prefix>.run.<run>.*
// (in AGENTS_CONTROL only control subjects exist).
func (n Names) ControlAll(run string) string { return n.prefix + ".run." + run + ".*" }

// Republished is the wildcard on which AGENTS_CONTROL republishes each stored
// control message, with its stream sequence in the Nats-Sequence header:
// <prefix>.ctl.<run>.<kind>. Workers subscribe to it.
func (n Names) Republished() string { return n.prefix + ".ctl.*.*" }

// ChildDone is the subject of the notice that child, a child run of
// parent, finished (core NATS, since 1.10; worker/childwait.go).
func (n Names) ChildDone(parent, child string) string {
	return n.prefix + ".childdone." + parent + "." + child
}

// ChildDoneAll matches every finished-child notice.
func (n Names) ChildDoneAll() string { return n.prefix + ".childdone.*.*" }

// Record is the KV subject of a run record ($KV.<bucket>.<run>).
func (n Names) Record(run string) string { return "$KV." + n.RecordsBucket() + "." + run }

// ParseSubmit splits a request subject, old (<prefix>.submit.<queue>.<run>)
// or, since 1.10, a lane's (ParseRequest), into queue and run. It fails when
// the subject is not a request subject or a token is not valid.
func (n Names) ParseSubmit(subject string) (queue, run string, err error) {
	l, run, err := n.ParseRequest(subject)
	return l.Queue, run, err
}

func (n Names) parseOldSubmit(subject string) (queue, run string, err error) {
	rest, ok := strings.CutPrefix(subject, n.prefix+".submit.")
	if !ok {
		return "", "", fmt.Errorf("subject %q is not a run request subject", truncate(subject, 120))
	}
	queue, run, ok = strings.Cut(rest, ".")
	if !ok || strings.Contains(run, ".") {
		return "", "", fmt.Errorf("subject %q is not %s.submit.<queue>.<run>", truncate(subject, 120), n.prefix)
	}
	if err := CheckQueue(queue); err != nil {
		return queue, run, err
	}
	if err := CheckID(run); err != nil {
		return queue, run, err
	}
	return queue, run, nil
}

// ParseRepublished splits a republished control subject into run and kind.
func (n Names) ParseRepublished(subject string) (run, kind string, err error) {
	rest, ok := strings.CutPrefix(subject, n.prefix+".ctl.")
	if !ok {
		return "", "", errors.New("not a control subject")
	}
	run, kind, ok = strings.Cut(rest, ".")
	if !ok || !ValidID(run) {
		return "", "", errors.New("not a control subject")
	}
	switch kind {
	case KindSteer, KindFollowUp, KindAbort, KindApprove, KindCompact:
		return run, kind, nil
	}
	return "", "", errors.New("not a control subject")
}

// ParseControl splits a control subject (<prefix>.run.<run>.<kind>) into
// run and kind.
func (n Names) ParseControl(subject string) (run, kind string, err error) {
	rest, ok := strings.CutPrefix(subject, n.prefix+".run.")
	if !ok {
		return "", "", errors.New("not a control subject")
	}
	run, kind, ok = strings.Cut(rest, ".")
	if !ok || !ValidID(run) || strings.Contains(kind, ".") {
		return "", "", errors.New("not a control subject")
	}
	return run, kind, nil
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// SchedulesStream keeps schedules, their fires and last runs
// (AGENTS_SCHEDULES, since 1.10).
func (n Names) SchedulesStream() string { return n.upper + "_SCHEDULES" }

// ScheduleDef is the subject of a schedule's definition, the message the
// server fires: <prefix>.schedule.<queue>.<name>.def.
func (n Names) ScheduleDef(queue, name string) string {
	return n.prefix + ".schedule." + queue + "." + name + ".def"
}

// ScheduleFire is where a schedule's fires are published:
// <prefix>.schedule.<queue>.<name>.fire.
func (n Names) ScheduleFire(queue, name string) string {
	return n.prefix + ".schedule." + queue + "." + name + ".fire"
}

// ScheduleLast holds the newest run a schedule's fire submitted:
// <prefix>.schedule.<queue>.<name>.last.
func (n Names) ScheduleLast(queue, name string) string {
	return n.prefix + ".schedule." + queue + "." + name + ".last"
}

// ScheduleOp is the subject of a request asking a worker of the queue to
// write a schedule: <prefix>.schedop.<queue>.<name>.<op> (since 1.10; op
// create, replace, pause, resume, delete or trigger).
func (n Names) ScheduleOp(queue, name, op string) string {
	return n.prefix + ".schedop." + queue + "." + name + "." + op
}

// ParseScheduleOp splits a schedule operation's subject.
func (n Names) ParseScheduleOp(subject string) (queue, name, op string, ok bool) {
	rest, ok := strings.CutPrefix(subject, n.prefix+".schedop.")
	t := strings.Split(rest, ".")
	if !ok || len(t) != 3 {
		return "", "", "", false
	}
	return t[0], t[1], t[2], true
}

// ScheduleOps matches the schedule operations of a queue.
func (n Names) ScheduleOps(queue string) string { return n.ScheduleOp(queue, "*", "*") }

// ScheduleDefs matches every schedule definition.
func (n Names) ScheduleDefs() string { return n.ScheduleDef("*", "*") }

// ScheduleFires matches every fire.
func (n Names) ScheduleFires() string { return n.ScheduleFire("*", "*") }

// FiresConsumer is the durable consumer of AGENTS_SCHEDULES's fires that
// workers share.
func (n Names) FiresConsumer() string { return "schedulefires" }
