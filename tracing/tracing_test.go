package tracing

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestEnabled(t *testing.T) {
	for _, c := range []struct {
		flag bool
		env  map[string]string
		want bool
	}{
		{false, nil, false},
		{true, nil, true},
		{false, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, true},
		{false, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"}, true},
		{false, map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{false, map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://x"}, false},
		{true, map[string]string{"OTEL_SDK_DISABLED": "true"}, false},
		{true, map[string]string{"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, false},
		{true, map[string]string{"OTEL_SDK_DISABLED": "false"}, true},
		{true, map[string]string{"OTEL_TRACES_EXPORTER": "none"}, false},
	} {
		if got := Enabled(c.flag, envOf(c.env)); got != c.want {
			t.Errorf("Enabled(%v, %v) = %v", c.flag, c.env, got)
		}
	}
}

func TestCarrier(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sc := ParseTraceparent(tp, "vendor=x")
	if !sc.IsValid() || Traceparent(sc) != tp {
		t.Fatalf("round trip: %v %q", sc, Traceparent(sc))
	}
	h := nats.Header{}
	if Inject(context.Background(), h) || len(h) != 0 {
		t.Fatalf("a context without a span injected %v", h)
	}
	if !Inject(trace.ContextWithRemoteSpanContext(context.Background(), sc), h) ||
		h.Get(TraceparentHeader) != tp || h.Get(TracestateHeader) != "vendor=x" {
		t.Fatalf("headers %v", h)
	}
	got := Extract(h)
	if got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || !got.IsRemote() || got.TraceState().Get("vendor") != "x" {
		t.Fatalf("extracted %v", got)
	}
	// Header names are case-sensitive on NATS: another spelling is found.
	if got := Extract(nats.Header{"Traceparent": {tp}}); got.SpanID() != sc.SpanID() {
		t.Fatalf("Traceparent header: %v", got)
	}
	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"} {
		if ParseTraceparent(bad, "").IsValid() || Extract(nats.Header{"traceparent": {bad}}).IsValid() {
			t.Errorf("%q parsed", bad)
		}
	}
	if ctx := FromEnvironment(context.Background(), envOf(map[string]string{"TRACEPARENT": tp})); trace.SpanContextFromContext(ctx).SpanID() != sc.SpanID() {
		t.Fatal("TRACEPARENT not continued")
	}
}
