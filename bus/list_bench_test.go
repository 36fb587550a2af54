package bus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// BenchmarkListMillion writes LIST_BENCH_RECORDS (default 1,000,000)
// synthetic records into agents_runs on an embedded server (each run
// written running, then final 64 writes later, so the records stream has
// a hole per run as heartbeats leave; 5% failed, 0.5% aborted, 200 still
// running) and times each listing. Run each listing 5 times:
//
//	go test ./bus -run '^$' -bench ListMillion -benchtime 5x -timeout 30m
//
// Each sub-benchmark reports ms-p50, ms-max and the records it read.
func BenchmarkListMillion(b *testing.B) {
	n, f, js := benchFleet(b, "LIST_BENCH_RECORDS", 1_000_000)
	c, ctx := f.Client, context.Background()
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heapBefore := ms.HeapAlloc
	const lastHour = 10_000 // records written after the "hour" mark
	start := time.Now()
	var hourMark time.Time
	pending := 0
	put := func(i int, state string) {
		r := bus.RunRecord{ID: fmt.Sprintf("bench-%07d", i), Queue: "default", State: state, Attempt: 1,
			Worker: "bench-worker", RequestSeq: uint64(i + 1), Model: "faux/x", Turns: 2,
			SubmittedAt: start, StartedAt: start, HeartbeatAt: start,
			Usage: agent.Usage{Input: 120, Output: 40, TotalTokens: 160}, Cost: 0.00004,
			Metadata: map[string]string{"team": "bench"}}
		if state != bus.StateRunning {
			r.FinishedAt = start
		}
		switch state {
		case bus.StatusFailed:
			r.Reason, r.Error = "model_error", "429 rate limited"
		case bus.StatusAborted:
			r.Reason, r.Error = "aborted_by_user", "wrong question"
		}
		data, _ := json.Marshal(r)
		if _, err := js.PublishAsync("$KV.agents_runs."+r.ID, data); err != nil {
			b.Fatal(err)
		}
		if pending++; pending == 4096 {
			pending = 0
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatal("publish acks late")
			}
		}
	}
	final := func(i int) string {
		switch {
		case i%200 == 7:
			return bus.StatusAborted
		case i%20 == 3:
			return bus.StatusFailed
		}
		return bus.StatusSucceeded
	}
	const lag = 64
	for i := range n + lag {
		if i == n-lastHour {
			<-js.PublishAsyncComplete()
			hourMark = time.Now()
		}
		if i < n {
			put(i, bus.StateRunning)
		}
		if j := i - lag; j >= 0 && j < n-200 {
			put(j, final(j))
		}
	}
	<-js.PublishAsyncComplete()
	kvInfo, err := js.Stream(ctx, "KV_agents_runs")
	if err != nil {
		b.Fatal(err)
	}
	st := kvInfo.CachedInfo().State
	runtime.GC()
	runtime.ReadMemStats(&ms)
	// The server's heap per record kept (its per-subject index holds
	// every key), reported on each listing.
	heapPerRecord := float64(ms.HeapAlloc-min(ms.HeapAlloc, heapBefore)) / float64(st.Msgs)
	b.Logf("%d records (last seq %d, %d MiB on disk) written in %s; server heap %.0f bytes a record",
		st.Msgs, st.LastSeq, st.Bytes>>20, time.Since(start).Round(time.Millisecond), heapPerRecord)
	mid, err := c.Status(ctx, fmt.Sprintf("bench-%07d", n/2))
	if err != nil {
		b.Fatal(err)
	}
	listings := []struct {
		name string
		o    bus.ListOptions
		want int
	}{
		{"limit20", bus.ListOptions{Limit: 20}, 20},
		{"failed-limit20", bus.ListOptions{State: bus.StatusFailed, Limit: 20}, 20},
		{"aborted-limit20", bus.ListOptions{State: bus.StatusAborted, Limit: 20}, 20},
		{"running-limit20", bus.ListOptions{State: bus.StateRunning, Limit: 20}, 20},
		{"page-at-half-limit20", bus.ListOptions{BeforeSeq: mid.Revision, Limit: 20}, 20},
		{"failed-page-at-half-limit20", bus.ListOptions{State: bus.StatusFailed, BeforeSeq: mid.Revision, Limit: 20}, 20},
		{"before-time-limit20", bus.ListOptions{Before: hourMark, Limit: 20}, 20},
		{"since-hour-failed-all", bus.ListOptions{Since: hourMark, State: bus.StatusFailed}, -1},
		{"stale-none-scan-bound", bus.ListOptions{State: bus.StateStale, Limit: 20}, 0},
	}
	for _, l := range listings {
		b.Run(l.name, func(b *testing.B) {
			var times []time.Duration
			var p *bus.RunPage
			for b.Loop() {
				t0 := time.Now()
				p, err = c.ListPage(ctx, l.o)
				times = append(times, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
			}
			if l.want >= 0 && len(p.Records) != l.want {
				b.Fatalf("%d records, want %d", len(p.Records), l.want)
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms-p50")
			b.ReportMetric(float64(times[len(times)-1].Microseconds())/1000, "ms-max")
			b.ReportMetric(float64(p.Scanned), "records-read")
			b.ReportMetric(float64(len(p.Records)), "records-returned")
			b.ReportMetric(heapPerRecord, "heap-B/record-kept")
			b.ReportMetric(float64(st.Bytes)/float64(st.Msgs), "disk-B/record")
		})
	}
	b.Run("records-stream-info", func(b *testing.B) {
		var times []time.Duration
		for b.Loop() {
			t0 := time.Now()
			if _, err := kvInfo.Info(ctx); err != nil {
				b.Fatal(err)
			}
			times = append(times, time.Since(t0))
		}
		slices.Sort(times)
		b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms-p50")
	})
	b.Run("direct-batch-20", func(b *testing.B) {
		var times []time.Duration
		for b.Loop() {
			t0 := time.Now()
			sub, _ := c.Conn().SubscribeSync(c.Conn().NewInbox())
			_ = c.Conn().PublishRequest("$JS.API.DIRECT.GET.KV_agents_runs", sub.Subject, []byte(fmt.Sprintf(`{"seq":%d,"batch":20}`, st.LastSeq-40)))
			for {
				m, err := sub.NextMsg(10 * time.Second)
				if err != nil {
					b.Fatal(err)
				}
				if m.Header.Get("Status") != "" {
					break
				}
			}
			_ = sub.Unsubscribe()
			times = append(times, time.Since(t0))
		}
		slices.Sort(times)
		b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms-p50")
	})
	b.Run("status", func(b *testing.B) {
		var times []time.Duration
		for b.Loop() {
			t0 := time.Now()
			if _, err := c.Status(ctx, fmt.Sprintf("bench-%07d", n/3)); err != nil {
				b.Fatal(err)
			}
			times = append(times, time.Since(t0))
		}
		slices.Sort(times)
		b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms-p50")
		b.ReportMetric(float64(times[len(times)-1].Microseconds())/1000, "ms-max")
	})
	// What a kept bucket costs the server once its caches are gone: restart
	// it on the same directory and weigh the heap after recovery (the
	// per-subject index of every key, the map of deleted sequences).
	b.Run("heap-after-restart", func(b *testing.B) {
		for b.Loop() {
			f.Server.Shutdown()
			runtime.GC()
			runtime.ReadMemStats(&ms)
			base := ms.HeapAlloc
			srv, err := fleettest.NewServer(0, f.StoreDir)
			if err != nil {
				b.Fatal(err)
			}
			runtime.GC()
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(ms.HeapAlloc-min(ms.HeapAlloc, base))/float64(st.Msgs), "heap-B/record-kept")
			f.Server = srv
		}
		b.Cleanup(f.Server.Shutdown)
	})
}
