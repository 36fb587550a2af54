package toolsource_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/toolsource"
)

// benchCalls calls a no-op tool b.N times and reports the per-call
// latency's p50 and p99 (what a run's tool call pays on top of the tool).
func benchCalls(b *testing.B, tool *agent.Tool) {
	ctx := context.Background()
	args := map[string]any{}
	if _, err := tool.Execute(ctx, "warm", args, nil); err != nil {
		b.Fatal(err)
	}
	d := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		if _, err := tool.Execute(ctx, "c", args, nil); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(d)
	if len(d) == 0 {
		return
	}
	b.ReportMetric(float64(d[len(d)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(d[min(len(d)-1, len(d)*99/100)].Microseconds()), "p99-µs")
}

func BenchmarkServiceToolCall(b *testing.B) {
	f := fleettest.Start(b, fleettest.Options{NoStreams: true})
	svc, err := micro.AddService(fleettest.Connect(b, f.URL()).Conn(), micro.Config{Name: "noop", Version: "1.0.0"})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()
	if err := svc.AddGroup("agents.tools.noop").AddEndpoint("noop", micro.HandlerFunc(func(r micro.Request) { _ = r.Respond([]byte("ok")) }),
		micro.WithEndpointMetadata(map[string]string{"description": "Does nothing.", "schema": `{"type":"object"}`})); err != nil {
		b.Fatal(err)
	}
	src, err := toolsource.NewServices(fleettest.Connect(b, f.URL()).Conn(), toolsource.ServiceOptions{Allowed: []string{"noop"}})
	if err != nil {
		b.Fatal(err)
	}
	runSource(b, src)
	tools, _ := src.Resolve(context.Background(), "noop")
	if len(tools) != 1 {
		b.Fatalf("tools %v", tools)
	}
	benchCalls(b, tools[0])
}

func BenchmarkMCPStdioToolCall(b *testing.B) {
	src := toolsource.NewMCPServer("noop", noopStdioConfig(b), toolsource.MCPOptions{})
	runSource(b, src)
	waitUp(b, src)
	tools, _ := src.Resolve(context.Background(), "noop")
	if len(tools) != 1 {
		b.Fatalf("tools %v", tools)
	}
	benchCalls(b, tools[0])
}
