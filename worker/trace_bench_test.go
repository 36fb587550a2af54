package worker

import (
	"context"
	"iter"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/agentfleet/agentfleet/agent"
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
