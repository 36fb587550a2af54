package worker

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkWaitingRunStack is the memory a run waiting in a tool holds in
// goroutine stacks: 1,000 runs call a tool that blocks until the benchmark
// lets go; once all wait, after two GCs (which shrink stacks), it reports
// the stack bytes and goroutines per waiting run. The run's own goroutine
// sits deep in the agent loop meanwhile, so the loop's frames decide
// whether the runtime can halve its stack (it shrinks one using under a
// quarter of it).
//
//	go test ./worker -run '^$' -bench WaitingRunStack -benchtime 1x
func BenchmarkWaitingRunStack(b *testing.B) {
	const runs = 1000
	// A gate per round: every run of the round waits at it.
	type gate struct {
		entered, left atomic.Int64
		all, hold     chan struct{}
		gone          chan struct{}
	}
	var cur atomic.Pointer[gate]
	// Arguments as the sleep tool's: decoding them is the deepest point.
	block := agent.NewTool("block", "waits until released", func(ctx context.Context, _ sleepArgs, _ agent.UpdateFunc) (agent.ToolResult, error) {
		g := cur.Load()
		if g.entered.Add(1) == runs {
			close(g.all)
		}
		select {
		case <-g.hold:
		case <-ctx.Done():
		}
		if g.left.Add(1) == runs {
			close(g.gone)
		}
		return agent.TextResult("released"), nil
	})
	// Logged and measured as cmd/worker does: their calls are part of the
	// deepest stack a run reaches.
	obs := MetricsObserver(metrics.New(prometheus.NewRegistry(), metrics.Config{Tools: []string{"block"}}))
	_, c := startInternal(b, Config{Tools: []*agent.Tool{block}, Concurrency: runs + 10, DrainTimeout: time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observer: obs}, nil)
	req := &bus.RunRequest{Prompt: "wait", Tools: []string{"block"}, Model: fauxModel, Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
		{Content: []agent.Content{agent.ToolCall("c1", "block", map[string]any{"seconds": 60})}, StopReason: agent.StopReasonToolUse},
		{Content: []agent.Content{agent.Text("done")}}}}}
	for b.Loop() {
		g := &gate{all: make(chan struct{}), hold: make(chan struct{}), gone: make(chan struct{})}
		cur.Store(g)
		before := stackInUse()
		goroutines := runtime.NumGoroutine()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		for range runs {
			r := *req // Submit names the run in its request
			if _, err := c.Submit(ctx, "", &r); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-g.all:
		case <-ctx.Done():
			b.Fatalf("%d of %d runs reached the tool", g.entered.Load(), runs)
		}
		after := stackInUse()
		b.ReportMetric(float64(after-before)/runs, "stack-B/run")
		b.ReportMetric(float64(runtime.NumGoroutine()-goroutines)/runs, "goroutines/run")
		close(g.hold)
		select {
		case <-g.gone:
		case <-ctx.Done():
			b.Fatalf("%d of %d runs left the tool", g.left.Load(), runs)
		}
		cancel()
	}
}

func stackInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.StackInuse
}
