package worker

import (
	"context"
	"iter"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/toolsource"
)

// Provider is a model endpoint: a stream function and the metadata of its
// models. *openai.Provider satisfies it; so does a faux model wrapped in
// FauxProvider.
type Provider interface {
	// Stream is an agent.StreamFn.
	Stream(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent]
	// Model returns the model with this id, with the metadata (cost,
	// context window) the provider knows; an unknown id still works, with
	// no metadata: ids are passed through to the endpoint.
	Model(id string) agent.Model
}

// ModelLister is implemented by a provider that knows its models (a model
// table): the worker's presence lists them (pick-lists of the console).
type ModelLister interface{ Models() []string }

// Noticer is implemented by a provider that wants run_started to carry a
// notice (the demo model says it is one).
type Noticer interface{ Notice() string }

// Config configures a worker. Client is required; everything else has a
// default.
type Config struct {
	// Client is the bus connection. The worker does not close it.
	Client *bus.Client
	// Queues to take requests from; default ["default"].
	Queues []string
	// Concurrency is the number of runs in flight at most; default 8.
	Concurrency int
	// AckWait of the queue consumers; default 60s. Heartbeats
	// (InProgress) are sent every HeartbeatInterval (default AckWait/4).
	// A run's finish (final record, run_finished, ack) has one AckWait.
	AckWait           time.Duration
	HeartbeatInterval time.Duration
	// MaxDeliver bounds deliveries of a request; default 5.
	MaxDeliver int
	// MaxAckPending bounds the queue consumers' unacknowledged requests
	// (running, waiting and handed-back runs of the whole fleet); default
	// 10,000. Keep it above the fleet's slots plus its waiting runs.
	MaxAckPending int
	// MaxWaiting bounds the runs that wait without a slot; default 1,000.
	// Past it a gated tool call is refused (its result is an error saying
	// so, and the model goes on: approval.go), and a run that waits for
	// something else (a budget) keeps its slot. Negative: waiting runs
	// keep their slots and gated calls are never refused.
	MaxWaiting int
	// MaxChildDepth and MaxChildren are the ceilings of a request's
	// children bounds (worker/children.go): how deep a tree of child runs
	// may grow below its root, and how many children one run may start.
	// Defaults 3 and 100.
	MaxChildDepth, MaxChildren int
	// ParkAfter parks a run that has waited this long for approvals with
	// nothing of it running (worker/park.go): its request is acknowledged
	// and nothing of it stays on the worker until an answer or an abort
	// wakes it. Default 30s; negative: never park.
	ParkAfter time.Duration
	// WaitingSweep is how often the worker sweeps its share of the
	// waiting-run index, removing entries of runs that no longer wait
	// (worker/waitindex.go). Default 1 minute; negative: never.
	WaitingSweep time.Duration
	// MaxApprovalTimeout is the operator's ceiling of a gated call's wait:
	// a longer approval.timeoutSeconds (or default) is lowered to it.
	// Default MaxRunTimeout; zero with no MaxRunTimeout: the protocol's
	// 7 days.
	MaxApprovalTimeout time.Duration
	// ApproveTools gates tools (names or path.Match patterns, "*" for
	// all) on a person's answer in every run, whatever the request says
	// (it may gate more, never fewer); the wait bound and onTimeout are
	// the request's, else the defaults (1 day, deny).
	ApproveTools []string
	// DrainTimeout is how long running runs may go on after ctx is
	// cancelled before they are stopped and handed back (Nak); default 30s.
	DrainTimeout time.Duration
	// TenantWeights weigh the tenants' fair share of the slots within a
	// priority (since 1.10; lanes.go): a tenant missing here weighs 1.
	// Every worker of a fleet should be given the same ones.
	TenantWeights map[string]float64
	// PollWait is how long one idle pull waits; default 2s. It bounds how
	// long stopping takes to stop pulling.
	PollWait time.Duration
	// FetchBytes bounds the requests that the worker's fetches of several
	// may bring at once, across its pull loops; default 16 MiB. Each loop
	// still takes one request of the largest size. The server disconnects
	// a client that it holds more than its max_pending for (64 MiB by
	// default): thousands of free slots times large requests are more.
	FetchBytes int
	// PublishWindow is the number of a run's events whose JetStream acks
	// may be outstanding (record writes are not in it); a full window
	// blocks the agent's listener (back-pressure). Default 256.
	PublishWindow int
	// NoEventBatches publishes every event on its own, each answered by
	// its own ack, instead of in JetStream fast batches (worker/internal/eventpub). Events
	// go plainly anyway where the events stream does not allow batches.
	NoEventBatches bool
	// PublishAckTimeout is how long an event's JetStream ack may take
	// before the event and those after it are re-sent; default 15s.
	PublishAckTimeout time.Duration
	// ToolTimeout bounds one tool call's own run, from when its run's
	// events before it are stored (tools.go); default 2 minutes.
	ToolTimeout time.Duration
	// MaxToolResultBytes caps a tool result's text; default 64 KiB.
	MaxToolResultBytes int
	// MaxToolArgsBytes caps a tool call's arguments (as JSON): a larger
	// call fails with an error result and is not executed; default 64 KiB.
	MaxToolArgsBytes int
	// MaxRunEvents and MaxRunEventBytes are a run's event budget (count,
	// and bytes of stored envelopes, over all its attempts: a resumed
	// attempt is charged for what earlier ones stored);
	// past either the run fails with reason event_budget. Defaults
	// 100,000 events and 256 MiB: a long tool-using run publishes a few
	// thousand events, while a run streaming empty deltas would otherwise
	// fill the events stream until its timeout.
	MaxRunEvents     int
	MaxRunEventBytes int64
	// MaxQueuedControls and MaxQueuedControlBytes bound a run's steer and
	// follow-up messages that the agent has not taken yet; one past them
	// fails the run with reason control_budget. Defaults 1024 (the
	// control stream keeps at most that many per run and kind) and 4 MiB.
	MaxQueuedControls     int
	MaxQueuedControlBytes int
	// MaxTranscriptBytes bounds the run's transcript (the JSON of its
	// messages, as sent to the model); past it the run fails with reason
	// transcript_too_large. Default 32 MiB.
	MaxTranscriptBytes int
	// LoadBudget bounds the bytes of snapshots (continueFrom) the runs of
	// this worker hold at once: a continuation whose snapshot does not fit
	// what is free waits for it without a slot; one larger than the whole
	// budget fails with reason transcript_too_large. Default 128 MiB (four
	// transcripts at --max-transcript-bytes): a loaded transcript costs
	// its JSON's size in heap while its run lives and as much again in
	// garbage (GOGC=100), and its run writes it back whole at its end, so
	// 128 MiB peaks near 300 MiB (issue 54's bench), well inside
	// deploy/k8s's 1 GiB.
	LoadBudget int64
	// NoFaux refuses requests that script the faux model or name a faux
	// model (bad request naming --allow-faux): a submitter must not
	// script the "model" on a fleet with a real endpoint. The demo model
	// as DefaultModel still answers requests that name no model.
	NoFaux bool
	// MaxRunTimeout and MaxTurns are operator ceilings: a request asking
	// more is a bad request; a default above them is lowered to them.
	// Zero: no ceiling beyond the protocol's.
	MaxRunTimeout time.Duration
	MaxTurns      int
	// QueueConcurrency caps the runs in flight per queue (queue name to
	// slots), so one queue cannot take every slot. A queue not named
	// shares Concurrency.
	QueueConcurrency map[string]int
	// KeyLimits are the default limits of concurrency keys by pattern
	// (since 1.10; keys.go): the first match applies, and a request's own
	// limit may only be lower.
	KeyLimits []KeyLimit
	// Tools are offered to runs besides the built-ins (calculator,
	// current_time, sleep); a tool of the same name replaces a built-in.
	Tools []*agent.Tool
	// NoBuiltinTools leaves the built-in tools out.
	NoBuiltinTools bool
	// ToolSources serve tools the worker discovers at run time: MCP
	// servers and NATS tool services (package toolsource). Run starts
	// them and stops them when it returns.
	ToolSources []toolsource.Source
	// Version is the worker's version in its presence entry.
	Version string
	// Providers by name ("openai", ...). "faux" is always available: a
	// request's faux script, or the demo model when it has none (unless
	// Providers["faux"] is set).
	Providers map[string]Provider
	// DefaultModel is the model of requests that name none, "provider/id";
	// default "faux/demo".
	DefaultModel string
	// ModelWindows are the model table's context windows and compaction
	// defaults by "provider/id", for models whose provider does not
	// describe them (a faux id such as "faux/small") or whose operator
	// sets other compaction defaults (worker/compaction.go).
	ModelWindows map[string]ModelWindow
	// SkipEnsureStreams leaves stream, consumer and bucket creation to
	// someone else (operators who manage them with NACK or the nats CLI).
	SkipEnsureStreams bool
	// Streams shapes what EnsureStreams creates (Queues, AckWait and
	// MaxDeliver are taken from this Config).
	Streams bus.StreamsConfig
	// WorkerID names the worker in events and records; default
	// hostname-random.
	WorkerID string
	Logger   *slog.Logger
	// Observer is told about runs, turns, model requests, tool calls,
	// publishing, control messages and slots (metrics). Optional.
	Observer Observer
	// RateLimits, when set, makes every call of a model it lists take
	// capacity from the fleet's shared limits first (ratelimit.go).
	RateLimits *RateLimits
	// Budgets, when set, charges every run's model calls to its tenant's
	// budget per period (tenant.go).
	Budgets *TenantBudgets
	// TracerProvider makes the attempts' spans (trace.go); nil or a noop
	// provider: no spans, at no cost.
	TracerProvider trace.TracerProvider
	// TraceContent records prompts, completions and tool arguments and
	// results in spans (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT).
	TraceContent bool
	// ScheduleLate is how late a schedule's fire may be and still run
	// as planned; a later one is missed, for its catch-up policy [30s].
	ScheduleLate time.Duration

	// wakeFault, set only by the package's tests (export_test.go), fails
	// a child's wake of the parked parent it returns an error for.
	wakeFault func(parent string) error
	// treeTTL, set only by the package's tests (export_test.go), replaces
	// treeAccountTTL (treebudget.go).
	treeTTL time.Duration
	// childRecheck, set only by the package's tests, is how often a
	// waiting run_agent call reads its child's record without a notice
	// (worker/childwait.go) [30s].
	childRecheck time.Duration
	// loseChild, set only by the package's tests, makes run_agent skip
	// the submit of the children it returns true for: a child lost
	// before it got a record.
	loseChild func(child string) bool
	// childStored, set only by the package's tests, is called by
	// run_agent once the child's request is stored, before the call's
	// tool_execution_update names it.
	childStored func(ctx context.Context, child string)
	// loseNotices, set only by the package's tests, drops the worker's
	// notices of finished children (as a reconnect may).
	loseNotices bool
	// laneRecheck replaces lanes.go's laneRecheck (tests: a lane found
	// empty must be asked again when a request is seen in it, not later).
	laneRecheck time.Duration
	// laneRescan replaces tenants.go's laneRescan; dropLaneSeen drops
	// every LaneSeen republish (tests: the rescan alone finds the lane).
	laneRescan   time.Duration
	dropLaneSeen bool
	// beforeEventsSync, set only by the package's tests (export_test.go),
	// is called at a run's end before its events' flush.
	beforeEventsSync func(ctx context.Context, run string)
}

// RunInfo identifies a run to an Observer.
type RunInfo struct {
	ID          string
	Queue       string
	Attempt     int
	Model       string // provider/id
	SubmittedAt time.Time
	StartedAt   time.Time
	Deadline    time.Time // when the run's timeout expires; zero if unknown
	Depth       int       // a child run's depth below its root (worker/children.go); 0 for others
	Tenant      string    // its lane's tenant (since 1.10); "" for the old subject and the no-tenant lane
}

// ModelRequest is one model call, as seen by an Observer.
type ModelRequest struct {
	Model            string // provider/id
	Duration         time.Duration
	TimeToFirstEvent time.Duration // 0 when nothing streamed
	// Usage is what the call is charged (worker/settle.go): the provider's
	// usage clamped to what the call could use, or the estimate of a call
	// that ended without usage.
	Usage      agent.Usage
	StopReason agent.StopReason
	// UsageSource says how Usage was worked out: "reported" (the
	// provider's), "clamped" (the provider's, cut to the call's bounds;
	// ExcessInput and ExcessOutput are the tokens cut), "estimated" (no
	// usage: the call was cut off, or the provider sent none) or "none"
	// (never sent, or refused before any output: nothing charged); "" for
	// a faux model or a call refused before the provider.
	UsageSource               string
	ExcessInput, ExcessOutput int
}

// ToolCall is one tool execution, as seen by an Observer.
type ToolCall struct {
	Tool     string
	Duration time.Duration
	Err      error
	TimedOut bool
}

// Observer receives what the worker's metrics need. Calls are synchronous and
// may come from many goroutines: keep them cheap. Embed NopObserver to
// implement only some methods.
type Observer interface {
	RunStarted(r RunInfo)
	// KeyWaited: a run woken for its concurrency key got its place, d
	// after it began to wait (since 1.10; keys.go).
	KeyWaited(r RunInfo, d time.Duration)
	RunFinished(r RunInfo, f bus.RunFinished)
	// RunHandedBack: a started attempt left the worker without finishing:
	// stopped by a drain and Nak'ed, its lease lost to a newer attempt, or
	// its events not stored (Nak'ed for a retry). Every started attempt
	// ends with exactly one RunFinished or RunHandedBack.
	RunHandedBack(r RunInfo)
	Turn(r RunInfo)
	ModelRequest(r RunInfo, m ModelRequest)
	ToolCall(r RunInfo, t ToolCall)
	// EventPublished: an event was stored (its ack arrived). Record
	// writes are not counted.
	EventPublished()
	PublishFailed(err error)
	// PublishWait: the agent's listener waited this long for room in the
	// publish window (only called when it had to wait).
	PublishWait(d time.Duration)
	// ControlReceived: a control message was applied: a steer or
	// follow-up is in the agent's queue, an abort took effect.
	ControlReceived(kind string)
	Slots(busy, total int)
	// RunsWaiting: the runs that wait now (for an approval), with or
	// without their slot.
	RunsWaiting(r RunInfo, n int)
	// ApprovalRequested: a gated call asked for an answer (a resumed
	// wait is not asked again).
	ApprovalRequested(r RunInfo)
	// ApprovalResolved: a gated call got its answer (approve, deny) or
	// timed out, after waiting d.
	ApprovalResolved(r RunInfo, decision string, d time.Duration)
	// ApprovalRefused: a gated call was refused without asking, for a
	// reason (max_waiting: the worker's MaxWaiting runs wait already).
	ApprovalRefused(r RunInfo, reason string)
	// RunParked: the run parked (worker/park.go) waiting for what
	// (bus.WaitingApproval, bus.WaitingChildren).
	RunParked(r RunInfo, what string)
	// WakePublished: this worker published a parked run's wake, by an
	// answer, a timer or the parking attempt itself (an answer came while
	// it parked), d after what woke it was stored (negative: unknown).
	WakePublished(by string, d time.Duration)
	// WokenStarted: a woken attempt started, d after its wake was stored.
	WokenStarted(r RunInfo, d time.Duration)
}

// NopObserver does nothing.
type NopObserver struct{}

func (NopObserver) RunStarted(RunInfo)                              {}
func (NopObserver) KeyWaited(RunInfo, time.Duration)                {}
func (NopObserver) RunFinished(RunInfo, bus.RunFinished)            {}
func (NopObserver) RunHandedBack(RunInfo)                           {}
func (NopObserver) Turn(RunInfo)                                    {}
func (NopObserver) ModelRequest(RunInfo, ModelRequest)              {}
func (NopObserver) ToolCall(RunInfo, ToolCall)                      {}
func (NopObserver) EventPublished()                                 {}
func (NopObserver) PublishFailed(error)                             {}
func (NopObserver) PublishWait(time.Duration)                       {}
func (NopObserver) ControlReceived(string)                          {}
func (NopObserver) Slots(int, int)                                  {}
func (NopObserver) RunsWaiting(RunInfo, int)                        {}
func (NopObserver) ApprovalRequested(RunInfo)                       {}
func (NopObserver) ApprovalResolved(RunInfo, string, time.Duration) {}
func (NopObserver) ApprovalRefused(RunInfo, string)                 {}
func (NopObserver) RunParked(RunInfo, string)                       {}
func (NopObserver) WakePublished(string, time.Duration)             {}
func (NopObserver) WokenStarted(RunInfo, time.Duration)             {}

func (c *Config) defaults() {
	if len(c.Queues) == 0 {
		c.Queues = []string{bus.DefaultQueue}
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.AckWait <= 0 {
		c.AckWait = 60 * time.Second
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = c.AckWait / 4
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 5
	}
	if c.MaxAckPending <= 0 {
		c.MaxAckPending = 10_000
	}
	if c.MaxWaiting == 0 {
		c.MaxWaiting = 1_000
	}
	if c.MaxChildDepth <= 0 {
		c.MaxChildDepth = 3
	}
	if c.MaxChildren <= 0 {
		c.MaxChildren = 100
	}
	if c.ParkAfter == 0 {
		c.ParkAfter = 30 * time.Second
	}
	if c.WaitingSweep == 0 {
		c.WaitingSweep = time.Minute
	}
	if c.MaxApprovalTimeout <= 0 {
		c.MaxApprovalTimeout = c.MaxRunTimeout
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.PollWait <= 0 {
		c.PollWait = 2 * time.Second
	}
	if c.FetchBytes <= 0 {
		c.FetchBytes = DefaultFetchBytes
	}
	if c.PublishWindow <= 0 {
		c.PublishWindow = 256
	}
	if c.PublishAckTimeout <= 0 {
		c.PublishAckTimeout = 15 * time.Second
	}
	if c.ToolTimeout <= 0 {
		c.ToolTimeout = 2 * time.Minute
	}
	if c.MaxToolResultBytes <= 0 {
		c.MaxToolResultBytes = 64 << 10
	}
	if c.MaxToolArgsBytes <= 0 {
		c.MaxToolArgsBytes = 64 << 10
	}
	if c.MaxRunEvents <= 0 {
		c.MaxRunEvents = 100_000
	}
	if c.MaxRunEventBytes <= 0 {
		c.MaxRunEventBytes = 256 << 20
	}
	if c.MaxQueuedControls <= 0 {
		c.MaxQueuedControls = 1024
	}
	if c.MaxQueuedControlBytes <= 0 {
		c.MaxQueuedControlBytes = 4 << 20
	}
	if c.MaxTranscriptBytes <= 0 {
		c.MaxTranscriptBytes = 32 << 20
	}
	if c.LoadBudget <= 0 {
		c.LoadBudget = 128 << 20
	}
	if c.DefaultModel == "" {
		c.DefaultModel = "faux/demo"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
}

// DefaultFetchBytes is Config.FetchBytes' default.
const DefaultFetchBytes = 16 << 20
