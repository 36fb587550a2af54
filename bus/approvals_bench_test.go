package bus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
)

// BenchmarkWaitingRuns writes WAITING_BENCH_RUNS (default 100,000) runs
// waiting for an approval as workers leave them in NATS (each a running
// record with waiting.approvals, and its stored events: run_started, the
// assistant message with the tool call, tool_approval_requested), then
// WAITING_BENCH_FINISHED (default 10,000) finished records written since
// (a parked run's record is not rewritten, so the runs that finish later
// sit above it), on an embedded server with file storage, and times the
// first page (100) of `submit approvals` and `submit list --state
// waiting`:
//
//	go test ./bus -run '^$' -bench WaitingRuns -benchtime 20x -timeout 30m
//
// Each waiting run has its waiting-index entry (AGENTS_WAITING), written
// after its record as a worker does. WAITING_BENCH_NOINDEX=1 deletes the
// index first: the records walk of a fleet before 1.9. WAITING_BENCH_HOLES
// (default 0) interleaves that many index writes of runs that stopped
// waiting (rewrites of a few subjects, each deleting the one before: the
// holes short waits leave) with the waiting runs' entries.
//
// Each reports ms-p50, ms-p99, ms-max and what the page holds.
func BenchmarkWaitingRuns(b *testing.B) {
	n, f, js := benchFleet(b, "WAITING_BENCH_RUNS", 100_000)
	finished := 10_000
	if v := os.Getenv("WAITING_BENCH_FINISHED"); v != "" {
		finished, _ = strconv.Atoi(v)
	}
	c, ctx := f.Client, context.Background()
	index := os.Getenv("WAITING_BENCH_NOINDEX") == ""
	if !index {
		if err := js.DeleteStream(ctx, c.Names().WaitingStream()); err != nil {
			b.Fatal(err)
		}
	}
	holes, _ := strconv.Atoi(os.Getenv("WAITING_BENCH_HOLES"))
	start := time.Now()
	pending := 0
	flush := func() {
		if pending++; pending == 4096 {
			pending = 0
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatal("publish acks late")
			}
		}
	}
	event := func(run string, seq int, ts int64, ev string) {
		m := nats.NewMsg(c.Names().Events(run))
		m.Data = fmt.Appendf(nil, `{"run":%q,"seq":%d,"attempt":1,"worker":"bench-worker","ts":%d,"event":%s}`, run, seq, ts, ev)
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
		flush()
	}
	record := func(r *bus.RunRecord) {
		data, _ := json.Marshal(r)
		if _, err := js.PublishAsync("$KV.agents_runs."+r.ID, data); err != nil {
			b.Fatal(err)
		}
		flush()
		if index && r.Waiting != nil {
			entry, _ := json.Marshal(bus.WaitingIndexEntry{For: r.Waiting.For, Since: r.Waiting.Since})
			if _, err := js.PublishAsync(c.Names().WaitingEntry(r.Queue, r.ID), entry); err != nil {
				b.Fatal(err)
			}
			flush()
		}
	}
	hole := func(i int) {
		if _, err := js.PublishAsync(c.Names().WaitingEntry("default", fmt.Sprintf("gone-%02d", i%16)), []byte(`{"for":"model"}`)); err != nil {
			b.Fatal(err)
		}
		flush()
	}
	for i := range n {
		for h := range holes / max(n, 1) {
			hole(i*(holes/max(n, 1)) + h)
		}
		run, call := fmt.Sprintf("wait-%07d", i), fmt.Sprintf("call_%07d", i)
		asked := time.Now()
		ts := asked.UnixMilli()
		event(run, 1, ts, `{"type":"run_started","queue":"default","worker":"bench-worker","attempt":1,"tools":["deploy"]}`)
		event(run, 2, ts, fmt.Sprintf(`{"type":"message_end","message":{"role":"assistant","content":[{"type":"toolCall","id":%q,"name":"deploy","arguments":{"service":"billing","version":"v%d"}}],"api":"faux","provider":"faux","model":"faux/x","usage":{"input":120,"output":40,"totalTokens":160},"stopReason":"toolUse","timestamp":%d}}`, call, i, ts))
		event(run, 3, ts, fmt.Sprintf(`{"type":"tool_approval_requested","toolCallId":%q,"toolName":"deploy","args":{"service":"billing","version":"v%d"},"expiresAt":%d,"answersAfter":%d,"parameters":{"type":"object","properties":{"service":{"type":"string"},"version":{"type":"string"}}}}`, call, i, asked.Add(72*time.Hour).UnixMilli(), i))
		record(&bus.RunRecord{ID: run, Queue: "default", State: bus.StateRunning, Attempt: 1, Worker: "bench-worker",
			RequestSeq: uint64(i + 1), SubmittedAt: start, StartedAt: start, HeartbeatAt: asked, Model: "faux/x", Turns: 1,
			Title: "deploy billing " + strconv.Itoa(i), Metadata: map[string]string{"team": "bench"},
			Waiting: &bus.Waiting{For: bus.WaitingApproval, Since: asked, Approvals: []bus.PendingApproval{{
				ToolCallID: call, ToolName: "deploy", RequestedAt: ts, ExpiresAt: asked.Add(72 * time.Hour).UnixMilli()}}}})
	}
	for i := range finished {
		record(&bus.RunRecord{ID: fmt.Sprintf("done-%07d", i), Queue: "default", State: bus.StatusSucceeded, Attempt: 1,
			Worker: "bench-worker", RequestSeq: uint64(n + i + 1), SubmittedAt: start, StartedAt: start, FinishedAt: time.Now(),
			Model: "faux/x", Turns: 2, Title: "done " + strconv.Itoa(i)})
	}
	<-js.PublishAsyncComplete()
	b.Logf("%d waiting runs (3 events each; index %v, %d holes) and %d finished records written in %s", n, index, holes, finished, time.Since(start).Round(time.Millisecond))
	const limit = 100
	// Each call gets at most a minute: the listing before paging read
	// every waiting run's events.
	timed := func(b *testing.B, call func(ctx context.Context) (int, error)) {
		var times []time.Duration
		got := 0
		for b.Loop() {
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			t0 := time.Now()
			k, err := call(cctx)
			times = append(times, time.Since(t0))
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			got = k
		}
		if got < limit {
			b.Fatalf("%d listed, want %d", got, limit)
		}
		slices.Sort(times)
		b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms-p50")
		b.ReportMetric(float64(times[(len(times)*99)/100].Microseconds())/1000, "ms-p99")
		b.ReportMetric(float64(times[len(times)-1].Microseconds())/1000, "ms-max")
		b.ReportMetric(float64(got), "listed")
	}
	b.Run("list-waiting-first-page", func(b *testing.B) {
		timed(b, func(ctx context.Context) (int, error) {
			p, err := c.ListPage(ctx, bus.ListOptions{State: bus.StateWaiting, Limit: limit})
			if err != nil {
				return 0, err
			}
			b.ReportMetric(float64(p.Scanned), "records-read")
			return len(p.Records), nil
		})
	})
	b.Run("approvals-first-page", func(b *testing.B) {
		timed(b, func(ctx context.Context) (int, error) {
			p, err := c.PendingApprovalsPage(ctx, approvalsFirstPage(limit))
			if err != nil {
				return 0, err
			}
			b.ReportMetric(float64(p.Scanned), "records-read")
			return len(p.Calls), nil
		})
	})
}

// approvalsFirstPage asks for the first page of limit runs.
func approvalsFirstPage(limit int) bus.ApprovalsOptions {
	return bus.ApprovalsOptions{Limit: limit}
}
