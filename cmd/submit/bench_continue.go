package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// Continuation bench (issue 54): a finished run with a transcript of
// --continue-bytes, then --continuations continuations of it at once. It
// reports the worker's peak RSS (its /metrics), the events each
// continuation stored (the events stream's growth over them) and the
// server's slow consumers (its /varz) over them.

type continueBenchFlags struct {
	bytes         string
	n             int
	serverMonitor string
}

func (cb *continueBenchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&cb.bytes, "continue-bytes", "", "continuation mode: build a finished run whose transcript is this large (e.g. 32MB), then submit --continuations continuations of it at once")
	fs.IntVar(&cb.n, "continuations", 8, "continuation mode: continuations submitted at once")
	fs.StringVar(&cb.serverMonitor, "server-monitor", "http://127.0.0.1:8222", "continuation mode: nats-server's monitoring address, read for slow consumers (/varz)")
}

// parseByteCount reads 32MB, 32MiB, 500KB, 1048576.
func parseByteCount(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.m
			break
		}
	}
	n, err := strconv.ParseFloat(t, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a size (e.g. 32MB)", s)
	}
	return int64(n * float64(mult)), nil
}

type continueBenchResult struct {
	TranscriptBytes       int64    `json:"transcriptBytes"`
	ChainRuns             int      `json:"chainRuns"`
	Continuations         int      `json:"continuations"`
	Failed                int      `json:"failed"`
	Seconds               float64  `json:"seconds"`
	WorkerRSSBeforeMiB    float64  `json:"workerRssBeforeMiB"`
	WorkerRSSPeakMiB      float64  `json:"workerRssPeakMiB"`
	EventBytesPerContinue int64    `json:"eventBytesPerContinuation"`
	SlowConsumers         int64    `json:"slowConsumers"`
	Errors                []string `json:"errors,omitempty"`
}

// continueBench runs the mode; the worker's RSS comes from --worker-metrics
// (shared with the approvals mode), the default address when not given.
func continueBench(ctx context.Context, e *env, c *bus.Client, bf *benchFlags, cb *continueBenchFlags) int {
	queue, asJSON, metricsURL := bf.queue, bf.json, bf.workerMetrics
	if metricsURL == "" {
		metricsURL = "http://127.0.0.1:9464/metrics"
	}
	target, err := parseByteCount(cb.bytes)
	if err != nil {
		return fail(e, usagef("--continue-bytes: %v", err))
	}
	if cb.n < 1 {
		return fail(e, usagef("--continuations must be at least 1"))
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	var res continueBenchResult
	if rss, err := workerRSS(ctx, hc, metricsURL); err == nil {
		res.WorkerRSSBeforeMiB = mib(rss)
	} else {
		fmt.Fprintf(e.stderr, "bench: no worker RSS (%v): is the worker's --metrics-addr %s?\n", err, metricsURL)
	}
	prior, n, size, err := buildTranscript(ctx, e, c, queue, target)
	if err != nil {
		return fail(e, err)
	}
	res.TranscriptBytes, res.ChainRuns, res.Continuations = size, n, cb.n
	slowBefore, slowErr := slowConsumers(ctx, hc, cb.serverMonitor)
	if slowErr != nil {
		fmt.Fprintf(e.stderr, "bench: no slow consumer count (%v): is nats-server's monitoring on at %s?\n", slowErr, cb.serverMonitor)
	}
	eventsBefore, err := eventsBytes(ctx, c)
	if err != nil {
		return fail(e, err)
	}

	// RSS sampled every 50 ms while the continuations run.
	sctx, stopSampling := context.WithCancel(ctx)
	var peak atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if rss, err := workerRSS(sctx, hc, metricsURL); err == nil && rss > peak.Load() {
				peak.Store(rss)
			}
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range cb.n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := runContinuation(ctx, c, queue, prior, i)
			if err != nil {
				mu.Lock()
				res.Failed++
				res.Errors = append(res.Errors, err.Error())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	stopSampling()
	<-sampled
	res.WorkerRSSPeakMiB = mib(peak.Load())
	if eventsAfter, err := eventsBytes(ctx, c); err == nil {
		res.EventBytesPerContinue = (eventsAfter - eventsBefore) / int64(cb.n)
	}
	res.SlowConsumers = -1
	if slowErr == nil {
		if after, err := slowConsumers(ctx, hc, cb.serverMonitor); err == nil {
			res.SlowConsumers = after - slowBefore
		}
	}
	if asJSON {
		if err := json.NewEncoder(e.stdout).Encode(res); err != nil {
			return fail(e, err)
		}
	} else {
		fmt.Fprintf(e.stdout, "transcript      %d bytes (%d chained runs)\n", res.TranscriptBytes, res.ChainRuns)
		fmt.Fprintf(e.stdout, "continuations   %d at once, %d failed, %.1f s\n", res.Continuations, res.Failed, res.Seconds)
		fmt.Fprintf(e.stdout, "worker RSS      %.0f MiB before, %.0f MiB peak\n", res.WorkerRSSBeforeMiB, res.WorkerRSSPeakMiB)
		fmt.Fprintf(e.stdout, "events stored   %d bytes per continuation\n", res.EventBytesPerContinue)
		fmt.Fprintf(e.stdout, "slow consumers  %d\n", res.SlowConsumers)
		for _, err := range res.Errors {
			fmt.Fprintln(e.stderr, "bench: "+err)
		}
	}
	if res.Failed > 0 {
		return exitFailed
	}
	return exitOK
}

// buildTranscript chains runs, each continuing the one before with about
// 900 KB of new messages (a request holds at most 1 MiB), until the
// transcript is target bytes; it returns the last run.
func buildTranscript(ctx context.Context, e *env, c *bus.Client, queue string, target int64) (string, int, int64, error) {
	const part = 220 << 10 // one message's text (each at most 256 KiB as JSON)
	const line = "All work and no play makes a long transcript. "
	text := strings.Repeat(line, part/len(line)+1)[:part]
	prev := ""
	var size int64
	n := 0
	for size < target {
		req := &bus.RunRequest{ID: "bench-tr-" + bus.NewRunID()[:12], Model: &bus.ModelRef{Provider: "faux", ID: "bench"},
			Messages:     []agent.Message{agent.UserText(text), agent.UserText(text), agent.UserText(text)},
			Prompt:       text,
			ContinueFrom: prev,
			Faux:         &bus.FauxScript{Responses: []agent.ScriptedResponse{{Content: []agent.Content{agent.Text("noted")}}}}}
		if err := submitAndWait(ctx, c, queue, req); err != nil {
			return "", n, size, fmt.Errorf("building the transcript (run %d, %d bytes so far): %w", n+1, size, err)
		}
		h, err := c.SnapshotInfo(ctx, req.ID)
		if err != nil {
			return "", n, size, fmt.Errorf("building the transcript: run %s has no snapshot: %w", req.ID, err)
		}
		prev, size, n = req.ID, h.Bytes, n+1
		fmt.Fprintf(e.stderr, "\rbench: transcript %d of %d bytes (%d runs)", size, target, n)
	}
	fmt.Fprintln(e.stderr)
	return prev, n, size, nil
}

func runContinuation(ctx context.Context, c *bus.Client, queue, prior string, i int) error {
	req := &bus.RunRequest{ID: fmt.Sprintf("bench-cont-%s-%d", bus.NewRunID()[:10], i), Model: &bus.ModelRef{Provider: "faux", ID: "bench"},
		Prompt: "And what follows from that?", ContinueFrom: prior,
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{{Content: []agent.Content{agent.Text("That it goes on.")}}}}}
	return submitAndWait(ctx, c, queue, req)
}

func submitAndWait(ctx context.Context, c *bus.Client, queue string, req *bus.RunRequest) error {
	if _, err := c.Submit(ctx, queue, req); err != nil {
		return err
	}
	t, err := c.LoadTranscript(ctx, req.ID)
	if err != nil {
		return err
	}
	if t.Finished == nil {
		return fmt.Errorf("run %s did not finish", req.ID)
	}
	if t.Finished.Status != bus.StatusSucceeded {
		return fmt.Errorf("run %s %s (%s): %s", req.ID, t.Finished.Status, t.Finished.Reason, t.Finished.Error)
	}
	return nil
}

func eventsBytes(ctx context.Context, c *bus.Client) (int64, error) {
	s, err := c.JetStream().Stream(ctx, c.Names().EventsStream())
	if err != nil {
		return 0, err
	}
	return int64(s.CachedInfo().State.Bytes), nil
}

// workerRSS reads process_resident_memory_bytes from the worker's /metrics.
func workerRSS(ctx context.Context, hc *http.Client, url string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_resident_memory_bytes "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int64(f), err
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("no process_resident_memory_bytes")
}

// slowConsumers reads the server's slow consumer count (/varz).
func slowConsumers(ctx context.Context, hc *http.Client, monitor string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(monitor, "/")+"/varz", nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var v struct {
		SlowConsumers int64 `json:"slow_consumers"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&v); err != nil {
		return 0, err
	}
	return v.SlowConsumers, nil
}
