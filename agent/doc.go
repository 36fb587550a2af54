// Package agent is a Go port of the pi agent core (@earendil-works/pi-agent-core
// 0.85.1): the agent loop and the Agent that wraps it with state. It knows
// nothing of NATS or of any particular model API; a model is a StreamFn.
//
// # Model
//
// A transcript is a []Message. Messages and content blocks are flat tagged
// structs that marshal to pi's JSON (roles user, assistant, toolResult,
// system/developer, and custom roles that round-trip unchanged), so
// transcripts and events are interchangeable with pi tools. An assistant
// message carries Usage and a StopReason: stop, length, toolUse, error or
// aborted.
//
// A StreamFn turns a Context (system prompt, messages, tools) into one
// assistant message, as an iterator of StreamEvents: start, text_*,
// thinking_*, toolcall_* and one final done or error. It never fails in any
// other way: request, model and runtime errors, and cancellation, arrive as
// a final message with StopReason error or aborted. Stream events are deltas;
// MessageBuilder folds them into the partial message (the Agent's reducer
// does, and so do receivers on the wire).
//
// # The loop
//
// Prompt and Continue start a run. A run emits agent_start, then turns: each
// turn injects pending steering messages, calls the model through
// TransformContext, ConvertToLLM and GetAPIKey, and executes the tool calls of
// the answer. Tools run in parallel (preflight in source order, execution
// concurrent, tool_execution_end in completion order, result messages in
// source order) or sequentially (Options.ToolExecution, or any called tool
// whose ExecutionMode is sequential); in a parallel batch a call not yet
// started when the run is aborted ends "Operation aborted" without running,
// and a listener failure fails the batch at once. Preflight looks the tool
// up, runs PrepareArguments, refuses arguments nested deeper than
// MaxArgumentDepth, coerces them as pi-ai does (JavaScript's Number() for a
// numeric string: "0x10" for a number becomes 16) and validates against the
// JSON Schema, then asks BeforeToolCall, which may block (and ask to
// terminate). Error results are clipped to a few KiB. AfterToolCall may
// override a result field by field. A message cut off by the token limit
// (stop reason length) fails all its calls without running them. Steering is
// polled after every turn; follow-ups when the agent would otherwise stop. A
// batch whose every result asks to terminate ends the run; PrepareNextTurn
// and ShouldStopAfterTurn run after each turn. Abort cancels the run's
// context, which the model stream, tools and hooks all receive.
//
// # Guarantees
//
//   - One reducer (Agent.reduceLocked) turns each event into state before any
//     listener sees it; listeners run one at a time, in subscription order,
//     and the run waits for them (back-pressure). Emits from parallel tools
//     are serialised.
//   - Prompt and Continue return when the run is idle again, after the
//     listeners of agent_end. A run that ends with a model error is not an
//     error of Prompt: the last message and State().ErrorMessage say why.
//     Refusals are ErrAlreadyRunning, ErrNoMessages and ErrCannotContinue.
//   - Nothing in a run can crash the process: a StreamFn or hook that panics,
//     or a listener that returns an error or panics, ends the run with pi's
//     synthesized error message and full lifecycle; a tool that panics or
//     fails yields an error result. Tool updates after the tool returned are
//     dropped.
//   - Every method is safe from any goroutine; State returns a consistent
//     copy. Runs leave no goroutine behind. Inside a listener every method
//     may be called except a blocking WaitForIdle: the run waits for the
//     listener, so WaitForIdle there returns only when its ctx is done.
//
// JSON the package writes (messages, canonical arguments) keeps <, > and &
// as they are, as JavaScript does: encode values holding messages with
// AppendJSON or MarshalJSON, not json.Marshal.
//
// Messages handed to listeners are shared with the state: read them, do not
// change them. The partial message of message_update, and its StreamEvent,
// change after the listener returns; Clone to keep them.
package agent
