package tracing

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Header names of the W3C trace context, as they travel on NATS.
const (
	TraceparentHeader = "traceparent"
	TracestateHeader  = "tracestate"
)

var propagator = propagation.TraceContext{} // stateless

// HeaderCarrier adapts nats.Header to the propagators. NATS header names
// are case-sensitive: Get also finds Traceparent / TRACEPARENT.
type HeaderCarrier nats.Header

func (c HeaderCarrier) Get(key string) string {
	if v := nats.Header(c).Get(key); v != "" {
		return v
	}
	for k, v := range c {
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

func (c HeaderCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

func (c HeaderCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// Inject writes ctx's span context into h; it does nothing (and returns
// false) when ctx carries none, so untraced messages get no headers.
func Inject(ctx context.Context, h nats.Header) bool {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return false
	}
	propagator.Inject(ctx, HeaderCarrier(h))
	return true
}

// Extract returns the remote span context in h (invalid if none).
func Extract(h nats.Header) trace.SpanContext {
	if len(h) == 0 {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), HeaderCarrier(h)))
}

// Traceparent formats a span context as a W3C traceparent ("" if invalid).
func Traceparent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	m := propagation.MapCarrier{}
	propagator.Inject(ctx, m)
	return m[TraceparentHeader]
}

// ParseTraceparent parses a W3C traceparent (and tracestate, may be
// empty); the result is invalid when it does not parse.
func ParseTraceparent(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	m := propagation.MapCarrier{TraceparentHeader: traceparent}
	if tracestate != "" {
		m[TracestateHeader] = tracestate
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), m))
}

// FromEnvironment returns ctx carrying the remote span context of the
// TRACEPARENT / TRACESTATE environment variables (a caller's trace to
// continue), or ctx as it is.
func FromEnvironment(ctx context.Context, getenv func(string) string) context.Context {
	sc := ParseTraceparent(getenv("TRACEPARENT"), getenv("TRACESTATE"))
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}
