package ratelimit_test

import (
	"slices"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ratelimit"
)

// BenchmarkCallOverhead is what the limiter adds to one model call with
// capacity to spare: the gate before the HTTP attempt, the grant and the
// settle, against one NATS server on this machine. Goal: p50 under 2 ms.
func BenchmarkCallOverhead(b *testing.B) {
	f := newFleet(b)
	l := f.limiter("bench", ratelimit.Config{Groups: map[string]ratelimit.Limits{"g": {RPM: 1 << 30, TPM: 1 << 30, Concurrency: 1 << 20}}})
	ctx := b.Context()
	ds := make([]time.Duration, 0, b.N)
	for b.Loop() {
		start := time.Now()
		if err := l.Gate(ctx, "g"); err != nil {
			b.Fatal(err)
		}
		g, err := l.Acquire(ctx, "g", 500)
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Settle(ctx, 400); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(ds)
	if len(ds) > 0 {
		b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds())/1000, "p99-ms")
	}
}
