package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/tracing"
	"github.com/agentfleet/agentfleet/tracing/otlp"
)

const tracerName = "github.com/agentfleet/agentfleet/cmd/submit"

// otelFlag registers --otel [AGENTS_OTEL].
func otelFlag(fs *flag.FlagSet, p *bool, e *env) {
	def, _ := strconv.ParseBool(e.getenv("AGENTS_OTEL"))
	fs.BoolVar(p, "otel", def, "export an OpenTelemetry trace of the command over OTLP/HTTP as the OTEL_* variables say; the request and control messages carry its context to the workers (also on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER is set) [AGENTS_OTEL]")
}

// traceCommand sets up tracing for one command and starts its span, a
// child of the caller's TRACEPARENT if there is one (continued even when
// tracing is off here, so the workers' spans join the caller's trace).
// end ends the span and flushes the exporter.
func (c *conn) traceCommand(ctx context.Context, e *env, name string) (_ context.Context, end func()) {
	t, err := otlp.New(ctx, c.otel, "agentfleet-submit", e.getenv)
	if err != nil {
		fmt.Fprintf(e.stderr, "submit: tracing off: %v\n", err)
		t = otlp.Off()
	}
	if t.Warning != "" {
		fmt.Fprintf(e.stderr, "submit: %s\n", t.Warning)
	}
	ctx = tracing.FromEnvironment(ctx, e.getenv)
	if !t.On && !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, func() {}
	}
	ctx, span := t.Provider.Tracer(tracerName).Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer))
	return ctx, func() {
		span.End()
		// Short: a command must not hang on a collector that is down.
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := t.Shutdown(sctx); err != nil {
			fmt.Fprintf(e.stderr, "submit: traces not all exported: %v\n", err)
		}
	}
}

// traceRun names the run in the command's span.
func traceRun(ctx context.Context, id, queue string) {
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("agentfleet.run.id", id), attribute.String("agentfleet.queue", queue))
}
