package worker

import (
	"context"
	"io"
	"iter"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/runtrace"
)

// BenchmarkTraceHooks is the tracing cost of one model call (22 stream
// events) and one tool call, as the worker's hooks add it: "off" (no
// provider or a noop one) must cost nothing, "on" is the SDK with a
// processor that drops what ends.
func BenchmarkTraceHooks(b *testing.B) {
	msg := &agent.Message{Role: agent.RoleAssistant, Model: "m", StopReason: agent.StopReasonStop,
		Usage: agent.Usage{Input: 10, Output: 20}}
	inner := func(ctx context.Context, _ agent.Model, _ agent.Context, _ agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			if !yield(agent.StreamEvent{Type: agent.StreamStart}) {
				return
			}
			for range 20 {
				if !yield(agent.StreamEvent{Type: agent.StreamTextDelta, Delta: "lorem ipsum dolo"}) {
					return
				}
			}
			yield(agent.StreamEvent{Type: agent.StreamDone, Message: msg})
		}
	}
	model := agent.Model{ID: "m", Provider: "faux"}
	args := map[string]any{"expression": "1+1"}
	res := agent.TextResult("2")
	b.Run("baseline", func(b *testing.B) { // the worker without the hooks
		b.ReportAllocs()
		for b.Loop() {
			for range inner(context.Background(), model, agent.Context{}, agent.StreamOptions{}) {
			}
		}
	})
	for _, c := range []struct {
		name string
		w    *Worker
	}{
		{"off", &Worker{}},
		{"noop", &Worker{tracer: newTracer(noop.NewTracerProvider())}},
		{"on", &Worker{tracer: newTracer(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(dropSpans{})))}},
	} {
		b.Run(c.name, func(b *testing.B) {
			r := &run{w: c.w, id: "run"}
			r.traceBegin()
			ctx := r.traceContext(context.Background())
			stream := r.traceStream(inner)
			b.ReportAllocs()
			for b.Loop() {
				for range stream(ctx, model, agent.Context{}, agent.StreamOptions{}) {
				}
				_, end := r.traceTool(ctx, "calculator", "c1", args)
				end(res, nil)
			}
		})
	}
}

type dropSpans struct{}

func (dropSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (dropSpans) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (dropSpans) Shutdown(context.Context) error                  { return nil }
func (dropSpans) ForceFlush(context.Context) error                { return nil }

// BenchmarkTraceRun is the tracing cost of one benchmark run's worker
// spans (queue wait, invoke_agent, lease, one chat call, record), exported
// over OTLP/HTTP to a server that discards them.
func BenchmarkTraceRun(b *testing.B) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	defer hs.Close()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(hs.URL))
	if err != nil {
		b.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	w := &Worker{tracer: newTracer(tp), id: "w"}
	msg := &agent.Message{Role: agent.RoleAssistant, Model: "m", StopReason: agent.StopReasonStop, Usage: agent.Usage{Input: 10, Output: 20}}
	inner := func(context.Context, agent.Model, agent.Context, agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			yield(agent.StreamEvent{Type: agent.StreamDone, Message: msg})
		}
	}
	model := agent.Model{ID: "m", Provider: "faux"}
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		r := &run{w: w, id: "run", queue: "default", attempt: 1, submittedAt: now.Add(-time.Millisecond), startedAt: now}
		r.traceBegin()
		r.traceStep(runtrace.SpanLeaseTake, now, nil)
		for range r.traceStream(inner)(r.traceContext(context.Background()), model, agent.Context{}, agent.StreamOptions{}) {
		}
		r.traceStep(runtrace.SpanRecord, now, nil)
		r.traceFinished(bus.RunFinished{Status: bus.StatusSucceeded})
		r.traceEnd()
	}
}
