package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/runtrace"
)

// An attempt's OpenTelemetry spans (internal/runtrace): the run gives
// them its identity, the worker's tracer (nil: not tracing) and whether
// they record content (Config.TraceContent).

// MaxTracedContent bounds each recorded gen_ai.*.messages / tool argument
// or result attribute, in bytes.
const MaxTracedContent = runtrace.MaxContent

func newTracer(tp trace.TracerProvider) trace.Tracer { return runtrace.NewTracer(tp) }

func (r *run) traceIdentity() runtrace.Identity {
	return runtrace.Identity{Run: r.id, Queue: r.queue, Worker: r.w.id, Attempt: r.attempt,
		Started: r.startedAt, Submitted: r.submittedAt}
}

// traceBegin starts the attempt's spans, children of the request's trace
// context (its headers).
func (r *run) traceBegin() {
	var h nats.Header
	if r.request != nil {
		h = r.request.Headers()
	}
	r.traceBeginFrom(h)
}

func (r *run) traceBeginFrom(h nats.Header) { r.trace.Begin(r.w.tracer, r.traceIdentity(), h) }

// traceGaveUp starts invoke_agent for a give-up's own attempt (see
// runtrace.Attempt.GaveUp); call the returned func with finishGaveUp's
// error when it returns.
func (r *run) traceGaveUp(h nats.Header) func(err error) {
	failed := r.trace.GaveUp(r.w.tracer, r.traceIdentity(), h)
	return func(err error) {
		failed(err)
		r.traceEnd()
	}
}

// traceEnd ends invoke_agent; an attempt with a publisher took its run.
func (r *run) traceEnd() { r.trace.End(r.modelRef, r.pub != nil) }

func (r *run) traceResumed(restored bool, err error) {
	r.trace.Resumed(restored, errors.Is(err, errAlreadyFinished))
}

func (r *run) traceFinished(fin bus.RunFinished) { r.trace.Finished(fin) }

func (r *run) traceContext(ctx context.Context) context.Context { return r.trace.Context(ctx) }

func (r *run) traceparent() string { return r.trace.Traceparent() }

func (r *run) traceStep(name string, start time.Time, err error) {
	r.trace.Step(r.w.tracer, name, start, err)
}

func (r *run) traceLimitWait(ctx context.Context, group string, start time.Time, waited time.Duration, err error) {
	runtrace.LimitWait(r.w.tracer, ctx, group, start, waited, err)
}

func (r *run) traceWait(ctx context.Context, what string, since time.Time) (context.Context, func(err error, handedBack bool)) {
	return r.trace.Wait(r.w.tracer, ctx, what, since)
}

func (r *run) traceApprovalDecision(ctx context.Context, callID string, got *answer, timedOut bool) {
	decision := ""
	if got != nil {
		decision = got.a.Decision
	}
	runtrace.ApprovalDecision(r.w.tracer, ctx, callID, decision, timedOut)
}

func (r *run) traceControl(kind string, seq uint64, h nats.Header) { r.trace.Control(kind, seq, h) }

func (r *run) traceEarlierAttempts(envs []*bus.Envelope) { r.trace.EarlierAttempts(envs) }

// traceStream makes a chat span of each model call of fn, with how its
// usage was worked out once settled (settle.go).
func (r *run) traceStream(fn agent.StreamFn) agent.StreamFn {
	return r.trace.Stream(r.w.tracer, r.w.cfg.TraceContent, r.id, fn, func(ctx context.Context) (string, bool) {
		if m := callMeterOf(ctx); m != nil && m.settled {
			return m.s.Source, true
		}
		return "", false
	})
}

func (r *run) traceResponse(span trace.Span, m *agent.Message, first time.Duration, capture bool) {
	r.trace.Response(span, m, first, capture)
}

func (r *run) traceTool(ctx context.Context, name, callID string, args map[string]any) (context.Context, func(agent.ToolResult, error)) {
	return runtrace.Tool(r.w.tracer, r.w.cfg.TraceContent, ctx, r.id, name, callID, args)
}
