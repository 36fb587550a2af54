package worker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/llm/openai"
	"github.com/agentfleet/agentfleet/metrics"
)

// BenchmarkWaitingRunStack is the memory a run waiting in a tool holds in
// goroutine stacks: 1,000 runs of an OpenAI-compatible model (an httptest
// SSE server) call a tool that blocks until the benchmark lets go; once
// all wait, after two GCs, it reports the stack bytes and goroutines per
// waiting run, and fails above 20 KB or one goroutine a run. Streaming
// the model's reply grows a run's stack to 32 KB; the runtime halves a
// stack at a GC only when under a quarter of it is in use, so the frames
// a run holds while its tool runs (the agent loop's, the worker's) must
// stay under 8 KB.
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
	// Arguments as the sleep tool's.
	type sleepArgs struct {
		Seconds float64 `json:"seconds" jsonschema:"description=How long to wait\\, at most 60 seconds,minimum=0,maximum=60"`
	}
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
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		chunks := []string{`{"id":"r","choices":[{"index":0,"delta":{"role":"assistant","content":"calling"}}]}`,
			`{"id":"r","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"block","arguments":"{\"seconds\": 60}"}}]}}]}`,
			`{"id":"r","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
			`{"id":"r","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":20}}`}
		if bytes.Contains(body, []byte(`"role":"tool"`)) {
			chunks = []string{`{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":"done"}}]}`,
				`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`}
		}
		for _, c := range chunks {
			fmt.Fprintf(w, "data: %s\n\n", c)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer model.Close()
	prov, err := openai.New(openai.Config{BaseURL: model.URL + "/v1", Models: []openai.ModelInfo{{ID: "m", MaxTokens: 50}}})
	if err != nil {
		b.Fatal(err)
	}
	// Logged and measured as cmd/worker does.
	obs := MetricsObserver(metrics.New(prometheus.NewRegistry(), metrics.Config{Tools: []string{"block"}}))
	_, c := startInternal(b, Config{Tools: []*agent.Tool{block}, Concurrency: runs + 10, DrainTimeout: time.Minute,
		DefaultModel: "openai/m", Providers: map[string]Provider{"openai": prov},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observer: obs}, nil)
	baseline := runtime.NumGoroutine()
	for b.Loop() {
		// The previous round's runs are gone (their last model call and
		// events come after the tool).
		for deadline := time.Now().Add(time.Minute); runtime.NumGoroutine() > baseline+10; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatalf("%d goroutines, %d before the first round", runtime.NumGoroutine(), baseline)
			}
		}
		g := &gate{all: make(chan struct{}), hold: make(chan struct{}), gone: make(chan struct{})}
		cur.Store(g)
		before := stackInUse()
		goroutines := runtime.NumGoroutine()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for range runs {
			if _, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "wait", Tools: []string{"block"}}); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-g.all:
		case <-ctx.Done():
			b.Fatalf("%d of %d runs reached the tool", g.entered.Load(), runs)
		}
		// The HTTP connections' goroutines are not the runs'.
		prov.CloseIdleConnections()
		model.CloseClientConnections()
		perRun := float64(stackInUse()-before) / runs
		perRunG := float64(runtime.NumGoroutine()-goroutines) / runs
		b.ReportMetric(perRun, "stack-B/run")
		b.ReportMetric(perRunG, "goroutines/run")
		if perRun > 20<<10 {
			b.Errorf("%.0f bytes of stack a waiting run, want under %d: its stack was not halved, or it keeps goroutines besides its own", perRun, 20<<10)
		}
		if perRunG > 1.1 {
			b.Errorf("%.2f goroutines a waiting run, want its own only (no control owner or ack loop while it waits)", perRunG)
		}
		close(g.hold)
		select {
		case <-g.gone:
		case <-ctx.Done():
			b.Fatalf("%d of %d runs left the tool", g.left.Load(), runs)
		}
	}
}

func stackInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.StackInuse
}
