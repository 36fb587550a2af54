package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkFleetTracing is the fleet benchmark (submit bench, faux runs of
// 20 text deltas) with tracing off and on, alternating, three rounds each
// way in one session: on, the worker and submit export every span
// (OTEL_TRACES_SAMPLER=parentbased_always_on) over OTLP/HTTP to a receiver
// in this process that discards them. Each round has a fresh worker with
// its embedded NATS server. It reports the medians' runs/s and their
// ratio; run it with -benchtime 1x (AGENTS_BENCH_RUNS sets the runs per
// round, default 2000):
//
//	go test ./cmd/submit -run '^$' -bench FleetTracing -benchtime 1x
func BenchmarkFleetTracing(b *testing.B) {
	runs := 2000
	if v, err := strconv.Atoi(os.Getenv("AGENTS_BENCH_RUNS")); err == nil && v > 0 {
		runs = v
	}
	discard := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer discard.Close()
	otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + discard.URL, "OTEL_TRACES_SAMPLER=parentbased_always_on"}
	got := map[bool][]float64{}
	for b.Loop() {
		for round := range 3 {
			for _, on := range []bool{false, true} {
				var env, args []string
				if on {
					env, args = otel, []string{"--otel"}
				}
				dir := b.TempDir()
				stop, url, err := startWorkerProcess(filepath.Join(dir, "worker.log"), env,
					"--nats-listen", "127.0.0.1:0", "--data-dir", dir, "--concurrency", "64")
				if err != nil {
					b.Fatal(err)
				}
				p := startWithEnv(b, append(submitEnv("NATS_URL="+url), env...), append(args, "bench", "--runs", strconv.Itoa(runs),
					"--concurrency", "64", "--deltas", "20", "--json")...)
				<-p.done // bench bounds itself (--timeout)
				code := p.code
				if err := stop(); err != nil {
					b.Error(err)
				}
				var res benchResult
				if err := json.Unmarshal([]byte(p.stdout.String()), &res); err != nil || code != 0 || res.Failed > 0 {
					b.Fatalf("bench (tracing %v): exit %d %v\n%s\n%s", on, code, err, p.stdout, p.stderr)
				}
				load, _ := os.ReadFile("/proc/loadavg")
				b.Logf("round %d tracing %-5v: %.0f runs/s, start p50 %.0f ms, load %s", round+1, on, res.RunsPerSec,
					res.StartLatencyMs.P50, strings.Join(strings.Fields(string(load))[:3], " "))
				got[on] = append(got[on], res.RunsPerSec)
			}
		}
	}
	off, on := median(got[false]), median(got[true])
	b.ReportMetric(off, "off-runs/s")
	b.ReportMetric(on, "on-runs/s")
	b.ReportMetric(on/off, "on/off")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
