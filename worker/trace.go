package worker

import (
	"context"
	"encoding/json"
	"errors"
	"iter"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/tracing"
	"github.com/agentfleet/agentfleet/worker/internal/genai"
	"github.com/agentfleet/agentfleet/worker/internal/metering"
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
	spanLeaseTake   = "agentfleet.lease.take"
	spanRecord      = "agentfleet.record.write"
	spanLimitWait   = "agentfleet.ratelimit.wait"
	spanInvoke      = "invoke_agent"
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
	attrGiveUp      = attribute.Key("agentfleet.give_up")
)

// MaxTracedContent bounds each recorded gen_ai.*.messages / tool argument
// or result attribute, in bytes.
const MaxTracedContent = 64 << 10

func newTracer(tp trace.TracerProvider) trace.Tracer {
	switch tp.(type) {
	case nil, noop.TracerProvider, *noop.TracerProvider:
		return nil
	}
	return tp.Tracer(tracerName, trace.WithSchemaURL(semconv.SchemaURL))
}

// runTrace is an attempt's invoke_agent span and what its end reports.
type runTrace struct {
	span trace.Span      // nil when the worker does not trace
	ctx  context.Context // carries span, for its children made after the fact

	mu     sync.Mutex
	usage  agent.Usage // this attempt's model calls
	status string
}

// traceBegin starts the attempt's spans, children of the request's trace
// context (its headers).
func (r *run) traceBegin() {
	if r.request != nil {
		r.traceBeginFrom(r.request.Headers())
	} else {
		r.traceBeginFrom(nil)
	}
}

// traceGaveUp starts invoke_agent for a give-up's own attempt, a child of
// the request's trace context (h, the stored request's headers), before
// finishGaveUp (its run_started then carries the span). Call the returned
// func with finishGaveUp's error when it returns:
//
//	end := r.traceGaveUp(req.Header)
//	err := r.finishGaveUp(ctx, rec, adv.Deliveries, removeRequest)
//	end(err)
//
// The finish sets run.status failed and error.type gave_up; a give-up
// that found the run finished, or lost the lease, ends "not_started".
func (r *run) traceGaveUp(h nats.Header) func(err error) {
	r.traceBeginFrom(h)
	if r.trace.span == nil {
		return func(error) {}
	}
	r.trace.span.SetAttributes(attrGiveUp.Bool(true))
	return func(err error) {
		r.trace.mu.Lock()
		finished := r.trace.status != ""
		r.trace.mu.Unlock()
		if err != nil && !finished {
			r.trace.span.SetAttributes(semconv.ErrorTypeKey.String(genai.ErrorType(err)))
			r.trace.span.SetStatus(codes.Error, "")
		}
		r.traceEnd()
	}
}

func (r *run) traceBeginFrom(h nats.Header) {
	t := r.w.tracer
	if t == nil {
		return
	}
	ctx := context.Background()
	sc := tracing.Extract(h)
	if sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	r.trace.ctx, r.trace.span = t.Start(ctx, spanInvoke, trace.WithTimestamp(r.startedAt), trace.WithAttributes(
		semconv.GenAIOperationNameInvokeAgent, semconv.GenAIConversationID(r.id),
		attrRunID.String(r.id), attrQueue.String(r.queue), attrAttempt.Int(r.attempt),
		attrWorker.String(r.w.id), attrResumed.Bool(false)))
	if r.attempt == 1 && !r.submittedAt.IsZero() && r.submittedAt.Before(r.startedAt) {
		// A sibling of invoke_agent under the submitter's span; without
		// one, invoke_agent's child, so that both are one trace.
		if !sc.IsValid() {
			ctx = r.trace.ctx
		}
		_, s := t.Start(ctx, spanQueueWait, trace.WithTimestamp(r.submittedAt), trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(attrRunID.String(r.id), attrQueue.String(r.queue)))
		s.End(trace.WithTimestamp(r.startedAt))
	}
}

// traceEnd ends invoke_agent with the attempt's model, usage and outcome.
func (r *run) traceEnd() {
	s := r.trace.span
	if s == nil {
		return
	}
	r.trace.mu.Lock()
	u, status := r.trace.usage, r.trace.status
	r.trace.mu.Unlock()
	attrs := append(genai.UsageAttrs(u, make([]attribute.KeyValue, 0, 10)), attrCost.Float64(u.Cost.Total))
	if !r.modelRef.IsZero() {
		attrs = append(attrs, semconv.GenAIProviderNameKey.String(r.modelRef.Provider), semconv.GenAIRequestModel(r.modelRef.ID))
	}
	switch {
	case status != "":
	case r.pub != nil:
		status = "handed_back"
	default:
		status = "not_started" // refused at pickup, or handed back before its lease
	}
	attrs = append(attrs, attrStatus.String(status))
	s.SetAttributes(attrs...)
	s.End()
}

// traceResumed notes a resume's outcome (resume.go): agentfleet.resumed
// when it restored a transcript, and the run.status of an attempt that
// found the run finished already (only its ack had been lost).
func (r *run) traceResumed(restored bool, err error) {
	s := r.trace.span
	if s == nil {
		return
	}
	s.SetAttributes(attrResumed.Bool(restored))
	if errors.Is(err, errAlreadyFinished) {
		r.trace.mu.Lock()
		r.trace.status = "already_finished"
		r.trace.mu.Unlock()
	}
}

// traceFinished notes the run's outcome for invoke_agent.
func (r *run) traceFinished(fin bus.RunFinished) {
	s := r.trace.span
	if s == nil {
		return
	}
	r.trace.mu.Lock()
	r.trace.status = fin.Status
	r.trace.mu.Unlock()
	if fin.Status != bus.StatusSucceeded {
		errType := fin.Reason
		if errType == "" {
			errType = fin.Status
		}
		s.SetAttributes(semconv.ErrorTypeKey.String(errType))
		s.SetStatus(codes.Error, clipString(fin.Error, 1024))
	}
}

// traceContext returns ctx carrying invoke_agent: the agent's model and
// tool calls become its children.
func (r *run) traceContext(ctx context.Context) context.Context {
	if r.trace.span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, r.trace.span)
}

// traceparent is invoke_agent's, for run_started ("" when not tracing).
func (r *run) traceparent() string {
	if r.trace.span == nil {
		return ""
	}
	return tracing.Traceparent(r.trace.span.SpanContext())
}

// traceStep records a step of the attempt that already happened (a lease
// or record write) as a child of invoke_agent.
func (r *run) traceStep(name string, start time.Time, err error) {
	if r.trace.span == nil {
		return
	}
	parent := r.trace.ctx
	if parent == nil { // span set without traceBeginFrom (tests)
		parent = trace.ContextWithSpan(context.Background(), r.trace.span)
	}
	// No attributes: invoke_agent, the parent, names the run.
	_, s := r.w.tracer.Start(parent, name, trace.WithTimestamp(start), trace.WithSpanKind(trace.SpanKindClient))
	if err != nil {
		s.SetAttributes(semconv.ErrorTypeKey.String(genai.ErrorType(err)))
		s.SetStatus(codes.Error, clipString(err.Error(), 1024))
	}
	s.End()
}

// traceLimitWait records a wait for the shared rate limits (only one that
// waited or failed), a child of the model call in ctx.
func (r *run) traceLimitWait(ctx context.Context, group string, start time.Time, waited time.Duration, err error) {
	if r.w.tracer == nil {
		return
	}
	genai.RestartFirstChunk(ctx)
	if waited <= 0 && err == nil {
		return
	}
	_, s := r.w.tracer.Start(ctx, spanLimitWait, trace.WithTimestamp(start), trace.WithAttributes(attrGroup.String(group)))
	if err != nil {
		s.SetAttributes(semconv.ErrorTypeKey.String(genai.ErrorType(err)))
		s.SetStatus(codes.Error, clipString(err.Error(), 1024))
	}
	s.End()
}

// traceWait starts a span for a wait without the run's slot (waitOffSlot):
// agentfleet.<what>.wait, a child of the span in ctx (the model call for a
// budget wait, else invoke_agent). ctx carries it, for traceApprovalDecision;
// end it with the wait's outcome.
func (r *run) traceWait(ctx context.Context, what string, since time.Time) (context.Context, func(err error, handedBack bool)) {
	t := r.w.tracer
	if t == nil {
		return ctx, func(error, bool) {}
	}
	parent := ctx
	if !trace.SpanContextFromContext(ctx).IsValid() {
		parent = r.traceContext(ctx)
	}
	// A wait an earlier attempt began shows from this attempt's pickup on.
	start := since
	if start.Before(r.startedAt) || start.IsZero() {
		start = r.startedAt
	}
	_, span := t.Start(parent, "agentfleet."+what+".wait", trace.WithTimestamp(start),
		trace.WithAttributes(attrRunID.String(r.id), attrWaitFor.String(what)))
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

// traceApprovalDecision notes on the approval wait in ctx (traceWait) its
// tool call and how it was answered: the answer's decision, "timeout", or
// nothing when the wait was stopped or handed back.
func (r *run) traceApprovalDecision(ctx context.Context, callID string, got *answer, timedOut bool) {
	span := trace.SpanFromContext(ctx)
	if r.w.tracer == nil || !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{semconv.GenAIToolCallID(callID)}
	switch {
	case got != nil:
		attrs = append(attrs, attrDecision.String(got.a.Decision))
	case timedOut:
		attrs = append(attrs, attrDecision.String(bus.DecisionTimeout))
	}
	span.SetAttributes(attrs...)
}

// traceControl links invoke_agent to the sender of a control message.
func (r *run) traceControl(kind string, seq uint64, h nats.Header) {
	if r.trace.span == nil {
		return
	}
	if sc := tracing.Extract(h); sc.IsValid() {
		r.trace.span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
			attrLinkKind.String("control." + kind), attrCtlSeq.Int64(int64(seq))}})
	}
}

// traceEarlierAttempts links a resumed attempt's invoke_agent to the
// invoke_agent of every earlier attempt (their run_started traceparent).
func (r *run) traceEarlierAttempts(envs []*bus.Envelope) {
	if r.trace.span == nil {
		return
	}
	for _, e := range envs {
		if e.Type != bus.EventRunStarted || e.Attempt >= r.attempt {
			continue
		}
		var s struct {
			Traceparent string `json:"traceparent"`
		}
		if json.Unmarshal(e.Event, &s) != nil {
			continue
		}
		if sc := tracing.ParseTraceparent(s.Traceparent, ""); sc.IsValid() {
			r.trace.span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
				attrLinkKind.String("earlier_attempt"), attrAttempt.Int(e.Attempt)}})
		}
	}
}

// traceStream makes a chat span of each model call of fn.
func (r *run) traceStream(fn agent.StreamFn) agent.StreamFn {
	t := r.w.tracer
	if t == nil {
		return fn
	}
	capture := r.w.cfg.TraceContent
	return func(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			attrs := []attribute.KeyValue{semconv.GenAIOperationNameChat, semconv.GenAIProviderNameKey.String(model.Provider),
				semconv.GenAIRequestModel(model.ID), semconv.GenAIConversationID(r.id)}
			if opts.MaxTokens > 0 {
				attrs = append(attrs, semconv.GenAIRequestMaxTokens(opts.MaxTokens))
			}
			if opts.Temperature != nil {
				attrs = append(attrs, semconv.GenAIRequestTemperature(*opts.Temperature))
			}
			if capture {
				attrs = append(attrs, semconv.GenAIInputMessagesKey.String(genai.ContentJSON(genai.Messages(llm.Messages, false), MaxTracedContent)))
				if llm.SystemPrompt != "" {
					attrs = append(attrs, semconv.GenAISystemInstructionsKey.String(genai.ContentJSON([]genai.Part{{Type: "text", Content: llm.SystemPrompt}}, MaxTracedContent)))
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
					r.traceResponse(span, ev.Message, first, capture)
					if m := callMeterOf(ctx); m != nil && m.settled {
						// How the usage on the span was worked out (settle.go).
						span.SetAttributes(attrUsageSource.String(m.s.Source))
					}
				}
				if !yield(ev) {
					return
				}
			}
		}
	}
}

// traceResponse puts a model call's answer on its chat span.
func (r *run) traceResponse(span trace.Span, m *agent.Message, first time.Duration, capture bool) {
	u := metering.NonNegative(m.Usage)
	r.trace.mu.Lock()
	r.trace.usage.Add(u)
	r.trace.mu.Unlock()
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
		attrs = append(attrs, semconv.GenAIOutputMessagesKey.String(genai.ContentJSON(out, MaxTracedContent)))
	}
	failed := m.StopReason == agent.StopReasonError || m.StopReason == agent.StopReasonAborted
	if failed {
		attrs = append(attrs, semconv.ErrorTypeKey.String(string(m.StopReason)))
	}
	span.SetAttributes(attrs...)
	if failed {
		// A model's error text is the endpoint's, not the prompt's.
		span.SetStatus(codes.Error, clipString(m.ErrorMessage, 1024))
	}
}

// traceTool starts an execute_tool span; end it with the call's outcome.
func (r *run) traceTool(ctx context.Context, name, callID string, args map[string]any) (context.Context, func(agent.ToolResult, error)) {
	t := r.w.tracer
	if t == nil {
		return ctx, func(agent.ToolResult, error) {}
	}
	attrs := []attribute.KeyValue{semconv.GenAIOperationNameExecuteTool, semconv.GenAIToolName(name),
		semconv.GenAIToolCallID(callID), semconv.GenAIToolTypeKey.String("function"), semconv.GenAIConversationID(r.id)}
	capture := r.w.cfg.TraceContent
	if capture {
		attrs = append(attrs, semconv.GenAIToolCallArgumentsKey.String(genai.ContentJSON(args, MaxTracedContent)))
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
				desc = clipString(err.Error(), 1024)
			}
			span.SetStatus(codes.Error, desc)
		} else if capture {
			span.SetAttributes(semconv.GenAIToolCallResultKey.String(genai.ClipUTF8(genai.JoinText(res.Content), MaxTracedContent)))
		}
		span.End()
	}
}

// endToolSpanOnPanic ends a tool's execute_tool span as failed when the
// tool panics, and panics on: the agent turns the panic into an error result.
func endToolSpanOnPanic(end func(agent.ToolResult, error)) {
	if p := recover(); p != nil {
		end(agent.ToolResult{}, toolPanic{})
		panic(p)
	}
}

// toolPanic is the error a panicking tool's span ends with; the panic's
// value stays out of the span (it may hold anything).
type toolPanic struct{}

func (toolPanic) Error() string { return "the tool panicked" }
