package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Refusals. The returned errors wrap these with pi's exact texts.
var (
	// ErrAlreadyRunning: Prompt, Continue or Reset while a run is active.
	ErrAlreadyRunning = errors.New("agent is already running")
	// ErrNoMessages: Continue with an empty transcript.
	ErrNoMessages = errors.New("no messages to continue from")
	// ErrCannotContinue: Continue after an assistant message with nothing queued.
	ErrCannotContinue = errors.New("cannot continue from an assistant message")
)

type refusal struct {
	kind error
	text string
}

func (r *refusal) Error() string        { return r.text }
func (r *refusal) Is(target error) bool { return target == r.kind }

var (
	errPromptRunning   = &refusal{ErrAlreadyRunning, "Agent is already processing a prompt. Use steer() or followUp() to queue messages, or wait for completion."}
	errContinueRunning = &refusal{ErrAlreadyRunning, "Agent is already processing. Wait for completion before continuing."}
	errResetRunning    = &refusal{ErrAlreadyRunning, "Agent is already processing. Wait for completion before resetting."}
	errNoMessages      = &refusal{ErrNoMessages, "No messages to continue from"}
	errCannotContinue  = &refusal{ErrCannotContinue, "Cannot continue from message role: assistant"}
)

// QueueMode says how many queued messages one drain point takes.
type QueueMode string

const (
	QueueOneAtATime QueueMode = "one-at-a-time"
	QueueAll        QueueMode = "all"
)

// Listener receives every event of a run, after the state has been updated
// for it. Listeners are called one at a time, in subscription order, and the
// run waits for them. ctx is the run's context: it is cancelled by Abort. An
// error (or a panic) ends the run with a synthesized error message.
type Listener func(ctx context.Context, ev Event) error

// TurnContext is what PrepareNextTurn and ShouldStopAfterTurn see after a
// turn: its assistant message, its tool results, the loop's context and the
// messages the run has added so far.
type TurnContext struct {
	Message     *Message
	ToolResults []Message
	Context     *Context
	NewMessages []Message
}

// NextTurn changes the next turn. Nil fields keep what the run has.
type NextTurn struct {
	Context       *Context
	Model         *Model
	ThinkingLevel ThinkingLevel // "" keeps the current level
}

// BeforeToolCallContext is what BeforeToolCall sees. Changing Args changes
// what the tool receives, without validating again.
type BeforeToolCallContext struct {
	AssistantMessage *Message
	ToolCall         Content
	Args             map[string]any
	Context          *Context
}

// BeforeToolCallResult blocks a call: the call fails with Reason (or pi's
// default text) and, with Terminate, asks to end the run after the batch.
type BeforeToolCallResult struct {
	Block     bool
	Reason    string
	Terminate bool
}

// AfterToolCallContext is what AfterToolCall sees for an executed call.
type AfterToolCallContext struct {
	AssistantMessage *Message
	ToolCall         Content
	Args             map[string]any
	Result           ToolResult
	IsError          bool
	Context          *Context
}

// AfterToolCallResult overrides a result field by field; nil keeps a field.
type AfterToolCallResult struct {
	Content   []Content
	Details   any
	IsError   *bool
	Terminate *bool
}

// Options configure an Agent. Only StreamFn is required.
type Options struct {
	SystemPrompt  string
	Model         Model // zero: UnknownModel()
	ThinkingLevel ThinkingLevel
	Tools         []*Tool
	Messages      []Message

	StreamFn StreamFn

	// ConvertToLLM turns the transcript into the messages the model sees.
	// Default: keep user, assistant, toolResult, system and developer messages.
	ConvertToLLM func(ctx context.Context, msgs []Message) ([]Message, error)
	// TransformContext runs before ConvertToLLM on every model call.
	TransformContext func(ctx context.Context, msgs []Message) ([]Message, error)
	// GetAPIKey is asked before every model call; "" falls back to APIKey.
	GetAPIKey func(ctx context.Context, provider string) (string, error)
	APIKey    string

	BeforeToolCall      func(ctx context.Context, c *BeforeToolCallContext) (*BeforeToolCallResult, error)
	AfterToolCall       func(ctx context.Context, c *AfterToolCallContext) (*AfterToolCallResult, error)
	PrepareNextTurn     func(ctx context.Context, t *TurnContext) (*NextTurn, error)
	ShouldStopAfterTurn func(ctx context.Context, t *TurnContext) (bool, error)

	SteeringMode  QueueMode     // default one-at-a-time
	FollowUpMode  QueueMode     // default one-at-a-time
	ToolExecution ExecutionMode // default parallel
	SessionID     string
	Temperature   *float64
	MaxTokens     int
}

// State is a snapshot of an Agent's state.
type State struct {
	SystemPrompt     string
	Model            Model
	ThinkingLevel    ThinkingLevel
	Tools            []*Tool
	Messages         []Message
	IsStreaming      bool
	StreamingMessage *Message // a copy; nil when nothing streams
	PendingToolCalls []string
	ErrorMessage     string
}

// Agent holds a conversation and runs the agent loop over it. Every method
// is safe to call from any goroutine, also while a run is active and from
// inside listeners, except WaitForIdle inside a listener (see WaitForIdle).
type Agent struct {
	opts Options // hooks; immutable after New

	// mu guards everything below. It is never held while calling out.
	mu            sync.Mutex
	systemPrompt  string
	model         Model
	thinkingLevel ThinkingLevel
	tools         []*Tool
	messages      []Message
	steeringMode  QueueMode
	followUpMode  QueueMode
	toolExecution ExecutionMode
	sessionID     string
	errorMessage  string
	pending       []string // pending tool call ids, in start order
	streaming     *Message // the message the reducer last saw started
	builder       MessageBuilder
	steering      []Message
	followUps     []Message
	listeners     []*listenerEntry // copy-on-write
	active        *activeRun

	// emitMu serialises emits: reducer and listeners run for one event at a time.
	emitMu sync.Mutex
}

type listenerEntry struct{ fn Listener }

type activeRun struct {
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns an idle Agent.
func New(opts Options) *Agent {
	a := &Agent{
		opts:          opts,
		systemPrompt:  opts.SystemPrompt,
		model:         opts.Model,
		thinkingLevel: opts.ThinkingLevel,
		tools:         append([]*Tool(nil), opts.Tools...),
		messages:      append([]Message(nil), opts.Messages...),
		steeringMode:  opts.SteeringMode,
		followUpMode:  opts.FollowUpMode,
		toolExecution: opts.ToolExecution,
		sessionID:     opts.SessionID,
	}
	if a.model.ID == "" && a.model.Provider == "" {
		a.model = UnknownModel()
	}
	if a.thinkingLevel == "" {
		a.thinkingLevel = ThinkingOff
	}
	if a.steeringMode == "" {
		a.steeringMode = QueueOneAtATime
	}
	if a.followUpMode == "" {
		a.followUpMode = QueueOneAtATime
	}
	if a.toolExecution == "" {
		a.toolExecution = ExecutionParallel
	}
	return a
}

// State returns a consistent copy of the state.
func (a *Agent) State() State {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := State{
		SystemPrompt:     a.systemPrompt,
		Model:            a.model,
		ThinkingLevel:    a.thinkingLevel,
		Tools:            append([]*Tool(nil), a.tools...),
		Messages:         append([]Message(nil), a.messages...),
		IsStreaming:      a.active != nil,
		PendingToolCalls: append([]string(nil), a.pending...),
		ErrorMessage:     a.errorMessage,
	}
	if a.streaming != nil {
		m := a.streaming.Clone()
		s.StreamingMessage = &m
	}
	return s
}

// Messages returns a copy of the transcript.
func (a *Agent) Messages() []Message {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Message(nil), a.messages...)
}

// IsStreaming reports whether a run is active.
func (a *Agent) IsStreaming() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.active != nil
}

// Setters. Changes apply to the next run: a run snapshots its configuration
// when it starts.

func (a *Agent) SetSystemPrompt(s string) { a.mu.Lock(); a.systemPrompt = s; a.mu.Unlock() }
func (a *Agent) SetModel(m Model)         { a.mu.Lock(); a.model = m; a.mu.Unlock() }
func (a *Agent) SetThinkingLevel(l ThinkingLevel) {
	a.mu.Lock()
	a.thinkingLevel = l
	a.mu.Unlock()
}
func (a *Agent) SetTools(t []*Tool) {
	a.mu.Lock()
	a.tools = append([]*Tool(nil), t...)
	a.mu.Unlock()
}
func (a *Agent) SetMessages(m []Message) {
	a.mu.Lock()
	a.messages = append([]Message(nil), m...)
	a.mu.Unlock()
}

// SetSteeringMode takes effect at the next drain point, also mid-run.
func (a *Agent) SetSteeringMode(m QueueMode) { a.mu.Lock(); a.steeringMode = m; a.mu.Unlock() }

// SetFollowUpMode takes effect at the next drain point, also mid-run.
func (a *Agent) SetFollowUpMode(m QueueMode)         { a.mu.Lock(); a.followUpMode = m; a.mu.Unlock() }
func (a *Agent) SetToolExecution(m ExecutionMode)    { a.mu.Lock(); a.toolExecution = m; a.mu.Unlock() }
func (a *Agent) SetSessionID(id string)              { a.mu.Lock(); a.sessionID = id; a.mu.Unlock() }
func (a *Agent) appendQueue(q *[]Message, m Message) { a.mu.Lock(); *q = append(*q, m); a.mu.Unlock() }

// Steer queues a message to be injected after the current turn.
func (a *Agent) Steer(m Message) { a.appendQueue(&a.steering, m) }

// FollowUp queues a message for when the agent would otherwise stop.
func (a *Agent) FollowUp(m Message) { a.appendQueue(&a.followUps, m) }

// ClearSteeringQueue drops queued steering messages.
func (a *Agent) ClearSteeringQueue() { a.mu.Lock(); a.steering = nil; a.mu.Unlock() }

// ClearFollowUpQueue drops queued follow-up messages.
func (a *Agent) ClearFollowUpQueue() { a.mu.Lock(); a.followUps = nil; a.mu.Unlock() }

// ClearAllQueues drops both queues.
func (a *Agent) ClearAllQueues() {
	a.mu.Lock()
	a.steering, a.followUps = nil, nil
	a.mu.Unlock()
}

// HasQueuedMessages reports whether either queue holds a message.
func (a *Agent) HasQueuedMessages() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.steering) > 0 || len(a.followUps) > 0
}

// drainLocked takes messages from a queue per mode. Caller holds mu.
func drainLocked(q *[]Message, mode QueueMode) []Message {
	if len(*q) == 0 {
		return nil
	}
	if mode == QueueAll {
		out := *q
		*q = nil
		return out
	}
	out := []Message{(*q)[0]}
	*q = (*q)[1:]
	if len(*q) == 0 {
		*q = nil
	}
	return out
}

func (a *Agent) drainSteering() []Message {
	a.mu.Lock()
	defer a.mu.Unlock()
	return drainLocked(&a.steering, a.steeringMode)
}

func (a *Agent) drainFollowUps() []Message {
	a.mu.Lock()
	defer a.mu.Unlock()
	return drainLocked(&a.followUps, a.followUpMode)
}

// Subscribe adds a listener; the returned function removes it.
func (a *Agent) Subscribe(fn Listener) (unsubscribe func()) {
	e := &listenerEntry{fn}
	a.mu.Lock()
	a.listeners = append(append([]*listenerEntry(nil), a.listeners...), e)
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		for i, x := range a.listeners {
			if x == e {
				a.listeners = append(append([]*listenerEntry(nil), a.listeners[:i]...), a.listeners[i+1:]...)
				return
			}
		}
	}
}

// Abort cancels the active run, if any. It never blocks.
func (a *Agent) Abort() {
	a.mu.Lock()
	r := a.active
	a.mu.Unlock()
	if r != nil {
		r.cancel()
	}
}

// WaitForIdle returns when no run is active (after the listeners of the
// last agent_end), or when ctx is done. Called from a listener it waits for
// a run that waits for that listener: it returns only when ctx is done.
func (a *Agent) WaitForIdle(ctx context.Context) error {
	a.mu.Lock()
	r := a.active
	a.mu.Unlock()
	if r == nil {
		return nil
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Reset clears the transcript, the run state and both queues. It refuses
// while a run is active.
func (a *Agent) Reset() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.active != nil {
		return errResetRunning
	}
	a.messages = nil
	a.streaming = nil
	a.pending = nil
	a.errorMessage = ""
	a.steering, a.followUps = nil, nil
	return nil
}

// Prompt adds a user message with text (and images) and runs the loop. It
// returns when the run is idle again. A run that ends in a model error is
// not an error of Prompt: see State().ErrorMessage and the last message.
func (a *Agent) Prompt(ctx context.Context, text string, images ...Content) error {
	return a.PromptMessages(ctx, UserText(text, images...))
}

// PromptMessages runs the loop with one or more messages as the prompt.
func (a *Agent) PromptMessages(ctx context.Context, msgs ...Message) error {
	a.mu.Lock()
	if a.active != nil {
		a.mu.Unlock()
		return errPromptRunning
	}
	r := a.startLocked(ctx)
	a.mu.Unlock()
	return a.execute(r, func(lr *loopRun) error { return lr.runPrompt(msgs) })
}

// Continue runs the loop from the current transcript. After an assistant
// message it runs queued steering (then follow-ups) as the prompt, as pi does.
func (a *Agent) Continue(ctx context.Context) error {
	a.mu.Lock()
	if a.active != nil {
		a.mu.Unlock()
		return errContinueRunning
	}
	if len(a.messages) == 0 {
		a.mu.Unlock()
		return errNoMessages
	}
	var exec func(lr *loopRun) error
	if a.messages[len(a.messages)-1].Role == RoleAssistant {
		if steer := drainLocked(&a.steering, a.steeringMode); len(steer) > 0 {
			exec = func(lr *loopRun) error {
				lr.skipInitialSteeringPoll = true
				return lr.runPrompt(steer)
			}
		} else if follow := drainLocked(&a.followUps, a.followUpMode); len(follow) > 0 {
			exec = func(lr *loopRun) error { return lr.runPrompt(follow) }
		} else {
			a.mu.Unlock()
			return errCannotContinue
		}
	} else {
		exec = func(lr *loopRun) error { return lr.runContinue() }
	}
	r := a.startLocked(ctx)
	a.mu.Unlock()
	return a.execute(r, exec)
}

// startLocked marks a run active and snapshots its configuration.
func (a *Agent) startLocked(parent context.Context) *loopRun {
	ctx, cancel := context.WithCancel(parent)
	run := &activeRun{ctx: ctx, cancel: cancel, done: make(chan struct{})}
	a.active = run
	a.streaming = nil
	a.errorMessage = ""
	reasoning := a.thinkingLevel
	if reasoning == ThinkingOff {
		reasoning = ""
	}
	return &loopRun{
		a:   a,
		ctx: ctx,
		run: run,
		cur: Context{
			SystemPrompt: a.systemPrompt,
			// Room for a turn's reply: a Message is a few hundred bytes
			// (unsafe.Sizeof), and a run that waits in a tool keeps this
			// slice for as long.
			Messages: append(make([]Message, 0, len(a.messages)+2), a.messages...),
			Tools:    append([]*Tool(nil), a.tools...),
		},
		model:         a.model,
		reasoning:     reasoning,
		toolExecution: a.toolExecution,
		sessionID:     a.sessionID,
		// Hooks that get the context before a turn ends (loop.go).
		attached: a.opts.TransformContext == nil && a.opts.ConvertToLLM == nil &&
			a.opts.BeforeToolCall == nil && a.opts.AfterToolCall == nil,
	}
}

// execute runs the loop, turns any failure into pi's synthesized error
// message with a full lifecycle, and finishes the run.
func (a *Agent) execute(lr *loopRun, exec func(*loopRun) error) (err error) {
	defer a.finishRun(lr.run)
	if runErr := catch(func() error { return exec(lr) }); runErr != nil {
		err = catch(func() error { return lr.fail(runErr) })
	}
	return err
}

func (a *Agent) finishRun(r *activeRun) {
	a.mu.Lock()
	a.streaming = nil
	a.pending = nil
	a.active = nil
	a.mu.Unlock()
	r.cancel()
	close(r.done)
}

// emit runs the reducer and then every listener for one event, serialised
// with all other emits of the agent.
func (a *Agent) emit(ctx context.Context, ev *Event) error {
	a.emitMu.Lock()
	defer a.emitMu.Unlock()
	a.mu.Lock()
	a.reduceLocked(ev)
	listeners := a.listeners
	a.mu.Unlock()
	for _, l := range listeners {
		if err := callListener(ctx, l.fn, ev); err != nil {
			return err
		}
	}
	return nil
}

func callListener(ctx context.Context, fn Listener, ev *Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = panicError(p)
		}
	}()
	return fn(ctx, *ev)
}

// reduceLocked is the one place where events become state.
func (a *Agent) reduceLocked(ev *Event) {
	switch ev.Type {
	case EventMessageStart:
		if ev.streamStart { // an assistant message starts streaming
			a.builder.Reset(*ev.Message)
			ev.Message = a.builder.Message()
		}
		a.streaming = ev.Message
	case EventMessageUpdate:
		a.builder.Apply(ev.StreamEvent)
		ev.Message = a.builder.Message()
		a.streaming = ev.Message
	case EventMessageEnd:
		a.streaming = nil
		a.messages = append(a.messages, *ev.Message)
		// The stream's buffers are not kept while the run waits (in a tool,
		// for hours perhaps).
		a.builder = MessageBuilder{}
	case EventToolExecutionStart:
		a.pending = append(append([]string(nil), a.pending...), ev.ToolCallID)
	case EventToolExecutionEnd:
		for i, id := range a.pending {
			if id == ev.ToolCallID {
				a.pending = append(append([]string(nil), a.pending[:i]...), a.pending[i+1:]...)
				break
			}
		}
	case EventTurnEnd:
		if ev.Message != nil && ev.Message.Role == RoleAssistant && ev.Message.ErrorMessage != "" {
			a.errorMessage = ev.Message.ErrorMessage
		}
	case EventAgentEnd:
		a.streaming = nil
	}
}

// catch runs f and turns a panic into an error.
func catch(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = panicError(p)
		}
	}()
	return f()
}

func panicError(p any) error {
	if e, ok := p.(error); ok {
		return fmt.Errorf("panic: %w", e)
	}
	return fmt.Errorf("panic: %v", p)
}

func nowMillis() int64 { return time.Now().UnixMilli() }
