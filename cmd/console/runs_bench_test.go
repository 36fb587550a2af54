package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// fillRecords writes n run records straight into KV bucket agents_runs
// (async JetStream publishes on $KV.agents_runs.<id>, as a worker's puts
// store them): ids run-<from> up, the last one written newest. Their
// mix: 90% succeeded, 6% failed, 3% aborted, 1% running (heartbeats an
// hour old: stale); queues default and other (1 in 5), three tenants and
// two models; each with a title, usage, cost and metadata.
func fillRecords(tb testing.TB, f *fleettest.Fleet, from, n int) {
	tb.Helper()
	js, err := jetstream.New(f.Client.Conn(), jetstream.WithPublishAsyncMaxPending(16384))
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now().Add(-time.Hour)
	tenants := []string{"acme", "globex", "initech"}
	for i := from; i < from+n; i++ {
		r := bus.RunRecord{ID: fmt.Sprintf("run-%07d", i), Queue: "default", State: bus.StatusSucceeded, Attempt: 1,
			Worker: "worker-" + strconv.Itoa(i%8), RequestSeq: uint64(i + 1), Model: "openai/gpt-4o-mini", Turns: 2,
			SubmittedAt: start.Add(time.Duration(i) * time.Millisecond), Title: "Summarise ticket #" + strconv.Itoa(i),
			Tenant: tenants[i%3], Usage: agent.Usage{Input: 1200, Output: 340, TotalTokens: 1540}, Cost: 0.0004,
			Metadata: map[string]string{"team": "support", "ticket": strconv.Itoa(i)}}
		r.StartedAt = r.SubmittedAt.Add(20 * time.Millisecond)
		r.HeartbeatAt = r.StartedAt.Add(2 * time.Second)
		r.FinishedAt = r.HeartbeatAt
		if i%5 == 4 {
			r.Queue = "other"
		}
		if i%7 == 0 {
			r.Model = "openai/gpt-4o"
		}
		switch i % 100 {
		case 90, 91, 92, 93, 94, 95:
			r.State, r.Reason, r.Error = bus.StatusFailed, "model_error", "429 rate limited"
		case 96, 97, 98:
			r.State, r.Reason, r.Error = bus.StatusAborted, "aborted_by_user", "wrong question"
		case 99:
			r.State, r.FinishedAt = bus.StateRunning, time.Time{}
		}
		data, _ := json.Marshal(r)
		if _, err := js.PublishAsync("$KV.agents_runs."+r.ID, data); err != nil {
			tb.Fatal(err)
		}
		if (i-from)%8192 == 8191 {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				tb.Fatal("publish acks late")
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		tb.Fatal("publish acks late")
	}
}

// BenchmarkRunsPage times GET /api/runs, the runs page's request, on the
// console's handler over a bucket of CONSOLE_BENCH_RECORDS records
// (default 300,000, written by fillRecords). Pages of 50:
//
//	go test ./cmd/console -run '^$' -bench RunsPage -benchtime 20x -timeout 20m
//
// Each reports ms-p50, ms-max and the records the page read.
func BenchmarkRunsPage(b *testing.B) {
	n := 300_000
	if v := os.Getenv("CONSOLE_BENCH_RECORDS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	fl := fleettest.Start(b, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default", "other"}}})
	t0 := time.Now()
	fillRecords(b, fl, 0, n)
	b.Logf("%d records written in %s", n, time.Since(t0).Round(time.Millisecond))
	f := &testFleet{Fleet: fl, t: b, srv: fl.Server, c: fl.Client}
	c := newConsole(b, f, serverConfig{})
	// A cursor halfway down: the revision of the record in the middle.
	middle, err := fl.Client.Status(fleettest.Context(b), fmt.Sprintf("run-%07d", n/2))
	if err != nil {
		b.Fatal(err)
	}
	half := strconv.FormatUint(middle.Revision, 10)
	cases := []struct {
		name, query string
		want        int // records, -1 any
	}{
		{"unfiltered", "limit=50", 50},
		{"state-succeeded", "limit=50&state=succeeded", 50},
		{"state-failed", "limit=50&state=failed", 50},
		{"state-aborted", "limit=50&state=aborted", 50},
		{"state-running", "limit=50&state=running", 50},
		{"unfiltered-page-at-half", "limit=50&before=" + half, 50},
		{"failed-page-at-half", "limit=50&state=failed&before=" + half, 50},
		{"tenant-and-model", "limit=50&tenant=acme&model=openai/gpt-4o", 50},
		{"metadata-none-bounded-scan", "limit=50&meta=team%3Dnobody", 0},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			var times []time.Duration
			var p runsPage
			for b.Loop() {
				start := time.Now()
				getPage(b, c, "/api/runs?"+tc.query, &p)
				times = append(times, time.Since(start))
			}
			if tc.want >= 0 && len(p.Runs) != tc.want {
				b.Fatalf("%d runs, want %d", len(p.Runs), tc.want)
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms-p50")
			b.ReportMetric(float64(times[len(times)-1].Microseconds())/1000, "ms-max")
			b.ReportMetric(float64(p.Scanned), "records-read")
			b.ReportMetric(float64(p.Stored), "records-stored")
		})
	}
}

// getPage reads one page of the runs list.
func getPage(tb testing.TB, c *console, path string, p *runsPage) {
	tb.Helper()
	resp, err := c.Client().Get(c.URL + path)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("%s: %d %s", path, resp.StatusCode, body)
	}
	*p = runsPage{}
	if err := json.Unmarshal(body, p); err != nil {
		tb.Fatal(err)
	}
}
