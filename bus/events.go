package bus

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/agentfleet/agentfleet/agent"
)

// Fleet event types. They travel in the same envelope as the agent events.
const (
	EventRunStarted  = "run_started"
	EventRunFinished = "run_finished"
	EventRunResumed  = "run_resumed"
	// EventTranscriptRestored (since 1.9) names the finished run whose
	// transcript a continuation starts from, instead of its messages.
	EventTranscriptRestored = "transcript_restored"
	// EventRunParked (since 1.9): a run that waited long enough with
	// nothing of it running was parked: its request acknowledged, its
	// state in NATS; an answer or an abort wakes it (docs/protocol.md).
	EventRunParked = "run_parked"
	// EventModelWait: a model call waited for the fleet's shared rate
	// limits; published once the call proceeds.
	EventModelWait = "model_wait"
	// Approvals of gated tool calls (since 1.3): a call waits for a
	// person's answer (requested), got it or timed out (resolved), or an
	// answer was not applied (rejected: an invalid one, or since 1.8 one
	// stored before the call asked or after it was resolved).
	EventToolApprovalRequested = "tool_approval_requested"
	EventToolApprovalResolved  = "tool_approval_resolved"
	EventToolApprovalRejected  = "tool_approval_rejected"
	// EventControlRejected (since 1.8): a steer or follow-up message the
	// run did not take (an invalid body), so that its sender learns why.
	EventControlRejected = "control_rejected"
)

// ControlRejected is the body of control_rejected.
type ControlRejected struct {
	Type string `json:"type"`
	// Kind is the control message's kind: steer or followup.
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
	// ControlSeq is the message's AGENTS_CONTROL sequence.
	ControlSeq uint64 `json:"controlSeq"`
}

// Decisions of a tool_approval_resolved.
const (
	DecisionApprove = "approve"
	DecisionDeny    = "deny"
	DecisionTimeout = "timeout"
)

// ToolApproval is the body of the three approval events; each uses the
// fields its type needs.
type ToolApproval struct {
	Type       string `json:"type"`
	ToolCallID string `json:"toolCallId"`
	// requested
	ToolName  string         `json:"toolName,omitempty"`
	Args      map[string]any `json:"args,omitempty"`
	ExpiresAt int64          `json:"expiresAt,omitempty"` // unix ms
	// AnswersAfter (requested, since 1.8): the run's answers count only
	// with an AGENTS_CONTROL sequence above it (stored after the call
	// began to ask).
	AnswersAfter uint64 `json:"answersAfter,omitempty"`
	// Parameters (requested, since 1.8) is the tool's JSON Schema, the one
	// an edit is checked against; left out past MaxApprovalSchemaBytes.
	Parameters json.RawMessage `json:"parameters,omitempty"`
	// resolved, rejected
	Decision   string `json:"decision,omitempty"`
	By         string `json:"by,omitempty"`
	Reason     string `json:"reason,omitempty"`
	ControlSeq uint64 `json:"controlSeq,omitempty"`
	// Arguments (resolved, since 1.8) are the approver's edit, as
	// validated: what the call runs with instead of Args. Absent (nil)
	// without an edit; an edit to no arguments is {} (omitzero: omitempty
	// dropped it).
	Arguments map[string]any `json:"arguments,omitzero"`
}

// WaitRateLimit is the reason of a model_wait for shared rate limits.
const WaitRateLimit = "rate_limit"

// What a running record's waiting.for says the run waits for.
const (
	// WaitingModel: a model call queues for the fleet's shared rate limits.
	WaitingModel = "model"
	// WaitingApproval: every running gated tool call of the batch waits
	// for a person's answer (since 1.3).
	WaitingApproval = "approval"
	// WaitingKey: the run's concurrency key is full (since 1.10); the
	// run is parked, and a run of the key that ends wakes it.
	WaitingKey = "key"
	// WaitingChildren: a run_agent call waits for its child run (since
	// 1.10).
	WaitingChildren = "children"
)

// Waiting is a running record's "waiting": what the run waits for, since
// when, and for an approval the calls that wait. Protocol 1.2 wrote the
// bare string "model"; it decodes as {"for":"model"}.
type Waiting struct {
	For   string    `json:"for"`
	Since time.Time `json:"since,omitzero"`
	// Key is the full concurrency key of a wait for a key (since 1.10).
	Key       string            `json:"key,omitempty"`
	Approvals []PendingApproval `json:"approvals,omitempty"`
}

// PendingApproval is one gated tool call waiting for its answer.
type PendingApproval struct {
	ToolCallID  string `json:"toolCallId"`
	ToolName    string `json:"toolName"`
	RequestedAt int64  `json:"requestedAt"` // unix ms
	ExpiresAt   int64  `json:"expiresAt"`   // unix ms
}

// UnmarshalJSON takes the object, or 1.2's string form.
func (w *Waiting) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*w = Waiting{For: s}
		return nil
	}
	type plain Waiting
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*w = Waiting(p)
	return nil
}

// ModelWait is a model call that waited before it started.
type ModelWait struct {
	Type     string `json:"type"`
	Reason   string `json:"reason"`
	WaitedMs int64  `json:"waitedMs"`
	// Group is the limit group waited for.
	Group string `json:"group,omitempty"`
}

// Run statuses (the status of run_finished).
const (
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
	StatusAborted   = "aborted"
)

// Record states: the statuses plus these.
const (
	StateQueued  = "queued"
	StateRunning = "running"
	// StateStale is only a List filter: running records marked Stale.
	StateStale = "stale"
	// StateWaiting is only a List filter: running records with a
	// "waiting" (for approval or for the model's rate limits).
	StateWaiting = "waiting"
)

// Machine-readable reasons of run_finished (for failed and aborted runs).
const (
	ReasonModelError    = "model_error"
	ReasonBadRequest    = "bad_request"
	ReasonMaxTurns      = "max_turns"
	ReasonTimeout       = "timeout"
	ReasonTokenBudget   = "token_budget"
	ReasonAbortedByUser = "aborted_by_user"
	ReasonEventTooLarge = "event_too_large"
	ReasonInternal      = "internal_error"
	// ReasonEventBudget: the run published more events (count or bytes)
	// than the worker's event budget.
	ReasonEventBudget = "event_budget"
	// ReasonControlBudget: more steer/follow-up messages (count or bytes)
	// were waiting for the agent than the worker allows per run.
	ReasonControlBudget = "control_budget"
	// ReasonTranscriptTooLarge: the run's transcript grew past the
	// worker's bound.
	ReasonTranscriptTooLarge = "transcript_too_large"
	// ReasonGaveUp: the request was delivered MaxDeliver times without
	// finishing (crashes, hand-backs); its copy is on the dead-letter
	// subject.
	ReasonGaveUp = "gave_up"
	// ReasonBudgetExceeded: the run's model calls would cost, or cost,
	// more than limits.maxCostUsd.
	ReasonBudgetExceeded = "budget_exceeded"
)

// Envelope is one NATS message on <prefix>.run.<run>.events. Seq starts at 1
// for each attempt and has no gaps. Lifecycle events (run_started,
// run_resumed, run_finished) and an attempt's first event carry Nats-Msg-Id
// "<run>:<attempt>:<seq>"; since 1.4 an agent event whose original landed
// late may be stored twice, and readers take the first of a seq.
type Envelope struct {
	Run     string `json:"run"`
	Seq     uint64 `json:"seq"`
	Attempt int    `json:"attempt"`
	Worker  string `json:"worker"`
	// TS is Unix milliseconds.
	TS int64 `json:"ts"`
	// ControlSeq is the AGENTS_CONTROL stream sequence of the control
	// message a user message came from (on its message_start and
	// message_end).
	ControlSeq uint64 `json:"controlSeq,omitempty"`
	// Interrupted marks the message_end of an assistant message that was
	// cut off because its worker was stopping (drain, lost lease, lost
	// NATS), not because the user aborted: recovery drops it and the next
	// attempt regenerates the answer.
	Interrupted bool            `json:"interrupted,omitempty"`
	Event       json.RawMessage `json:"event"`

	// Type is the event's type, filled by DecodeEnvelope.
	Type string `json:"-"`
	// StreamSeq is the AGENTS_EVENTS sequence, when read from the stream.
	StreamSeq uint64 `json:"-"`
}

// DecodeEnvelope parses an envelope and the type of its event.
func DecodeEnvelope(data []byte) (*Envelope, error) {
	var e Envelope
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("envelope: %w", err)
	}
	if len(e.Event) == 0 {
		return nil, errors.New("envelope: no event")
	}
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(e.Event, &head); err != nil {
		return nil, fmt.Errorf("envelope event: %w", err)
	}
	if head.Type == "" {
		return nil, errors.New("envelope event: no type")
	}
	e.Type = head.Type
	return &e, nil
}

// AppendJSON appends the envelope's JSON to dst: the fields in a fixed
// order and the encoded event last, as readers that scan envelopes without
// a full decode expect. Run must be a valid id; Type and StreamSeq are not
// written.
func (e *Envelope) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"run":"`...)
	dst = append(dst, e.Run...)
	dst = append(dst, `","seq":`...)
	dst = strconv.AppendUint(dst, e.Seq, 10)
	dst = append(dst, `,"attempt":`...)
	dst = strconv.AppendInt(dst, int64(e.Attempt), 10)
	dst = append(dst, `,"worker":`...)
	q, _ := json.Marshal(e.Worker)
	dst = append(dst, q...)
	dst = append(dst, `,"ts":`...)
	dst = strconv.AppendInt(dst, e.TS, 10)
	if e.ControlSeq > 0 {
		dst = append(dst, `,"controlSeq":`...)
		dst = strconv.AppendUint(dst, e.ControlSeq, 10)
	}
	if e.Interrupted {
		dst = append(dst, `,"interrupted":true`...)
	}
	dst = append(dst, `,"event":`...)
	dst = append(dst, e.Event...)
	return append(dst, '}')
}

// AgentEvent is the wire form of a pi agent event. Field names are pi's,
// except that message_update carries only assistantMessageEvent (a delta,
// no partial message) and turn_end / agent_end refer to messages by the
// envelope seq of their message_end instead of repeating them.
type AgentEvent struct {
	Type string `json:"type"`
	// message_start, message_end
	Message *agent.Message `json:"message,omitempty"`
	// message_update
	AssistantMessageEvent *agent.StreamEvent `json:"assistantMessageEvent,omitempty"`
	// tool_execution_*
	ToolCallID    string            `json:"toolCallId,omitempty"`
	ToolName      string            `json:"toolName,omitempty"`
	Args          map[string]any    `json:"args,omitempty"`
	PartialResult *agent.ToolResult `json:"partialResult,omitempty"`
	Result        *agent.ToolResult `json:"result,omitempty"`
	IsError       *bool             `json:"isError,omitempty"`
	// turn_end: the seq of the turn's assistant message_end and of its tool
	// results' message_end events.
	MessageSeq     uint64   `json:"messageSeq,omitempty"`
	ToolResultSeqs []uint64 `json:"toolResultSeqs,omitempty"`
	// agent_end: how many messages the agent run added, and the seqs of
	// their message_end events (in this attempt).
	MessageCount *int     `json:"messageCount,omitempty"`
	MessageSeqs  []uint64 `json:"messageSeqs,omitempty"`
}

// ProtocolVersion is the protocol this code speaks, "1.<minor>": the major
// changes only with an incompatible change, the minor with every addition
// (a field, a verb, an event type). Workers announce it in run_started.
const ProtocolVersion = "1.10"

// RunStarted is the first event of every attempt, bad requests included.
type RunStarted struct {
	Type string `json:"type"`
	// Protocol is the ProtocolVersion of the worker that runs the attempt
	// ("" from workers older than 1.1).
	Protocol     string            `json:"protocol,omitempty"`
	Queue        string            `json:"queue"`
	Worker       string            `json:"worker"`
	Attempt      int               `json:"attempt"`
	Model        *ModelRef         `json:"model,omitempty"`
	Tools        []string          `json:"tools"`
	Notice       string            `json:"notice,omitempty"`
	ContinueFrom string            `json:"continueFrom,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	// SubmittedAt is when the request was stored, Unix milliseconds.
	SubmittedAt int64 `json:"submittedAt,omitempty"`
	// Traceparent is the W3C traceparent of the attempt's invoke_agent
	// span, when the worker traces (since 1.3; readers ignore it).
	Traceparent string `json:"traceparent,omitempty"`
	// Child links a child run to its parent (since 1.10).
	Child *ChildOf `json:"child,omitempty"`
}

// RunFinished is the last event of a run; there is exactly one per run.
type RunFinished struct {
	Type   string `json:"type"`
	Status string `json:"status"`
	// Reason is set for failed and aborted runs.
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
	// Usage sums the usage of the run's assistant messages (this attempt's).
	Usage      agent.Usage `json:"usage"`
	Cost       float64     `json:"cost"`
	Turns      int         `json:"turns"`
	DurationMs int64       `json:"durationMs"`
	// LastControlSeq is the highest AGENTS_CONTROL sequence the run took
	// into account; control messages stored after it were ignored.
	LastControlSeq uint64 `json:"lastControlSeq,omitempty"`
	// TreeCost (since 1.10) is the cost of the run and every run below it
	// (its child runs' treeCost, or cost), set when it started children.
	TreeCost float64 `json:"treeCost,omitempty"`
}

// RunResumed follows run_started when an attempt continues the transcript
// of earlier attempts instead of starting over (crash recovery).
type RunResumed struct {
	Type             string `json:"type"`
	Attempt          int    `json:"attempt"`
	MessagesRestored int    `json:"messagesRestored"`
	// CutOffUsage (since 1.8) sums the usage of the model calls that
	// earlier attempts were charged for and that the restored transcript
	// does not have: assistant messages cut off when their worker stopped,
	// dropped by this resume or by an earlier one (it includes theirs).
	// The run's usage and cost count it.
	CutOffUsage *agent.Usage `json:"cutOffUsage,omitempty"`
}

// TranscriptRestored (since 1.9) follows run_started in every attempt of a
// continuation (continueFrom): the run's transcript begins with the first
// Messages messages of run From's transcript (Bytes bytes of JSON), which
// are not published again. Its snapshot (LoadSnapshot) or, without one, its
// events hold them.
type TranscriptRestored struct {
	Type     string `json:"type"`
	From     string `json:"from"`
	Messages int    `json:"messages"`
	Bytes    int64  `json:"bytes"`
}

// RunParked (since 1.9) says the attempt parked the run: it waits for
// what Waiting says with nothing of it on a worker. The next attempt, a
// woken one, starts with run_started as any other; readers that know
// nothing of run_parked skip it and lose nothing.
type RunParked struct {
	Type    string   `json:"type"`
	Attempt int      `json:"attempt"`
	Waiting *Waiting `json:"waiting,omitempty"`
}

// Event is a decoded event: exactly one of the pointers is set.
type Event struct {
	Type        string
	Agent       *AgentEvent
	RunStarted  *RunStarted
	RunFinished *RunFinished
	RunResumed  *RunResumed
	Restored    *TranscriptRestored
	RunParked   *RunParked
	ModelWait   *ModelWait
	Approval    *ToolApproval // the three tool_approval_* events
	Control     *ControlRejected
	// The compaction events (since 1.10).
	CompactionStart *CompactionStart
	CompactionEnd   *CompactionEnd
}

// Decode decodes the envelope's event. An event type this version does not
// know decodes to an Event with that Type and only Agent.Type set, so that
// readers ignore it (see docs/protocol.md, protocol evolution).
func (e *Envelope) Decode() (*Event, error) {
	typ := e.Type
	if typ == "" {
		var head struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(e.Event, &head); err != nil {
			return nil, err
		}
		typ = head.Type
	}
	ev := &Event{Type: typ}
	var target any
	switch typ {
	case EventRunStarted:
		ev.RunStarted = &RunStarted{}
		target = ev.RunStarted
	case EventRunFinished:
		ev.RunFinished = &RunFinished{}
		target = ev.RunFinished
	case EventRunResumed:
		ev.RunResumed = &RunResumed{}
		target = ev.RunResumed
	case EventTranscriptRestored:
		ev.Restored = &TranscriptRestored{}
		target = ev.Restored
	case EventRunParked:
		ev.RunParked = &RunParked{}
		target = ev.RunParked
	case EventModelWait:
		ev.ModelWait = &ModelWait{}
		target = ev.ModelWait
	case EventToolApprovalRequested, EventToolApprovalResolved, EventToolApprovalRejected:
		ev.Approval = &ToolApproval{}
		target = ev.Approval
	case EventControlRejected:
		ev.Control = &ControlRejected{}
		target = ev.Control
	case EventCompactionStart:
		ev.CompactionStart = &CompactionStart{}
		target = ev.CompactionStart
	case EventCompactionEnd:
		ev.CompactionEnd = &CompactionEnd{}
		target = ev.CompactionEnd
	default:
		ev.Agent = &AgentEvent{Type: typ}
		if !knownAgentEvent(typ) {
			// A newer worker's event: readers skip it, whatever its fields.
			return ev, nil
		}
		target = ev.Agent
	}
	if err := json.Unmarshal(e.Event, target); err != nil {
		return nil, fmt.Errorf("%s event: %w", typ, err)
	}
	return ev, nil
}

func knownAgentEvent(typ string) bool {
	switch agent.EventType(typ) {
	case agent.EventAgentStart, agent.EventAgentEnd, agent.EventTurnStart, agent.EventTurnEnd,
		agent.EventMessageStart, agent.EventMessageUpdate, agent.EventMessageEnd,
		agent.EventToolExecutionStart, agent.EventToolExecutionUpdate, agent.EventToolExecutionEnd:
		return true
	}
	return false
}
