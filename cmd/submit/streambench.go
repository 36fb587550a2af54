package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
)

// streamRun is one streaming run as the bench sees it.
type streamRun struct {
	attempt  int
	seq      uint64 // last seq of attempt
	started  bool
	finished bool
}

// streamFollower follows many long runs at once through one core
// subscription on the events wildcard. Each envelope is checked against
// its run's last seq (gaps, duplicates); its delay is now minus its ts
// (the worker's clock when it built the envelope, in ms), counted only
// once every run has started.
type streamFollower struct {
	prefix string
	n      int

	mu            sync.Mutex
	runs          map[string]*streamRun
	startedRuns   int
	allStarted    time.Time
	firstFinished time.Time
	// The CPU at the window's ends: the bench's own use is reported over
	// the window its events/s cover, not its ramp and drain.
	cpuAtAllStarted, cpuAtFirstFinished cpuMark
	finished                            int
	failed                              int
	reasons                             map[string]int
	gaps, dups                          int
	undecodable                         int
	events                              int      // all received
	window                              int      // received between allStarted and firstFinished
	delays                              []uint32 // ms histogram of the window's events
	late                                int      // delays past the histogram
	done                                chan struct{}
}

const delayBuckets = 60_000 // ms

func (b *streamFollower) onEvent(m *nats.Msg) {
	now := time.Now()
	id, ok := strings.CutPrefix(m.Subject, b.prefix)
	if !ok {
		return
	}
	if id, ok = strings.CutSuffix(id, ".events"); !ok {
		return
	}
	seq, attempt, ts, ok := envelopeHead(m.Data)
	typ, _ := eventTypes(m.Data)
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.runs[id]
	if r == nil {
		return
	}
	b.events++
	switch {
	case !ok:
		b.undecodable++
	case attempt > r.attempt:
		r.attempt, r.seq = attempt, seq
		if seq != 1 {
			b.gaps++
		}
	case attempt < r.attempt:
		// an older attempt's late event: nothing to check
	case seq == r.seq+1:
		r.seq = seq
	case seq <= r.seq:
		b.dups++
	default:
		b.gaps++
		r.seq = seq
	}
	if !b.allStarted.IsZero() && b.firstFinished.IsZero() {
		b.window++
		if d := now.UnixMilli() - ts; d >= 0 && d < delayBuckets {
			b.delays[d]++
		} else if d >= delayBuckets {
			b.late++
		} else {
			b.delays[0]++ // clock resolution
		}
	}
	switch typ {
	case bus.EventRunStarted:
		if !r.started {
			r.started = true
			b.startedRuns++
			if b.startedRuns == b.n {
				b.allStarted = now
				b.cpuAtAllStarted = markCPU(now)
			}
		}
	case bus.EventRunFinished:
		if r.finished {
			return
		}
		r.finished = true
		b.finished++
		if b.firstFinished.IsZero() {
			b.firstFinished = now
			b.cpuAtFirstFinished = markCPU(now)
		}
		if status, reason := finishedStatus(m.Data); status != bus.StatusSucceeded {
			b.failed++
			b.reasons[status+"/"+reason]++
		}
		if b.finished == b.n {
			close(b.done)
		}
	}
}

// windowCPU is the bench's own CPU over the window its events/s cover,
// and what it was measured over: the whole bench (start to now) when
// there was no window (not every run started, or one finished before the
// last started). Caller holds b.mu.
func (b *streamFollower) windowCPU(start, now cpuMark) (benchCPU, string) {
	if !b.allStarted.IsZero() {
		end := now
		if !b.firstFinished.IsZero() {
			end = b.cpuAtFirstFinished
		}
		if end.wall.After(b.allStarted) {
			return cpuBetween(b.cpuAtAllStarted, end), "over the window"
		}
	}
	return cpuBetween(start, now), "over the bench (no window)"
}

// envelopeHead reads seq, attempt and ts from the start of an envelope as
// bus.Envelope.AppendJSON writes it, falling back to a full decode.
func envelopeHead(data []byte) (seq uint64, attempt int, ts int64, ok bool) {
	num := func(key string) (int64, bool) {
		i := bytes.Index(data, []byte(key))
		if i < 0 {
			return 0, false
		}
		rest := data[i+len(key):]
		j := 0
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		v, err := strconv.ParseInt(string(rest[:j]), 10, 64)
		return v, err == nil
	}
	s, ok1 := num(`,"seq":`)
	a, ok2 := num(`,"attempt":`)
	t, ok3 := num(`,"ts":`)
	if ok1 && ok2 && ok3 {
		return uint64(s), int(a), t, true
	}
	env, err := bus.DecodeEnvelope(data)
	if err != nil {
		return 0, 0, 0, false
	}
	return env.Seq, env.Attempt, env.TS, true
}

// percentile of a ms histogram.
func histPercentile(h []uint32, total int, p float64) float64 {
	if total == 0 {
		return 0
	}
	want := int(p * float64(total))
	seen := 0
	for ms, c := range h {
		seen += int(c)
		if seen > want {
			return float64(ms)
		}
	}
	return float64(len(h))
}

// streamResult is what submit bench --streaming prints (JSON with --json).
type streamResult struct {
	Runs            int            `json:"runs"`
	DeltasPerSecond float64        `json:"deltasPerSecond"`
	Failed          int            `json:"failed"`
	Reasons         map[string]int `json:"reasons,omitempty"`
	Gaps            int            `json:"gaps"`
	Duplicates      int            `json:"duplicates"`
	Dropped         int            `json:"dropped"`
	Undecodable     int            `json:"undecodable,omitempty"`
	// RampSeconds: from the first submit to every run started.
	RampSeconds float64 `json:"rampSeconds"`
	// The window: every run started, none finished yet.
	WindowSeconds float64 `json:"windowSeconds"`
	EventsPerSec  float64 `json:"eventsPerSec"`
	DelayMs       struct {
		P50  float64 `json:"p50"`
		P90  float64 `json:"p90"`
		P99  float64 `json:"p99"`
		P999 float64 `json:"p999"`
		Max  float64 `json:"max"`
	} `json:"delayMs"`
	Events int `json:"events"`
	// The bench process's own CPU over the window (over the whole bench
	// when it had none).
	benchCPU
}

func streamBench(ctx context.Context, e *env, c *bus.Client, bf *benchFlags, body []byte) int {
	names := c.Names()
	b := &streamFollower{prefix: names.Prefix() + ".run.", n: bf.runs, runs: make(map[string]*streamRun, bf.runs),
		reasons: map[string]int{}, delays: make([]uint32, delayBuckets), done: make(chan struct{})}
	sub, err := c.Conn().Subscribe(names.Events("*"), b.onEvent)
	if err != nil {
		return fail(e, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, 1<<30)
	if err := c.Conn().Flush(); err != nil {
		return fail(e, err)
	}
	bctx, cancel := context.WithTimeout(ctx, bf.timeout+bf.duration)
	defer cancel()
	prefix := "stream-" + bus.NewRunID()[:8] + "-"
	start := time.Now()
	cpuAtStart := markCPU(start)
	var wg sync.WaitGroup
	var submitErr error
	var errOnce sync.Once
	sem := make(chan struct{}, 256) // submits in flight
	for i := range bf.runs {
		id := prefix + strconv.Itoa(i)
		b.mu.Lock()
		b.runs[id] = &streamRun{}
		b.mu.Unlock()
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := c.SubmitRaw(bctx, bf.queue, id, body); err != nil && bctx.Err() == nil {
				errOnce.Do(func() { submitErr = fleetError(c, err) })
				cancel()
			}
		})
	}
	wg.Wait()
	interrupted := false
	select {
	case <-b.done:
	case <-bctx.Done():
	case <-e.interrupts:
		interrupted = true
	}
	if submitErr != nil {
		return fail(e, submitErr)
	}
	dropped, _ := sub.Dropped()
	b.mu.Lock()
	defer b.mu.Unlock()
	res := streamResult{Runs: bf.runs, DeltasPerSecond: bf.deltasPerSecond, Failed: b.failed + (bf.runs - b.finished),
		Reasons: b.reasons, Gaps: b.gaps, Duplicates: b.dups, Dropped: dropped, Undecodable: b.undecodable, Events: b.events}
	now := markCPU(time.Now())
	var cpuOver string
	res.benchCPU, cpuOver = b.windowCPU(cpuAtStart, now)
	if !b.allStarted.IsZero() {
		res.RampSeconds = round3(b.allStarted.Sub(start).Seconds())
		end := b.firstFinished
		if end.IsZero() {
			end = now.wall
		}
		if w := end.Sub(b.allStarted).Seconds(); w > 0 {
			res.WindowSeconds = round3(w)
			res.EventsPerSec = round3(float64(b.window) / w)
		}
		res.DelayMs.P50 = histPercentile(b.delays, b.window, 0.50)
		res.DelayMs.P90 = histPercentile(b.delays, b.window, 0.90)
		res.DelayMs.P99 = histPercentile(b.delays, b.window, 0.99)
		res.DelayMs.P999 = histPercentile(b.delays, b.window, 0.999)
		for ms := len(b.delays) - 1; ms >= 0; ms-- {
			if b.delays[ms] > 0 {
				res.DelayMs.Max = float64(ms)
				break
			}
		}
		if b.late > 0 {
			res.DelayMs.Max = delayBuckets
		}
	}
	if bf.json {
		if err := json.NewEncoder(e.stdout).Encode(res); err != nil {
			return fail(e, err)
		}
	} else {
		fmt.Fprintf(e.stdout, "runs        %d streaming %.0f deltas/s, %d failed, %d gaps, %d duplicates, %d dropped\n",
			res.Runs, res.DeltasPerSecond, res.Failed, res.Gaps, res.Duplicates, res.Dropped)
		fmt.Fprintf(e.stdout, "ramp        %.1f s until every run had started\n", res.RampSeconds)
		fmt.Fprintf(e.stdout, "sustained   %.0f events/s over %.1f s (every run started, none finished)\n", res.EventsPerSec, res.WindowSeconds)
		fmt.Fprintf(e.stdout, "delay ms    p50 %.0f  p90 %.0f  p99 %.0f  p99.9 %.0f  max %.0f (event ts to receipt)\n",
			res.DelayMs.P50, res.DelayMs.P90, res.DelayMs.P99, res.DelayMs.P999, res.DelayMs.Max)
		fmt.Fprintf(e.stdout, "bench CPU   %s %s\n", cpuLine(res.benchCPU), cpuOver)
	}
	switch {
	case interrupted:
		return exitDetached
	case res.Failed > 0 || res.Gaps > 0 || res.Duplicates > 0 || res.Dropped > 0:
		return exitFailed
	}
	return exitOK
}
