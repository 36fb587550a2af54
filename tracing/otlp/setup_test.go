package otlp

import (
	"context"
	"testing"

	"github.com/agentfleet/agentfleet/tracing"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestNew(t *testing.T) {
	ctx := context.Background()
	off, err := New(ctx, false, "svc", envOf(nil))
	if err != nil || off.On {
		t.Fatalf("off: %+v %v", off, err)
	}
	if _, span := off.Provider.Tracer("t").Start(ctx, "x"); span.IsRecording() {
		t.Fatal("a noop provider records")
	}
	on, err := New(ctx, true, "svc", envOf(map[string]string{tracing.CaptureContentEnv: "true"}))
	if err != nil || !on.On || !on.CaptureContent {
		t.Fatalf("on: %+v %v", on, err)
	}
	if _, span := on.Provider.Tracer("t").Start(ctx, "x"); !span.IsRecording() {
		t.Fatal("the SDK provider does not record")
	}
	if err := on.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for _, env := range []map[string]string{{"OTEL_TRACES_EXPORTER": "zipkin"}, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}} {
		if _, err := New(ctx, true, "svc", envOf(env)); err == nil {
			t.Errorf("%v: no error", env)
		}
	}
}
