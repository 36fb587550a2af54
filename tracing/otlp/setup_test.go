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

// Tracing the environment alone asks for, with an exporter or protocol
// this build does not have (gRPC set cluster-wide), stays off with a
// warning; asked for by the flag, it is an error.
func TestNewUnsupportedFromTheEnvironment(t *testing.T) {
	ctx := context.Background()
	for _, env := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
		{"OTEL_TRACES_EXPORTER": "zipkin"},
	} {
		tr, err := New(ctx, false, "svc", envOf(env))
		if err != nil || tr.On || tr.Warning == "" {
			t.Errorf("%v without the flag: %+v, %v; want off with a warning", env, tr, err)
			continue
		}
		if _, span := tr.Provider.Tracer("t").Start(ctx, "x"); span.IsRecording() {
			t.Errorf("%v: tracing off records", env)
		}
		if _, err := New(ctx, true, "svc", envOf(env)); err == nil {
			t.Errorf("%v with the flag: no error", env)
		}
	}
	if tr, err := New(ctx, false, "svc", envOf(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})); err != nil || !tr.On || tr.Warning != "" {
		t.Fatalf("OTLP/HTTP from the environment: %+v %v", tr, err)
	} else {
		_ = tr.Shutdown(ctx)
	}
}
