// Package runtrace makes the OpenTelemetry spans of a worker's attempts:
// invoke_agent, and under it the model calls, tool calls, waits, lease and
// record writes (the GenAI conventions' content comes from
// worker/internal/genai).
package runtrace

import (
	"context"
	"encoding/json"
	"errors"
	"iter"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/tracing"
	"github.com/agentfleet/agentfleet/worker/internal/genai"
	"github.com/agentfleet/agentfleet/worker/internal/metering"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.38.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Spans of an attempt (GenAI semantic conventions 1.41 and ours):
//
//	agentfleet.queue.wait        submitted -> picked up (first attempt only;
//	                             invoke_agent's child when the request has
//	                             no trace context, else its sibling)
//	invoke_agent                 the attempt, from pickup to its end
//	  agentfleet.lease.take      the record's compare-and-set that takes the run
//	  chat <model>               one model call, as the agent sees it
//	    agentfleet.ratelimit.wait  waiting for the fleet's shared limits
//	  execute_tool <name>        one tool call
//	  agentfleet.approval.wait   a gated call waiting for its answer
//	  agentfleet.budget.wait     waiting for the tenant's budget (under
//	                             the model call when it is the call's)
//	  agentfleet.record.write    the final record
//
// The request's traceparent header is their parent; control messages and
// earlier attempts are links of invoke_agent. History a resumed attempt
// restores makes no spans: only the model and tool calls it makes do.

const tracerName = "github.com/agentfleet/agentfleet/worker"

// Span names and our attributes.
const (
	spanQueueWait   = "agentfleet.queue.wait"
	SpanLeaseTake   = "agentfleet.lease.take"
	SpanRecord      = "agentfleet.record.write"
	spanLimitWait   = "agentfleet.ratelimit.wait"
	SpanInvoke      = "invoke_agent"
	attrRunID       = attribute.Key("agentfleet.run.id")
	attrQueue       = attribute.Key("agentfleet.queue")
	attrAttempt     = attribute.Key("agentfleet.attempt")
	attrWorker      = attribute.Key("agentfleet.worker")
	attrResumed     = attribute.Key("agentfleet.resumed")
	attrCost        = attribute.Key("agentfleet.cost_usd")
	attrUsageSource = attribute.Key("agentfleet.usage.source")
	attrFirstChunk  = attribute.Key("agentfleet.time_to_first_chunk_ms")
	attrStatus      = attribute.Key("agentfleet.run.status")
	attrLinkKind    = attribute.Key("agentfleet.link")
	attrCtlSeq      = attribute.Key("agentfleet.control.seq")
	attrGroup       = attribute.Key("agentfleet.ratelimit.group")
	attrWaitFor     = attribute.Key("agentfleet.wait.for")
	attrWaitOutcome = attribute.Key("agentfleet.wait.outcome")
	attrDecision    = attribute.Key("agentfleet.approval.decision")
	AttrGiveUp      = attribute.Key("agentfleet.give_up")
)

// MaxContent bounds each recorded gen_ai.*.messages / tool argument or
// result attribute, in bytes.
const MaxContent = 64 << 10

// NewTracer is the worker's tracer of tp; nil when tp does not trace.
func NewTracer(tp trace.TracerProvider) trace.Tracer {
	switch tp.(type) {
	case nil, noop.TracerProvider, *noop.TracerProvider:
		return nil
	}
	return tp.Tracer(tracerName, trace.WithSchemaURL(semconv.SchemaURL))
}

// Attempt is an attempt's invoke_agent span and what its end reports.
// The worker's tracer is passed to each call that makes a span (nil: the
// worker does not trace).
type Attempt struct {
	Span trace.Span      // nil when the worker does not trace
	ctx  context.Context // carries Span, for its children made after the fact
	id   Identity

	mu     sync.Mutex
	usage  agent.Usage // this attempt's model calls
	status string
}

// Identity is what invoke_agent says of its attempt.
type Identity struct {
	Run, Queue, Worker string
	Attempt            int
	// Started is the attempt's pickup; Submitted, when known, the
	// request's publication.
	Started, Submitted time.Time
}

// GaveUp starts invoke_agent for a give-up's own attempt, a child of the
// request's trace context (h, the stored request's headers), before the
// give-up's finish (its run_started then carries the span). Call the
// returned func with the finish's error, then End:
//
//	failed := a.GaveUp(tracer, id, req.Header)
//	err := finish()
//	failed(err)
//	a.End(model, began)
//
// The finish sets run.status failed and error.type gave_up; a give-up
// that found the run finished, or lost the lease, ends "not_started".
func (a *Attempt) GaveUp(t trace.Tracer, id Identity, h nats.Header) func(err error) {
	a.Begin(t, id, h)
	if a.Span == nil {
		return func(error) {}
	}
	a.Span.SetAttributes(AttrGiveUp.Bool(true))
	return func(err error) {
		a.mu.Lock()
		finished := a.status != ""
		a.mu.Unlock()
		if err != nil && !finished {
			a.Span.SetAttributes(semconv.ErrorTypeKey.String(genai.ErrorType(err)))
			a.Span.SetStatus(codes.Error, "")
		}
	}
}

// Begin starts the attempt's spans, children of the request's trace
// context (h, its headers).
func (a *Attempt) Begin(t trace.Tracer, id Identity, h nats.Header) {
	a.id = id
	if t == nil {
		return
	}
	ctx := context.Background()
	sc := tracing.Extract(h)
	if sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	a.ctx, a.Span = t.Start(ctx, SpanInvoke, trace.WithTimestamp(id.Started), trace.WithAttributes(
		semconv.GenAIOperationNameInvokeAgent, semconv.GenAIConversationID(id.Run),
		attrRunID.String(id.Run), attrQueue.String(id.Queue), attrAttempt.Int(id.Attempt),
		attrWorker.String(id.Worker), attrResumed.Bool(false)))
	if id.Attempt == 1 && !id.Submitted.IsZero() && id.Submitted.Before(id.Started) {
		// A sibling of invoke_agent under the submitter's span; without
		// one, invoke_agent's child, so that both are one trace.
		if !sc.IsValid() {
			ctx = a.ctx
		}
		_, s := t.Start(ctx, spanQueueWait, trace.WithTimestamp(id.Submitted), trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(attrRunID.String(id.Run), attrQueue.String(id.Queue)))
		s.End(trace.WithTimestamp(id.Started))
	}
}

// End ends invoke_agent with the attempt's model (zero: none chosen),
// usage and outcome; began says the attempt took its run (a run_started
// of its own).
func (a *Attempt) End(model bus.ModelRef, began bool) {
	s := a.Span
	if s == nil {
		return
	}
	a.mu.Lock()
	u, status := a.usage, a.status
	a.mu.Unlock()
	attrs := append(genai.UsageAttrs(u, make([]attribute.KeyValue, 0, 10)), attrCost.Float64(u.Cost.Total))
	if !model.IsZero() {
		attrs = append(attrs, semconv.GenAIProviderNameKey.String(model.Provider), semconv.GenAIRequestModel(model.ID))
	}
	switch {
	case status != "":
	case began:
		status = "handed_back"
	default:
		status = "not_started" // refused at pickup, or handed back before its lease
	}
	attrs = append(attrs, attrStatus.String(status))
	s.SetAttributes(attrs...)
	s.End()
}

// Resumed notes a resume's outcome: agentfleet.resumed when it restored
// a transcript, and the run.status of an attempt that found the run
// finished already (only its ack had been lost).
func (a *Attempt) Resumed(restored, alreadyFinished bool) {
	s := a.Span
	if s == nil {
		return
	}
	s.SetAttributes(attrResumed.Bool(restored))
	if alreadyFinished {
		a.mu.Lock()
		a.status = "already_finished"
		a.mu.Unlock()
	}
}

// Finished notes the run's outcome for invoke_agent.
func (a *Attempt) Finished(fin bus.RunFinished) {
	s := a.Span
	if s == nil {
		return
	}
	a.mu.Lock()
	a.status = fin.Status
	a.mu.Unlock()
	if fin.Status != bus.StatusSucceeded {
		errType := fin.Reason
		if errType == "" {
			errType = fin.Status
		}
		s.SetAttributes(semconv.ErrorTypeKey.String(errType))
		s.SetStatus(codes.Error, clip(fin.Error, 1024))
	}
}

// Context returns ctx carrying invoke_agent: the agent's model and tool
// calls become its children.
func (a *Attempt) Context(ctx context.Context) context.Context {
	if a.Span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, a.Span)
}

// Traceparent is invoke_agent's, for run_started ("" when not tracing).
func (a *Attempt) Traceparent() string {
	if a.Span == nil {
		return ""
	}
	return tracing.Traceparent(a.Span.SpanContext())
}

// Step records a step of the attempt that already happened (a lease or
// record write) as a child of invoke_agent.
func (a *Attempt) Step(t trace.Tracer, name string, start time.Time, err error) {
	if a.Span == nil {
		return
	}
	parent := a.ctx
	if parent == nil { // Span set without Begin (tests)
		parent = trace.ContextWithSpan(context.Background(), a.Span)
	}
	// No attributes: invoke_agent, the parent, names the run.
	_, s := t.Start(parent, name, trace.WithTimestamp(start), trace.WithSpanKind(trace.SpanKindClient))
	if err != nil {
		s.SetAttributes(semconv.ErrorTypeKey.String(genai.ErrorType(err)))
		s.SetStatus(codes.Error, clip(err.Error(), 1024))
	}
	s.End()
}

// LimitWait records a wait for the shared rate limits (only one that
// waited or failed), a child of the model call in ctx.
func LimitWait(t trace.Tracer, ctx context.Context, group string, start time.Time, waited time.Duration, err error) {
	if t == nil {
		return
	}
	genai.RestartFirstChunk(ctx)
	if waited <= 0 && err == nil {
		return
	}
	_, s := t.Start(ctx, spanLimitWait, trace.WithTimestamp(start), trace.WithAttributes(attrGroup.String(group)))
	if err != nil {
		s.SetAttributes(semconv.ErrorTypeKey.String(genai.ErrorType(err)))
		s.SetStatus(codes.Error, clip(err.Error(), 1024))
	}
	s.End()
}

// Wait starts a span for a wait without the run's slot:
// agentfleet.<what>.wait, a child of the span in ctx (the model call for a
// budget wait, else invoke_agent). ctx carries it, for ApprovalDecision;
// end it with the wait's outcome.
func (a *Attempt) Wait(t trace.Tracer, ctx context.Context, what string, since time.Time) (context.Context, func(err error, handedBack bool)) {
	if t == nil {
		return ctx, func(error, bool) {}
	}
	parent := ctx
	if !trace.SpanContextFromContext(ctx).IsValid() {
		parent = a.Context(ctx)
	}
	// A wait an earlier attempt began shows from this attempt's pickup on.
	start := since
	if start.Before(a.id.Started) || start.IsZero() {
		start = a.id.Started
	}
	_, span := t.Start(parent, "agentfleet."+what+".wait", trace.WithTimestamp(start),
		trace.WithAttributes(attrRunID.String(a.id.Run), attrWaitFor.String(what)))
	return trace.ContextWithSpan(ctx, span), func(err error, handedBack bool) {
		genai.RestartFirstChunk(ctx)
		switch {
		case handedBack:
			span.SetAttributes(attrWaitOutcome.String("handed_back"))
		case err != nil:
			span.SetAttributes(attrWaitOutcome.String("stopped"), semconv.ErrorTypeKey.String(genai.ErrorType(err)))
			span.SetStatus(codes.Error, "")
		}
		span.End()
	}
}

// ApprovalDecision notes on the approval wait in ctx (Wait) its tool
// call and how it was answered: the answer's decision, "timeout", or
// nothing ("") when the wait was stopped or handed back.
func ApprovalDecision(t trace.Tracer, ctx context.Context, callID, decision string, timedOut bool) {
	span := trace.SpanFromContext(ctx)
	if t == nil || !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{semconv.GenAIToolCallID(callID)}
	switch {
	case decision != "":
		attrs = append(attrs, attrDecision.String(decision))
	case timedOut:
		attrs = append(attrs, attrDecision.String(bus.DecisionTimeout))
	}
	span.SetAttributes(attrs...)
}

// Control links invoke_agent to the sender of a control message.
func (a *Attempt) Control(kind string, seq uint64, h nats.Header) {
	if a.Span == nil {
		return
	}
	if sc := tracing.Extract(h); sc.IsValid() {
		a.Span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
			attrLinkKind.String("control." + kind), attrCtlSeq.Int64(int64(seq))}})
	}
}

// EarlierAttempts links a resumed attempt's invoke_agent to the
// invoke_agent of every earlier attempt (their run_started traceparent).
func (a *Attempt) EarlierAttempts(envs []*bus.Envelope) {
	if a.Span == nil {
		return
	}
	for _, e := range envs {
		if e.Type != bus.EventRunStarted || e.Attempt >= a.id.Attempt {
			continue
		}
		var s struct {
			Traceparent string `json:"traceparent"`
		}
		if json.Unmarshal(e.Event, &s) != nil {
			continue
		}
		if sc := tracing.ParseTraceparent(s.Traceparent, ""); sc.IsValid() {
			a.Span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
				attrLinkKind.String("earlier_attempt"), attrAttempt.Int(e.Attempt)}})
		}
	}
}

// Stream makes a chat span of each model call of fn of the run, with its
// content when capture. usageSource, when it knows, says how a call's
// usage was worked out.
func (a *Attempt) Stream(t trace.Tracer, capture bool, run string, fn agent.StreamFn, usageSource func(ctx context.Context) (string, bool)) agent.StreamFn {
	if t == nil {
		return fn
	}
	return func(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			attrs := []attribute.KeyValue{semconv.GenAIOperationNameChat, semconv.GenAIProviderNameKey.String(model.Provider),
				semconv.GenAIRequestModel(model.ID), semconv.GenAIConversationID(run)}
			if opts.MaxTokens > 0 {
				attrs = append(attrs, semconv.GenAIRequestMaxTokens(opts.MaxTokens))
			}
			if opts.Temperature != nil {
				attrs = append(attrs, semconv.GenAIRequestTemperature(*opts.Temperature))
			}
			if capture {
				attrs = append(attrs, semconv.GenAIInputMessagesKey.String(genai.ContentJSON(genai.Messages(llm.Messages, false), MaxContent)))
				if llm.SystemPrompt != "" {
					attrs = append(attrs, semconv.GenAISystemInstructionsKey.String(genai.ContentJSON([]genai.Part{{Type: "text", Content: llm.SystemPrompt}}, MaxContent)))
				}
			}
			ctx, span := t.Start(ctx, "chat "+model.ID, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
			defer span.End()
			ctx, sinceStart := genai.StartFirstChunk(ctx)
			first := time.Duration(-1)
			for ev := range fn(ctx, model, llm, opts) {
				if first < 0 {
					first = sinceStart()
				}
				if (ev.Type == agent.StreamDone || ev.Type == agent.StreamError) && ev.Message != nil {
					a.Response(span, ev.Message, first, capture)
					if src, ok := usageSource(ctx); ok {
						span.SetAttributes(attrUsageSource.String(src))
					}
				}
				if !yield(ev) {
					return
				}
			}
		}
	}
}

// Response puts a model call's answer on its chat span.
func (a *Attempt) Response(span trace.Span, m *agent.Message, first time.Duration, capture bool) {
	u := metering.NonNegative(m.Usage)
	a.mu.Lock()
	a.usage.Add(u)
	a.mu.Unlock()
	model := m.ResponseModel
	if model == "" {
		model = m.Model
	}
	// One SetAttributes: each call may grow the span's attribute slice.
	attrs := genai.UsageAttrs(u, make([]attribute.KeyValue, 0, 14))
	attrs = append(attrs, semconv.GenAIResponseFinishReasons(genai.FinishReason(m.StopReason)...),
		attrCost.Float64(u.Cost.Total), attrFirstChunk.Int64(first.Milliseconds()))
	if model != "" {
		attrs = append(attrs, semconv.GenAIResponseModel(model))
	}
	if m.ResponseID != "" {
		attrs = append(attrs, semconv.GenAIResponseID(m.ResponseID))
	}
	if capture {
		out := genai.Messages([]agent.Message{*m}, true)
		attrs = append(attrs, semconv.GenAIOutputMessagesKey.String(genai.ContentJSON(out, MaxContent)))
	}
	failed := m.StopReason == agent.StopReasonError || m.StopReason == agent.StopReasonAborted
	if failed {
		attrs = append(attrs, semconv.ErrorTypeKey.String(string(m.StopReason)))
	}
	span.SetAttributes(attrs...)
	if failed {
		// A model's error text is the endpoint's, not the prompt's.
		span.SetStatus(codes.Error, clip(m.ErrorMessage, 1024))
	}
}

// Tool starts an execute_tool span of the run's call; end it with the
// call's outcome.
func Tool(t trace.Tracer, capture bool, ctx context.Context, run, name, callID string, args map[string]any) (context.Context, func(agent.ToolResult, error)) {
	if t == nil {
		return ctx, func(agent.ToolResult, error) {}
	}
	attrs := []attribute.KeyValue{semconv.GenAIOperationNameExecuteTool, semconv.GenAIToolName(name),
		semconv.GenAIToolCallID(callID), semconv.GenAIToolTypeKey.String("function"), semconv.GenAIConversationID(run)}
	if capture {
		attrs = append(attrs, semconv.GenAIToolCallArgumentsKey.String(genai.ContentJSON(args, MaxContent)))
	}
	ctx, span := t.Start(ctx, "execute_tool "+name, trace.WithAttributes(attrs...))
	return ctx, func(res agent.ToolResult, err error) {
		if err != nil {
			errType := "tool_error"
			if errors.As(err, new(toolPanic)) {
				errType = "tool_panic"
			}
			span.SetAttributes(semconv.ErrorTypeKey.String(errType))
			// A tool's error text may quote its arguments or output.
			desc := ""
			if capture {
				desc = clip(err.Error(), 1024)
			}
			span.SetStatus(codes.Error, desc)
		} else if capture {
			span.SetAttributes(semconv.GenAIToolCallResultKey.String(genai.ClipUTF8(genai.JoinText(res.Content), MaxContent)))
		}
		span.End()
	}
}

// EndToolSpanOnPanic ends a tool's execute_tool span as failed when the
// tool panics, and panics on: the agent turns the panic into an error result.
func EndToolSpanOnPanic(end func(agent.ToolResult, error)) {
	if p := recover(); p != nil {
		end(agent.ToolResult{}, toolPanic{})
		panic(p)
	}
}

// toolPanic is the error a panicking tool's span ends with; the panic's
// value stays out of the span (it may hold anything).
type toolPanic struct{}

func (toolPanic) Error() string { return "the tool panicked" }

// clip cuts s to n bytes, marked.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return genai.ClipUTF8(s, n) + "…"
}
