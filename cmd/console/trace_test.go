package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/agentfleet/agentfleet/tracing"
)

// A steer from a tracing console carries its span's context in the
// stored control message's headers, a child of the HTTP request's.
func TestTracedControlCarriesContext(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	rw := newConsole(t, f, serverConfig{AllowControl: true, TracerProvider: tp})
	id := f.submit(slowText("trace-1", "a long enough answer to steer while it streams", "after the steer"))
	const caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	good := rw.csrfToken(t)
	req, _ := http.NewRequest(http.MethodPost, rw.URL+"/api/runs/"+id+"/steer", strings.NewReader(`{"text":"steered"}`))
	req.Header.Set("X-CSRF-Token", good)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", caller)
	resp, err := rw.Client().Do(req)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("steer: %v %v", resp, err)
	}
	resp.Body.Close()
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].Name() != "agentfleet.steer" || spans[0].Parent().SpanID() != tracing.ParseTraceparent(caller, "").SpanID() {
		t.Fatalf("spans %v", spans)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := f.c.Stream(ctx, f.c.Names().ControlStream())
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, f.c.Names().Control(id, "steer"))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get("traceparent"); got != tracing.Traceparent(spans[0].SpanContext()) {
		t.Fatalf("stored steer's traceparent %q, the console's span %s", got, tracing.Traceparent(spans[0].SpanContext()))
	}
}
