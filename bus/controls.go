package bus

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
)

// Control is the body of a control message: steer and followup take Text or
// Message (a pi user message); abort takes an optional Reason.
type Control struct {
	Text    string         `json:"text,omitempty"`
	Message *agent.Message `json:"message,omitempty"`
	Reason  string         `json:"reason,omitempty"`
}

// Steer sends a steering message to a run; it returns the control stream
// sequence. A finished run gives ErrRunFinished and nothing is sent.
func (c *Client) Steer(ctx context.Context, runID, text string) (uint64, error) {
	return c.SendControl(ctx, runID, KindSteer, Control{Text: text})
}

// FollowUp queues a follow-up message for a run.
func (c *Client) FollowUp(ctx context.Context, runID, text string) (uint64, error) {
	return c.SendControl(ctx, runID, KindFollowUp, Control{Text: text})
}

// Abort asks a run to stop.
func (c *Client) Abort(ctx context.Context, runID, reason string) (uint64, error) {
	return c.SendControl(ctx, runID, KindAbort, Control{Reason: reason})
}

// Compact asks a run to compact its context now (since 1.10);
// instructions, if any, focus the summary.
func (c *Client) Compact(ctx context.Context, runID, instructions string) (uint64, error) {
	return c.SendControl(ctx, runID, KindCompact, Control{Text: instructions})
}

// SteerMessage sends a full pi user message as steering.
func (c *Client) SteerMessage(ctx context.Context, runID string, m agent.Message) (uint64, error) {
	return c.SendControl(ctx, runID, KindSteer, Control{Message: &m})
}

// SendControl publishes a control message of a kind (steer, followup,
// abort) after checking the run has not finished. An approve carries an
// ApprovalAnswer, not a Control: see publishControl. A span in ctx travels
// with it (traceparent and tracestate headers).
func (c *Client) SendControl(ctx context.Context, runID, kind string, body Control, opts ...ControlOption) (uint64, error) {
	switch kind {
	case KindSteer, KindFollowUp, KindAbort, KindCompact:
	default:
		return 0, fmt.Errorf("unknown control kind %q", kind)
	}
	return c.publishControl(ctx, runID, kind, body, opts...)
}

// A ControlOption changes how SendControl publishes.
type ControlOption func(*controlOptions)

type controlOptions struct {
	id    string
	hasID bool
}

// HeaderAfterFinish marks a control message with an id that the Go
// client sent after its run had finished, so that a retry of it is
// refused too (ErrRunFinished) instead of answered with its sequence.
const HeaderAfterFinish = "Agentfleet-After-Finish"

// MaxControlIDBytes bounds WithControlID's id.
const MaxControlIDBytes = 128

// WithControlID makes retrying a control message safe. A publish whose
// ack is lost (a NATS restart) may have stored the message, and a retry
// would store, and deliver, a second copy. Messages to one run of one kind
// with the same id are stored once within the control stream's duplicate
// window (2 minutes by default): a retry returns the first copy's
// sequence, even once the run has finished (a new message to a finished
// run gets ErrRunFinished). The id names the message: a retry must carry
// the same body (another body with a used id is not stored). The id
// (1-128 bytes of letters, digits, '.', '_', ':' and '-') goes out as the
// Nats-Msg-Id "<run>:<kind>:<id>" (docs/protocol.md §6).
func WithControlID(id string) ControlOption {
	return func(o *controlOptions) { o.id, o.hasID = id, true }
}

// CheckControlID refuses a control id that is empty, long, or could break out of
// its header.
func CheckControlID(id string) error {
	ok := id != "" && len(id) <= MaxControlIDBytes
	for _, r := range id {
		ok = ok && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == ':' || r == '-')
	}
	if !ok {
		return fmt.Errorf("invalid control id %q: it must match [A-Za-z0-9._:-]{1,%d}", truncate(id, 80), MaxControlIDBytes)
	}
	return nil
}

// publishControl publishes any control body (a Control, an
// ApprovalAnswer) on the run's subject of kind, through JetStream, after
// checking the run has not finished; it returns the stream sequence.
func (c *Client) publishControl(ctx context.Context, runID, kind string, body any, opts ...ControlOption) (uint64, error) {
	if err := CheckID(runID); err != nil {
		return 0, err
	}
	var o controlOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.hasID {
		if err := CheckControlID(o.id); err != nil {
			return 0, err
		}
	}
	var finished error
	if rec, err := c.record(ctx, runID); err == nil && rec.Finished() {
		finished = fmt.Errorf("%w: run %s is %s", ErrRunFinished, runID, rec.State)
		if !o.hasID {
			return 0, finished
		}
		// A retry whose first copy was stored before the run finished
		// gets that copy's sequence: publish it, the stream tells.
	}
	data, err := agent.MarshalJSON(body)
	if err != nil {
		return 0, err
	}
	m := tracedMsg(ctx, c.names.Control(runID, kind), data)
	if o.hasID {
		if m.Header == nil {
			m.Header = nats.Header{}
		}
		m.Header.Set(jetstream.MsgIDHeader, runID+":"+kind+":"+o.id)
		if finished != nil {
			m.Header.Set(HeaderAfterFinish, "1")
		}
	}
	ack, err := c.js.PublishMsg(ctx, m, jetstream.WithExpectStream(c.names.ControlStream()))
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", kind, runID, err)
	}
	if finished == nil {
		return ack.Sequence, nil
	}
	if !ack.Duplicate {
		return 0, finished // stored now, it reached a finished run: ignored
	}
	// The first copy: taken if stored before the finish, ignored if it
	// was itself sent after it (it carries the mark).
	stream, err := c.js.Stream(ctx, c.names.ControlStream())
	var first *jetstream.RawStreamMsg
	if err == nil {
		first, err = stream.GetMsg(ctx, ack.Sequence)
	}
	if err != nil {
		return 0, fmt.Errorf("%s %s: reading the first copy: %w", kind, runID, err)
	}
	if first.Header.Get(HeaderAfterFinish) != "" {
		return 0, finished
	}
	return ack.Sequence, nil
}

// RunRecord is the value of a run's key in the KV bucket agents_runs.
type RunRecord struct {
	ID     string `json:"id"`
	Queue  string `json:"queue"`
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Attempt is the delivery count of the request being run.
	Attempt int    `json:"attempt"`
	Worker  string `json:"worker,omitempty"`
	// RequestSeq is the AGENTS_RUNS sequence of the request: a redelivery
	// has the same, a new request reusing the id has another.
	RequestSeq  uint64            `json:"requestSeq,omitempty"`
	SubmittedAt time.Time         `json:"submittedAt,omitzero"`
	StartedAt   time.Time         `json:"startedAt,omitzero"`
	FinishedAt  time.Time         `json:"finishedAt,omitzero"`
	HeartbeatAt time.Time         `json:"heartbeatAt,omitzero"`
	Model       string            `json:"model,omitempty"`
	Turns       int               `json:"turns"`
	Usage       agent.Usage       `json:"usage"`
	Cost        float64           `json:"cost"`
	Error       string            `json:"error,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	// Title names the run in listings (since 1.8): its metadata "title",
	// else the first line of its prompt (RunTitle), written from pickup on.
	Title string `json:"title,omitempty"`
	// Tenant is who the run is charged to (since 1.8): metadata.tenant,
	// or what the worker's budgets take (--tenant-key, --tenant-from).
	Tenant string `json:"tenant,omitempty"`
	// Priority is the run's lane priority (since 1.10): high or low; ""
	// is normal.
	Priority string `json:"priority,omitempty"`
	// Stale is set by Status and List (never stored) on a running record
	// whose heartbeat is older than the client's stale bound: its worker
	// is gone or cut off and no one has taken the run over (yet).
	Stale bool `json:"stale,omitempty"`
	// Waiting says what a running run waits for (written with the
	// heartbeat); nil when it does not wait. See Waiting.
	Waiting *Waiting `json:"waiting,omitempty"`
	// WaitedMs is the time the run spent waiting for approvals, over all
	// its attempts (since 1.3): left out of limits.timeoutSeconds.
	WaitedMs int64 `json:"waitedMs,omitempty"`
	// WaitingHandBacks counts the deliveries of the current request that
	// ended with the run handed back while it waited (a drain); the
	// give-up requeues such a request instead of failing it (since 1.3).
	WaitingHandBacks int `json:"waitingHandBacks,omitempty"`
	// Requeue marks a run whose request the give-up requeued (since 1.3);
	// see Requeue.
	Requeue *Requeue `json:"requeue,omitempty"`
	// LastControlSeq is run_finished's lastControlSeq, kept in the final
	// record (since 1.6) so a run_finished published from the record (its
	// own was lost) says the same.
	LastControlSeq uint64 `json:"lastControlSeq,omitempty"`
	// Parked marks a waiting run with no attempt on a worker (since 1.9):
	// its request was acknowledged; an answer or an abort wakes it. See
	// Parked.
	Parked *Parked `json:"parked,omitempty"`
	// Child links a child run to its parent (since 1.10).
	Child *ChildOf `json:"child,omitempty"`
	// TreeCost is the cost of the run and every run below it (since
	// 1.10), in a final record of a run that started child runs.
	TreeCost float64 `json:"treeCost,omitempty"`
	// Revision is the KV revision the record was read at (not stored).
	Revision uint64 `json:"-"`
}

// Parked is written into a running record, with its waiting, by the
// attempt that parks the run (worker/internal/park). Seq is the AGENTS_PARKED
// sequence of the copy of the run's request kept for the wake: it names
// the park (a run parked again gets another). Only a copy of that request
// published to the run's submit subject with the header
// Agentfleet-Woken-From: <Seq> (a wake) takes the run over, and only
// while the record still names Seq: the woken attempt's lease clears it.
type Parked struct {
	At      time.Time `json:"at"`
	Seq     uint64    `json:"seq"`
	Attempt int       `json:"attempt"`
	// Digest (since 1.10) is the SHA-256 of the kept copy's wake key, a
	// newline and the kept request's bytes, lowercase hex: a wake's pickup
	// checks its key and bytes against it instead of reading the kept
	// copy. The key is in it because the run's owner has the bytes, and a
	// digest of them alone would let it wake its own run with no answer.
	// Empty (a 1.9 worker parked the run): the pickup reads the copy.
	Digest string `json:"digest,omitempty"`
	// State (since 1.10) is the SHA-256 (lowercase hex) of the kept
	// copy's Agentfleet-Parked-State header: the parked run's events,
	// which its first woken attempt resumes from without reading them.
	// Empty: none kept (too large, or the attempt did not know them all).
	State string `json:"state,omitempty"`
}

// StateDigest is Parked.State of an Agentfleet-Parked-State value.
func StateDigest(state string) string {
	sum := sha256.Sum256([]byte(state))
	return hex.EncodeToString(sum[:])
}

// RequestDigest is Parked.Digest of a kept request's wake key and bytes.
func RequestDigest(wakeKey string, data []byte) string {
	h := sha256.New()
	h.Write([]byte(wakeKey + "\n"))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// Requeue is written into a running record by the give-up before it
// publishes a copy of a request whose deliveries ran out while drains
// handed the waiting run back. Only the copy (its stream sequence is
// Copy, written once it is published; its requeue headers name From)
// takes the run over; it counts attempts from AttemptBase.
// Crashes counts the deliveries of the requests before the copy that did
// not end in a waiting hand-back: once it reaches MaxDeliver the run is
// given up instead of requeued again. The copy's own records keep it.
type Requeue struct {
	From        uint64 `json:"from"`
	AttemptBase int    `json:"attemptBase"`
	Crashes     int    `json:"crashes,omitempty"`
	// Copy is the copy's stream sequence, written once it is published:
	// no other request naming From counts.
	Copy uint64 `json:"copy,omitempty"`
}

// MaxTitleBytes bounds a record's title.
const MaxTitleBytes = 200

// RunTitle is the title a run's record carries: its metadata "title", else
// the first non-blank line of its prompt (or of its first user message),
// cut to MaxTitleBytes.
func RunTitle(req *RunRequest) string {
	if req == nil {
		return ""
	}
	text := req.Metadata["title"]
	if strings.TrimSpace(text) == "" {
		text = req.Prompt
	}
	for i := 0; strings.TrimSpace(text) == "" && i < len(req.Messages); i++ {
		if req.Messages[i].Role == agent.RoleUser {
			text = req.Messages[i].TextOf()
		}
	}
	for line := range strings.Lines(text) {
		if line = strings.TrimSpace(line); line != "" {
			return truncate(line, MaxTitleBytes-len("…"))
		}
	}
	return ""
}

// Finished reports whether the record's state is final.
func (r *RunRecord) Finished() bool {
	switch r.State {
	case StatusSucceeded, StatusFailed, StatusAborted:
		return true
	}
	return false
}

func (c *Client) record(ctx context.Context, runID string) (*RunRecord, error) {
	kv, err := c.Records(ctx)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, runID)
	if err != nil {
		return nil, err
	}
	return DecodeRecord(e)
}

// DecodeRecord decodes a run record from its KV entry, with its revision
// (the lease's compare-and-set token).
func DecodeRecord(e jetstream.KeyValueEntry) (*RunRecord, error) {
	var r RunRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, fmt.Errorf("record %s: %w", e.Key(), err)
	}
	r.Revision = e.Revision()
	return &r, nil
}

// Status returns a run's record. A run with no record but a pending request
// is reported as queued; neither gives ErrRunNotFound.
//
// The record is read first, then the request, then the record again: a
// run found by none of the three reads did not exist when Status began.
func (c *Client) Status(ctx context.Context, runID string) (*RunRecord, error) {
	if err := CheckID(runID); err != nil {
		return nil, err
	}
	r, err := c.record(ctx, runID)
	if err == nil {
		c.markStale(r, time.Now())
		return r, nil
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, err
	}
	s, err := c.Stream(ctx, c.names.RunsStream())
	if err != nil {
		return nil, err
	}
	m, err := s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(c.names.Submit("*", runID)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// A lane's request (since 1.10).
		m, err = s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(c.names.LaneRequest("*", "*", "*", runID)))
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		// The run may have finished between the two reads: its record is
		// written before its request is removed.
		if r, err := c.record(ctx, runID); err == nil {
			c.markStale(r, time.Now())
			return r, nil
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %s", ErrRunNotFound, runID)
	}
	if err != nil {
		return nil, err
	}
	l, _, _ := c.names.ParseRequest(m.Subject)
	return &RunRecord{ID: runID, Queue: l.Queue, State: StateQueued, SubmittedAt: m.Time, RequestSeq: m.Sequence, Priority: l.RecordPriority()}, nil
}

// markStale sets Stale on a running record whose heartbeat is too old.
func (c *Client) markStale(r *RunRecord, now time.Time) {
	if r.State != StateRunning || r.Parked != nil { // a parked run has no heartbeat
		return
	}
	hb := r.HeartbeatAt
	if hb.IsZero() {
		hb = r.StartedAt
	}
	r.Stale = !hb.IsZero() && now.Sub(hb) > c.staleAfter
}
