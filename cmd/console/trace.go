package main

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// traceAction starts the span of a submit or control action from the page
// (a child of the HTTP request's traceparent, if any): the request or
// control message carries it to the worker. end is a noop when the
// console does not trace.
func (s *server) traceAction(ctx context.Context, r *http.Request, action, runID string) (context.Context, func()) {
	if s.tracer == nil {
		return ctx, func() {}
	}
	ctx = propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(r.Header))
	ctx, span := s.tracer.Start(ctx, "agentfleet."+action, trace.WithSpanKind(trace.SpanKindProducer))
	if runID != "" {
		span.SetAttributes(attribute.String("agentfleet.run.id", runID))
	}
	return ctx, func() { span.End() }
}

func consoleTracer(tp trace.TracerProvider) trace.Tracer {
	switch tp.(type) {
	case nil, noop.TracerProvider:
		return nil
	}
	return tp.Tracer("github.com/agentfleet/agentfleet/cmd/console")
}
