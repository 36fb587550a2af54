package bus_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/tracing"
)

// A request and a control message carry the span context of their ctx in
// traceparent / tracestate headers, and none without one.
func TestTraceContextHeaders(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	sc := tracing.ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=x")
	traced := trace.ContextWithRemoteSpanContext(ctx, sc)
	headers := func(stream string, seq uint64) map[string][]string {
		t.Helper()
		s, err := c.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		return m.Header
	}
	plain, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if h := headers(c.Names().RunsStream(), plain.Seq); h["traceparent"] != nil {
		t.Fatalf("untraced request has %v", h)
	}
	res, err := c.Submit(traced, "", &bus.RunRequest{Prompt: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	h := headers(c.Names().RunsStream(), res.Seq)
	if got := tracing.Extract(h); got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || got.TraceState().Get("vendor") != "x" {
		t.Fatalf("request headers %v", h)
	}
	seq, err := c.Steer(traced, res.ID, "go on")
	if err != nil {
		t.Fatal(err)
	}
	if got := tracing.Extract(headers(c.Names().ControlStream(), seq)); got.SpanID() != sc.SpanID() {
		t.Fatalf("steer's span context %v", got)
	}
	seq, err = c.Abort(context.WithoutCancel(ctx), res.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if h := headers(c.Names().ControlStream(), seq); h["traceparent"] != nil {
		t.Fatalf("untraced abort has %v", h)
	}
}
