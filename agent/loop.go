package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
)

// loopRun is one run of the agent loop: its own copy of the context, the
// configuration snapshotted at start, and the messages it added.
type loopRun struct {
	a   *Agent
	ctx context.Context
	run *activeRun

	cur           Context
	model         Model
	reasoning     ThinkingLevel
	toolExecution ExecutionMode
	sessionID     string

	// The run's new messages. While attached they are the tail of
	// cur.Messages from newFrom, not one more copy of them (the Agent's
	// state holds another): that saves a run waiting in a tool before its
	// first turn hook, for hours perhaps, a copy of its messages (1.1 KB in
	// docs/benchmarks/2026-12.md, 2026-12-02 afternoon). A run
	// is attached only while no function of the caller has been given the
	// context (a hook may rewrite it in place): from the first that is,
	// the messages are kept apart in own (see detach).
	newFrom                 int
	own                     []Message
	attached                bool
	skipInitialSteeringPoll bool
	streamEvent             StreamEvent
}

func (r *loopRun) emit(ev *Event) error { return r.a.emit(r.ctx, ev) }

// The loop's own frame stays on the stack while tools run (minutes, for
// thousands of runs at once): the events it emits and the messages it
// copies live in the frames of these helpers instead, so that a waiting
// run's stack is small enough for the runtime to shrink it.

//go:noinline
func (r *loopRun) emitType(t EventType) error { return r.emit(&Event{Type: t}) }

//go:noinline
func (r *loopRun) emitTurnEnd(msg *Message, results []Message) error {
	return r.emit(&Event{Type: EventTurnEnd, Message: msg, ToolResults: results})
}

//go:noinline
func (r *loopRun) emitAgentEnd() error {
	return r.emit(&Event{Type: EventAgentEnd, Messages: r.newMessages()})
}

// newMessages returns the messages this run added, in order.
func (r *loopRun) newMessages() []Message {
	if !r.attached {
		return r.own
	}
	n := len(r.cur.Messages)
	return r.cur.Messages[r.newFrom:n:n]
}

// startNew starts the run's new messages with first, which the caller
// adds to the context.
func (r *loopRun) startNew(first []Message) {
	if r.attached {
		r.newFrom = len(r.cur.Messages)
		return
	}
	r.own = append(make([]Message, 0, len(first)+2), first...)
}

// addMessages adds messages to the context and to the run's new ones.
func (r *loopRun) addMessages(ms ...Message) {
	r.cur.Messages = append(r.cur.Messages, ms...)
	if !r.attached {
		r.own = append(r.own, ms...)
	}
}

// detach copies the run's new messages out of the context: before a
// hook that gets the context, which it may change in place.
func (r *loopRun) detach() {
	if r.attached {
		r.own = append(make([]Message, 0, len(r.cur.Messages)-r.newFrom+2), r.cur.Messages[r.newFrom:]...)
		r.attached = false
	}
}

// addPending emits and records the steering or follow-up messages that
// start a turn.
//
//go:noinline
func (r *loopRun) addPending(pending []Message) error {
	for i := range pending {
		m := pending[i]
		if err := r.emitMessage(&m); err != nil {
			return err
		}
		r.addMessages(m)
	}
	return nil
}

// emitMessage emits message_start and message_end for a whole message.
func (r *loopRun) emitMessage(m *Message) error {
	if err := r.emit(&Event{Type: EventMessageStart, Message: m}); err != nil {
		return err
	}
	return r.emit(&Event{Type: EventMessageEnd, Message: m})
}

func (r *loopRun) runPrompt(prompts []Message) error {
	r.startNew(prompts)
	r.cur.Messages = append(r.cur.Messages, prompts...)
	if err := r.emit(&Event{Type: EventAgentStart}); err != nil {
		return err
	}
	if err := r.emit(&Event{Type: EventTurnStart}); err != nil {
		return err
	}
	for i := range prompts {
		m := prompts[i]
		if err := r.emitMessage(&m); err != nil {
			return err
		}
	}
	return r.loop()
}

func (r *loopRun) runContinue() error {
	r.startNew(nil)
	if err := r.emit(&Event{Type: EventAgentStart}); err != nil {
		return err
	}
	if err := r.emit(&Event{Type: EventTurnStart}); err != nil {
		return err
	}
	return r.loop()
}

func (r *loopRun) pollSteering() []Message {
	if r.skipInitialSteeringPoll {
		r.skipInitialSteeringPoll = false
		return nil
	}
	return r.a.drainSteering()
}

// loop is pi's runLoop: the inner loop runs turns while there are tool calls
// or steering messages; the outer loop picks up follow-ups.
func (r *loopRun) loop() error {
	firstTurn := true
	pending := r.pollSteering()
	for {
		hasMoreToolCalls := true
		for hasMoreToolCalls || len(pending) > 0 {
			if !firstTurn {
				if err := r.emitType(EventTurnStart); err != nil {
					return err
				}
			} else {
				firstTurn = false
			}
			if err := r.addPending(pending); err != nil {
				return err
			}
			pending = nil

			msg, err := r.streamAssistant()
			if err != nil {
				return err
			}
			if !r.attached { // else streamAssistant added it to the context
				r.own = append(r.own, *msg)
			}
			if msg.StopReason == StopReasonError || msg.StopReason == StopReasonAborted {
				if err := r.emitTurnEnd(msg, nil); err != nil {
					return err
				}
				return r.emitAgentEnd()
			}

			var results []Message
			hasMoreToolCalls = false
			if calls := msg.ToolCalls(); len(calls) > 0 {
				var terminate bool
				if msg.StopReason == StopReasonLength {
					results, err = r.failTruncated(calls)
				} else {
					results, terminate, err = r.executeToolCalls(msg, calls)
				}
				if err != nil {
					return err
				}
				hasMoreToolCalls = !terminate
				r.addMessages(results...)
			}
			if err := r.emitTurnEnd(msg, results); err != nil {
				return err
			}

			if stop, err := r.afterTurn(msg, results); err != nil {
				return err
			} else if stop {
				return r.emitAgentEnd()
			}
			pending = r.pollSteering()
		}
		if followUps := r.a.drainFollowUps(); len(followUps) > 0 {
			pending = followUps
			continue
		}
		break
	}
	return r.emitAgentEnd()
}

// afterTurn runs PrepareNextTurn and ShouldStopAfterTurn.
func (r *loopRun) afterTurn(msg *Message, results []Message) (bool, error) {
	opts := &r.a.opts
	if opts.PrepareNextTurn == nil && opts.ShouldStopAfterTurn == nil {
		return false, nil
	}
	r.detach()
	tc := &TurnContext{Message: msg, ToolResults: results, Context: &r.cur, NewMessages: r.own}
	if opts.PrepareNextTurn != nil {
		next, err := opts.PrepareNextTurn(r.ctx, tc)
		if err != nil {
			return false, err
		}
		if next != nil {
			if next.Context != nil {
				r.cur = *next.Context
			}
			if next.Model != nil {
				r.model = *next.Model
			}
			switch next.ThinkingLevel {
			case "":
			case ThinkingOff:
				r.reasoning = ""
			default:
				r.reasoning = next.ThinkingLevel
			}
		}
		tc.Context = &r.cur
	}
	if opts.ShouldStopAfterTurn != nil {
		return opts.ShouldStopAfterTurn(r.ctx, tc)
	}
	return false, nil
}

// DefaultConvertToLLM keeps the roles a model understands and drops custom
// messages.
func DefaultConvertToLLM(_ context.Context, msgs []Message) ([]Message, error) {
	for i := range msgs {
		if msgs[i].IsCustom() {
			out := make([]Message, 0, len(msgs))
			for _, m := range msgs {
				if !m.IsCustom() {
					out = append(out, m)
				}
			}
			return out, nil
		}
	}
	return msgs, nil
}

var errNoStreamFn = errors.New("No stream function configured. Pass StreamFn in agent.Options.")

// streamAssistant asks the model for the next assistant message and emits
// message_start, message_update and message_end for it.
func (r *loopRun) streamAssistant() (*Message, error) {
	opts := &r.a.opts
	msgs := r.cur.Messages
	var err error
	if opts.TransformContext != nil {
		if msgs, err = opts.TransformContext(r.ctx, msgs); err != nil {
			return nil, err
		}
	}
	convert := opts.ConvertToLLM
	if convert == nil {
		convert = DefaultConvertToLLM
	}
	if msgs, err = convert(r.ctx, msgs); err != nil {
		return nil, err
	}
	apiKey := ""
	if opts.GetAPIKey != nil {
		if apiKey, err = opts.GetAPIKey(r.ctx, r.model.Provider); err != nil {
			return nil, err
		}
	}
	if apiKey == "" {
		apiKey = opts.APIKey
	}
	if opts.StreamFn == nil {
		return nil, errNoStreamFn
	}
	llm := Context{SystemPrompt: r.cur.SystemPrompt, Messages: msgs, Tools: r.cur.Tools}
	so := StreamOptions{APIKey: apiKey, Reasoning: r.reasoning, SessionID: r.sessionID,
		Temperature: opts.Temperature, MaxTokens: opts.MaxTokens}

	var final *Message
	started := false
	var emitErr error
	err = catch(func() error {
		for ev := range opts.StreamFn(r.ctx, r.model, llm, so) {
			switch ev.Type {
			case StreamStart:
				if started {
					continue
				}
				started = true
				hdr := Message{Role: RoleAssistant}
				if ev.Message != nil {
					hdr = *ev.Message
				}
				emitErr = r.emit(&Event{Type: EventMessageStart, Message: &hdr, streamStart: true})
			case StreamDone, StreamError:
				if ev.Message != nil {
					m := *ev.Message
					final = &m
				} else {
					final = &Message{Role: RoleAssistant, StopReason: StopReasonError, ErrorMessage: "stream ended without a message"}
				}
			default:
				if !started {
					continue
				}
				// One StreamEvent per run, overwritten: listeners must not keep it.
				r.streamEvent = ev
				emitErr = r.emit(&Event{Type: EventMessageUpdate, StreamEvent: &r.streamEvent})
			}
			if emitErr != nil || final != nil {
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if emitErr != nil {
		return nil, emitErr
	}
	if final == nil {
		final = r.unfinishedStream()
	}
	if final.Role == "" {
		final.Role = RoleAssistant
	}
	if !started {
		if err := r.emit(&Event{Type: EventMessageStart, Message: final}); err != nil {
			return nil, err
		}
	}
	if err := r.emit(&Event{Type: EventMessageEnd, Message: final}); err != nil {
		return nil, err
	}
	r.cur.Messages = append(r.cur.Messages, *final)
	return final, nil
}

// unfinishedStream is the message for a stream function that returned
// without a final event (a broken contract): what streamed, as an error.
func (r *loopRun) unfinishedStream() *Message {
	r.a.mu.Lock()
	m := r.a.builder.Message().Clone()
	r.a.mu.Unlock()
	m.Role = RoleAssistant
	m.StopReason = StopReasonError
	m.ErrorMessage = "Stream ended without a final event"
	if r.ctx.Err() != nil {
		m.StopReason = StopReasonAborted
		m.ErrorMessage = "Request was aborted"
	}
	if m.Timestamp == 0 {
		m.Timestamp = nowMillis()
	}
	return &m
}

// fail is pi's handleRunFailure: the error becomes an assistant message
// with a full lifecycle after whatever the run emitted.
func (r *loopRun) fail(err error) error {
	reason := StopReasonError
	if r.ctx.Err() != nil {
		reason = StopReasonAborted
	}
	msg := &Message{
		Role: RoleAssistant, Content: []Content{Text("")},
		API: r.model.API, Provider: r.model.Provider, Model: r.model.ID,
		StopReason: reason, ErrorMessage: err.Error(), Timestamp: nowMillis(),
	}
	if err := r.emitMessage(msg); err != nil {
		return err
	}
	if err := r.emit(&Event{Type: EventTurnEnd, Message: msg}); err != nil {
		return err
	}
	return r.emit(&Event{Type: EventAgentEnd, Messages: []Message{*msg}})
}

// toolOutcome is a finalised tool call.
type toolOutcome struct {
	call    Content
	result  ToolResult
	isError bool
	err     error // a listener failed while the tool ran
}

type preparedCall struct {
	tool *Tool
	call Content
	args map[string]any
}

// maxErrorText bounds the text of an error result, as the worker bounds a
// successful one: an error may quote its input, and the input may be huge.
const maxErrorText = 4 << 10

func errorOutcome(call Content, text string) *toolOutcome {
	return &toolOutcome{call: call, result: TextResult(clipText(text, maxErrorText)), isError: true}
}

func (r *loopRun) findTool(name string) *Tool {
	for _, t := range r.cur.Tools {
		if t.Name == name {
			return t
		}
	}
	return nil
}

func (r *loopRun) executeToolCalls(assistant *Message, calls []Content) ([]Message, bool, error) {
	sequential := r.toolExecution == ExecutionSequential
	for _, c := range calls {
		if t := r.findTool(c.Name); t != nil && t.ExecutionMode == ExecutionSequential {
			sequential = true
		}
	}
	if sequential {
		return r.executeSequential(assistant, calls)
	}
	return r.executeParallel(assistant, calls)
}

func (r *loopRun) executeSequential(assistant *Message, calls []Content) ([]Message, bool, error) {
	results := make([]Message, 0, len(calls))
	terminate := true
	for _, call := range calls {
		if err := r.emitToolStart(call); err != nil {
			return nil, false, err
		}
		p, out := r.prepare(assistant, call)
		if p != nil {
			out = r.runPrepared(r.ctx, r.emit, assistant, p)
			if out.err != nil {
				return nil, false, out.err
			}
		}
		if err := r.emitToolEnd(out); err != nil {
			return nil, false, err
		}
		msg := toolResultMessage(out)
		if err := r.emitMessage(&msg); err != nil {
			return nil, false, err
		}
		results = append(results, msg)
		terminate = terminate && out.result.Terminate
		if r.ctx.Err() != nil {
			break
		}
	}
	return results, len(results) > 0 && terminate, nil
}

func (r *loopRun) executeParallel(assistant *Message, calls []Content) ([]Message, bool, error) {
	prepared, outcomes, err := r.prepareBatch(assistant, calls)
	if err != nil {
		return nil, false, err
	}
	if err := r.runBatch(assistant, prepared, outcomes); err != nil {
		return nil, false, err
	}
	return r.emitToolResults(outcomes)
}

// prepareBatch emits tool_execution_start for each call and prepares it;
// a call that fails preparation gets its outcome and its end at once.
//
//go:noinline
func (r *loopRun) prepareBatch(assistant *Message, calls []Content) ([]*preparedCall, []*toolOutcome, error) {
	outcomes := make([]*toolOutcome, len(calls))
	prepared := make([]*preparedCall, len(calls))
	for i, call := range calls {
		if err := r.emitToolStart(call); err != nil {
			return nil, nil, err
		}
		p, out := r.prepare(assistant, call)
		if p != nil {
			prepared[i] = p
		} else {
			outcomes[i] = out
			if err := r.emitToolEnd(out); err != nil {
				return nil, nil, err
			}
		}
		if r.ctx.Err() != nil {
			break
		}
	}
	return prepared, outcomes, nil
}

// emitToolResults emits the batch's tool result messages in call order.
// Its own frame: executeParallel's stays on the stack while tools run.
//
//go:noinline
func (r *loopRun) emitToolResults(outcomes []*toolOutcome) ([]Message, bool, error) {
	results := make([]Message, 0, len(outcomes))
	terminate := true
	for _, out := range outcomes {
		if out == nil {
			continue
		}
		msg := toolResultMessage(out)
		if err := r.emitMessage(&msg); err != nil {
			return nil, false, err
		}
		results = append(results, msg)
		terminate = terminate && out.result.Terminate
	}
	return results, len(results) > 0 && terminate, nil
}

// runBatch executes the prepared calls of a parallel batch concurrently and
// fills their outcomes. As in pi, a call not yet started when the run is
// aborted ends "Operation aborted" without running, and the first listener
// failure fails the batch at once: the other calls are cancelled and their
// events dropped (the run waits for them to return, so none outlives it).
func (r *loopRun) runBatch(assistant *Message, prepared []*preparedCall, outcomes []*toolOutcome) error {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	var mu sync.Mutex // held across each emit, so no event follows a failure
	var failed error
	fail := func(err error) error {
		if failed == nil {
			failed = err
			cancel()
		}
		return failed
	}
	emit := func(ev *Event) error {
		mu.Lock()
		defer mu.Unlock()
		if failed != nil {
			return failed
		}
		if err := r.emit(ev); err != nil {
			return fail(err)
		}
		return nil
	}
	run := func(i int) {
		out := r.runPrepared(ctx, emit, assistant, prepared[i])
		outcomes[i] = out
		if out.err != nil {
			mu.Lock()
			fail(out.err)
			mu.Unlock()
			return
		}
		_ = emit(toolEndEvent(out))
	}
	n := 0
	for _, p := range prepared {
		if p != nil {
			n++
		}
	}
	var wg sync.WaitGroup
	for i, p := range prepared {
		if p == nil {
			continue
		}
		if r.ctx.Err() != nil {
			outcomes[i] = errorOutcome(p.call, abortedText)
			if emit(toolEndEvent(outcomes[i])) != nil {
				break
			}
			continue
		}
		if n == 1 {
			run(i)
		} else {
			wg.Go(func() { run(i) })
		}
	}
	wg.Wait()
	return failed
}

func (r *loopRun) emitToolStart(call Content) error {
	return r.emit(&Event{Type: EventToolExecutionStart, ToolCallID: call.ID, ToolName: call.Name, Args: call.Arguments})
}

func (r *loopRun) emitToolEnd(out *toolOutcome) error { return r.emit(toolEndEvent(out)) }

func toolEndEvent(out *toolOutcome) *Event {
	res := out.result
	return &Event{Type: EventToolExecutionEnd, ToolCallID: out.call.ID, ToolName: out.call.Name,
		Result: &res, IsError: out.isError}
}

const abortedText = "Operation aborted"

// prepare is pi's tool preflight: lookup, argument preparation, validation
// and beforeToolCall. It returns either a call ready to run or an outcome
// that ends the call at once.
func (r *loopRun) prepare(assistant *Message, call Content) (*preparedCall, *toolOutcome) {
	tool := r.findTool(call.Name)
	if tool == nil {
		return nil, errorOutcome(call, fmt.Sprintf("Tool %s not found", call.Name))
	}
	var prepared *preparedCall
	var immediate *toolOutcome
	err := catch(func() error {
		args := call.Arguments
		if tool.PrepareArguments != nil {
			var err error
			if args, err = tool.PrepareArguments(args); err != nil {
				return err
			}
		}
		validated, err := tool.ValidateArguments(args)
		if err != nil {
			return err
		}
		if hook := r.a.opts.BeforeToolCall; hook != nil {
			res, err := hook(r.ctx, &BeforeToolCallContext{AssistantMessage: assistant, ToolCall: call, Args: validated, Context: &r.cur})
			if err != nil {
				return err
			}
			if r.ctx.Err() != nil {
				immediate = errorOutcome(call, abortedText)
				return nil
			}
			if res != nil && res.Block {
				reason := res.Reason
				if reason == "" {
					reason = "Tool execution was blocked"
				}
				immediate = errorOutcome(call, reason)
				immediate.result.Terminate = res.Terminate
				return nil
			}
		}
		if r.ctx.Err() != nil {
			immediate = errorOutcome(call, abortedText)
			return nil
		}
		prepared = &preparedCall{tool: tool, call: call, args: validated}
		return nil
	})
	if err != nil {
		return nil, errorOutcome(call, err.Error())
	}
	return prepared, immediate
}

// runPrepared executes a prepared call with ctx and applies afterToolCall.
// Updates the tool reports are emitted at once; those after it returned are
// dropped.
func (r *loopRun) runPrepared(ctx context.Context, emit func(*Event) error, assistant *Message, p *preparedCall) *toolOutcome {
	out := &toolOutcome{call: p.call}
	var mu sync.Mutex
	closed := false
	update := func(partial ToolResult) {
		mu.Lock()
		defer mu.Unlock()
		if closed || out.err != nil {
			return
		}
		out.err = emit(&Event{Type: EventToolExecutionUpdate, ToolCallID: p.call.ID, ToolName: p.call.Name,
			Args: p.call.Arguments, Result: &partial})
	}
	var result ToolResult
	err := catch(func() error {
		if p.tool.Execute == nil {
			return fmt.Errorf("tool %s has no Execute function", p.tool.Name)
		}
		var err error
		result, err = p.tool.Execute(ctx, p.call.ID, p.args, update)
		return err
	})
	mu.Lock()
	closed = true
	mu.Unlock()
	if err != nil {
		result, out.isError = TextResult(clipText(err.Error(), maxErrorText)), true
	}
	if hook := r.a.opts.AfterToolCall; hook != nil {
		var after *AfterToolCallResult
		herr := catch(func() error {
			var err error
			after, err = hook(ctx, &AfterToolCallContext{AssistantMessage: assistant, ToolCall: p.call,
				Args: p.args, Result: result, IsError: out.isError, Context: &r.cur})
			return err
		})
		switch {
		case herr != nil:
			result, out.isError = TextResult(clipText(herr.Error(), maxErrorText)), true
		case after != nil:
			if after.Content != nil {
				result.Content = after.Content
			}
			if after.Details != nil {
				result.Details = after.Details
			}
			if after.IsError != nil {
				out.isError = *after.IsError
			}
			if after.Terminate != nil {
				result.Terminate = *after.Terminate
			}
		}
	}
	out.result = result
	return out
}

func truncatedText(name string) string {
	return `Tool call "` + name + `" was not executed: the response hit the output token limit, so its arguments may be truncated. Re-issue the tool call with complete arguments.`
}

// failTruncated fails every call of a message cut off by the token limit.
func (r *loopRun) failTruncated(calls []Content) ([]Message, error) {
	results := make([]Message, 0, len(calls))
	for _, call := range calls {
		if err := r.emitToolStart(call); err != nil {
			return nil, err
		}
		out := errorOutcome(call, truncatedText(call.Name))
		if err := r.emitToolEnd(out); err != nil {
			return nil, err
		}
		msg := toolResultMessage(out)
		if err := r.emitMessage(&msg); err != nil {
			return nil, err
		}
		results = append(results, msg)
	}
	return results, nil
}

func toolResultMessage(out *toolOutcome) Message {
	m := Message{
		Role:       RoleToolResult,
		ToolCallID: out.call.ID,
		ToolName:   out.call.Name,
		Content:    out.result.Content,
		IsError:    out.isError,
		Timestamp:  nowMillis(),
	}
	if m.Content == nil {
		m.Content = []Content{}
	}
	if len(out.result.AddedToolNames) > 0 {
		m.AddedToolNames = out.result.AddedToolNames
	}
	switch d := out.result.Details.(type) {
	case nil:
	case json.RawMessage:
		m.Details = d
	default:
		if b, err := MarshalJSON(d); err == nil {
			m.Details = b
		}
	}
	return m
}
