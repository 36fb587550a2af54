//go:build unix

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
	"syscall"
	"testing"
	"time"
)

// BenchmarkFleetTracing is the fleet benchmark (submit bench, faux runs of
// 20 text deltas) with tracing off and on, alternating (on first in the
// even rounds), three rounds each way in one session: on, the worker and submit export every span
// (OTEL_TRACES_SAMPLER=parentbased_always_on) over OTLP/HTTP to a receiver
// in this process that discards them. Each round has a fresh worker with
// its embedded NATS server. It reports the medians' runs/s and their
// ratio, and the median CPU time per run of the worker, submit and this
// process together and of the worker alone (getrusage; the worker's is
// the children's less submit's); each round's line also gives submit's
// and this process's (the receiver, the worker log's reader and
// TestMain's NATS server);
// run it with -benchtime 1x (AGENTS_BENCH_RUNS sets the runs per round,
// default 10,000; smaller rounds are noisier):
//
//	go test ./cmd/submit -run '^$' -bench FleetTracing -benchtime 1x
func BenchmarkFleetTracing(b *testing.B) {
	runs := 10000
	if v, err := strconv.Atoi(os.Getenv("AGENTS_BENCH_RUNS")); err == nil && v > 0 {
		runs = v
	}
	discard := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer discard.Close()
	otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + discard.URL, "OTEL_TRACES_SAMPLER=parentbased_always_on"}
	got, cpu, workerCPU := map[bool][]float64{}, map[bool][]float64{}, map[bool][]float64{}
	for b.Loop() {
		for round := range 3 {
			// The order alternates too: a load that grows or shrinks
			// during the session favours neither setting.
			for _, on := range []bool{round%2 == 1, round%2 == 0} {
				var env, args []string
				if on {
					env, args = otel, []string{"--otel"}
				}
				dir := b.TempDir()
				cpu0, self0 := cpuTime(), selfCPU()
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
				perRun := float64((cpuTime() - cpu0).Microseconds()) / float64(runs)
				selfPerRun := float64((selfCPU() - self0).Microseconds()) / float64(runs)
				submitPerRun := float64((p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime()).Microseconds()) / float64(runs)
				var res benchResult
				if err := json.Unmarshal([]byte(p.stdout.String()), &res); err != nil || code != 0 || res.Failed > 0 {
					b.Fatalf("bench (tracing %v): exit %d %v\n%s\n%s", on, code, err, p.stdout, p.stderr)
				}
				load, _ := os.ReadFile("/proc/loadavg")
				b.Logf("round %d tracing %-5v: %.0f runs/s, start p50 %.0f ms, CPU %.0f µs/run (worker %.0f, submit %.0f, this process %.0f), load %s", round+1, on, res.RunsPerSec,
					res.StartLatencyMs.P50, perRun, perRun-selfPerRun-submitPerRun, submitPerRun, selfPerRun, strings.Join(strings.Fields(string(load))[:3], " "))
				got[on] = append(got[on], res.RunsPerSec)
				cpu[on] = append(cpu[on], perRun)
				workerCPU[on] = append(workerCPU[on], perRun-selfPerRun-submitPerRun)
			}
		}
	}
	off, on := median(got[false]), median(got[true])
	b.ReportMetric(off, "off-runs/s")
	b.ReportMetric(on, "on-runs/s")
	b.ReportMetric(on/off, "on/off")
	b.ReportMetric(median(cpu[false]), "off-cpu-µs/run")
	b.ReportMetric(median(cpu[true]), "on-cpu-µs/run")
	b.ReportMetric(median(workerCPU[false]), "off-worker-cpu-µs/run")
	b.ReportMetric(median(workerCPU[true]), "on-worker-cpu-µs/run")
}

// cpuTime is the CPU time of this process and its waited-for children.
func cpuTime() time.Duration {
	var self, children syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
	var total time.Duration
	for _, tv := range []syscall.Timeval{self.Utime, self.Stime, children.Utime, children.Stime} {
		total += time.Duration(tv.Nano())
	}
	return total
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// selfCPU is the CPU time of this process alone (the receiver).
func selfCPU() time.Duration {
	d, _ := processCPU()
	return d
}
