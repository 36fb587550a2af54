package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// percentiles of a latency sample, in milliseconds.
type percentiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// summarize computes nearest-rank percentiles; an empty sample gives zeros.
func summarize(sample []time.Duration) percentiles {
	if len(sample) == 0 {
		return percentiles{}
	}
	s := slices.Clone(sample)
	slices.Sort(s)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		i = min(max(i, 0), len(s)-1)
		return ms(s[i])
	}
	return percentiles{P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: ms(s[len(s)-1])}
}

func ms(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}

// benchResult is what submit bench --json prints: exactly these fields.
type benchResult struct {
	Runs                int         `json:"runs"`
	Failed              int         `json:"failed"`
	Seconds             float64     `json:"seconds"`
	RunsPerSec          float64     `json:"runsPerSec"`
	EventsPerSec        float64     `json:"eventsPerSec"`
	StartLatencyMs      percentiles `json:"startLatencyMs"`
	FirstDeltaLatencyMs percentiles `json:"firstDeltaLatencyMs"`
	// The bench process's own CPU over seconds: from the first submit to
	// the last run_finished (or the report, when not all finished).
	benchCPU
}

// benchReport is a result with the context the table prints.
type benchReport struct {
	benchResult
	Finished    int
	Events      int
	Dropped     int
	Offered     float64 // runs/s offered; 0 = as fast as possible
	Concurrency int
	Reasons     map[string]int // failures by reason
	Interrupted bool
}

// writeBenchTable prints a report as a table.
func writeBenchTable(w io.Writer, r *benchReport) {
	fmt.Fprintf(w, "runs            %d finished of %d, %d failed\n", r.Finished, r.Runs, r.Failed)
	if len(r.Reasons) > 0 {
		var parts []string
		for _, k := range sortedKeys(r.Reasons) {
			parts = append(parts, fmt.Sprintf("%s %d", k, r.Reasons[k]))
		}
		fmt.Fprintf(w, "failures        %s\n", strings.Join(parts, ", "))
	}
	load := "as fast as possible"
	if r.Offered > 0 {
		load = fmt.Sprintf("%g runs/s offered", r.Offered)
	}
	conc := fmt.Sprint(r.Concurrency)
	if r.Concurrency <= 0 {
		conc = "unbounded"
	}
	fmt.Fprintf(w, "load            %s, concurrency %s\n", load, conc)
	fmt.Fprintf(w, "duration        %.2fs\n", r.Seconds)
	fmt.Fprintf(w, "runs/s          %.1f\n", r.RunsPerSec)
	perRun := 0.0
	if r.Finished > 0 {
		perRun = float64(r.Events) / float64(r.Finished)
	}
	fmt.Fprintf(w, "events/s        %.0f (%d events, %.1f per run)\n", r.EventsPerSec, r.Events, perRun)
	fmt.Fprintf(w, "bench CPU       %s\n", cpuLine(r.benchCPU))
	if r.Dropped > 0 {
		fmt.Fprintf(w, "dropped         %d events (the bench could not keep up)\n", r.Dropped)
	}
	fmt.Fprintf(w, "\nlatency (ms)             p50      p90      p99      max\n")
	row := func(name string, p percentiles) {
		fmt.Fprintf(w, "%-20s %8.2f %8.2f %8.2f %8.2f\n", name, p.P50, p.P90, p.P99, p.Max)
	}
	row("submit->run_started", r.StartLatencyMs)
	row("submit->first delta", r.FirstDeltaLatencyMs)
	if r.Interrupted {
		fmt.Fprintln(w, "\ninterrupted: figures cover the runs finished so far")
	}
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// progressBar draws "[=====>    ] done/total · rate" on one line.
func progressBar(done, total, failed int, elapsed time.Duration, width int) string {
	if width <= 0 {
		width = 80
	}
	rate := 0.0
	if elapsed > 0 {
		rate = float64(done) / elapsed.Seconds()
	}
	tail := fmt.Sprintf(" %d/%d runs · %.0f runs/s", done, total, rate)
	if failed > 0 {
		tail += fmt.Sprintf(" · %d failed", failed)
	}
	barW := min(40, width-len(tail)-3)
	if barW < 5 {
		return strings.TrimSpace(tail)
	}
	filled := 0
	if total > 0 {
		filled = done * barW / total
	}
	bar := strings.Repeat("=", filled)
	if filled < barW {
		bar += ">" + strings.Repeat(" ", barW-filled-1)
	}
	return "[" + bar + "]" + tail
}

// cpuMark is this process's CPU time at one moment: a load generator
// that fills a core measures itself, not the fleet, so the bench reports
// its own use beside its figures.
type cpuMark struct {
	wall time.Time
	cpu  time.Duration
	ok   bool // false where the system does not say
}

func markCPU(now time.Time) cpuMark {
	cpu, ok := processCPU()
	return cpuMark{wall: now, cpu: cpu, ok: ok}
}

// benchCPU is the CPU a bench used over its measured window; both
// fields are absent where the system does not say.
type benchCPU struct {
	// CPUCores is CPUSeconds over the window's wall time.
	CPUCores   *float64 `json:"cpuCores,omitempty"`
	CPUSeconds *float64 `json:"cpuSeconds,omitempty"`
}

// cpuBetween is the CPU used from a to b; empty when it was not measured
// or no time passed.
func cpuBetween(a, b cpuMark) benchCPU {
	wall := b.wall.Sub(a.wall)
	if !a.ok || !b.ok || wall <= 0 {
		return benchCPU{}
	}
	used := b.cpu - a.cpu
	cores := math.Round(float64(used)/float64(wall)*1000) / 1000
	secs := math.Round(used.Seconds()*10000) / 10000
	return benchCPU{CPUCores: &cores, CPUSeconds: &secs}
}

// cpuLine is the table's line for c.
func cpuLine(c benchCPU) string {
	if c.CPUCores == nil || c.CPUSeconds == nil {
		return "not measured on this system"
	}
	return fmt.Sprintf("%.3f of a core, %.4f s (this process)", *c.CPUCores, *c.CPUSeconds)
}
