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
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// The approvals mode of submit bench (--approvals): N faux runs whose one
// calculator call is gated by an approval policy all wait for an answer;
// then every call is approved at once. It reports the wake latency, from
// an answer stored (its publish acknowledged by AGENTS_CONTROL) to the
// run's tool_approval_resolved event seen by the bench (a core
// subscription on the events wildcard: the worker has taken the answer and
// resumes the call), and the worker's RSS (process_resident_memory_bytes
// of its /metrics) idle before the runs and sampled while they wait.

// registerApprovalsBench adds the mode's flags.
func registerApprovalsBench(fs *flag.FlagSet, bf *benchFlags) {
	fs.BoolVar(&bf.approvals, "approvals", false, "approvals mode: --runs faux runs whose calculator call waits for approval, then all approved at once; reports answer stored -> tool_approval_resolved latency and the worker's RSS idle and while they wait (a worker serving --queue must allow faux; its --max-waiting bounds the runs that wait)")
	fs.BoolVar(&bf.parked, "parked", false, "approvals mode: answer only once every run has parked (run_parked: a worker with --park-after), so the latency is the wake's")
	fs.StringVar(&bf.workerMetrics, "worker-metrics", "", "approvals and continuation modes: the worker's /metrics URL (e.g. http://127.0.0.1:9464/metrics) to sample its RSS from; empty: RSS not measured (continuation mode: that example address)")
}

// approvalsBenchResult is the mode's --json.
type approvalsBenchResult struct {
	Runs int `json:"runs"`
	// Waiting: runs whose call asked for approval; Refused: calls the
	// worker refused at once (over its --max-waiting).
	Waiting     int     `json:"waiting"`
	Refused     int     `json:"refused"`
	WaitSeconds float64 `json:"waitSeconds"` // first submit -> the last run waiting
	// ParkSeconds (--parked): first submit -> the last run parked.
	ParkSeconds   float64 `json:"parkSeconds,omitempty"`
	AnswerSeconds float64 `json:"answerSeconds"` // first answer sent -> the last stored
	Finished      int     `json:"finished"`
	Failed        int     `json:"failed"`
	// WakeLatencyMs: answer stored -> tool_approval_resolved seen.
	WakeLatencyMs percentiles `json:"wakeLatencyMs"`
	// StartLatencyMs (--parked): answer stored -> the woken attempt's
	// run_started seen (issue 54's target).
	StartLatencyMs *percentiles `json:"startLatencyMs,omitempty"`
	// The worker's RSS in bytes: idle before the runs, the largest and
	// last sample while they all wait; 0 when --worker-metrics was not
	// read. RSSPerWaitingRun is (last - idle) / waiting.
	RSSIdle          int64   `json:"rssIdleBytes"`
	RSSWaitingMax    int64   `json:"rssWaitingMaxBytes"`
	RSSWaitingLast   int64   `json:"rssWaitingLastBytes"`
	RSSPerWaitingRun float64 `json:"rssPerWaitingRunBytes"`
	RSSSamples       int     `json:"rssSamples"`
}

// approvalsBench is the mode's state: one run per id, filled from the
// events subscription.
type approvalsBench struct {
	prefix string
	mu     sync.Mutex
	runs   map[string]*approvalRun
	asked  chan struct{} // a value per run that asked or was refused
	parked chan struct{} // a value per run parked (its first run_parked)
	ended  chan struct{} // a value per run finished
}

type approvalRun struct {
	asked, refused, finished, failed, parked bool
	answered                                 time.Time // the answer's publish ack
	woke                                     time.Time // tool_approval_resolved seen
	started                                  time.Time // the first run_started after run_parked
}

func (b *approvalsBench) onEvent(m *nats.Msg) {
	now := time.Now()
	id, ok := strings.CutPrefix(m.Subject, b.prefix)
	if id, ok = strings.CutSuffix(id, ".events"); !ok {
		return
	}
	typ, _ := eventTypes(m.Data) // bench.go
	b.mu.Lock()
	r := b.runs[id]
	if r == nil {
		b.mu.Unlock()
		return
	}
	var asked, ended, parked bool
	switch typ {
	case bus.EventRunParked:
		parked = !r.parked
		r.parked = true
	case bus.EventRunStarted:
		if r.parked && r.started.IsZero() {
			r.started = now
		}
	case bus.EventToolApprovalRequested:
		asked = !r.asked && !r.refused
		r.asked = true
	case bus.EventToolApprovalResolved:
		if r.woke.IsZero() {
			r.woke = now
		}
	case string(agent.EventToolExecutionEnd):
		// A call refused at once ends without asking.
		if !r.asked && !r.refused {
			r.refused, asked = true, true
		}
	case bus.EventRunFinished:
		if !r.finished {
			r.finished, ended = true, true
			status, _ := finishedStatus(m.Data) // bench.go
			r.failed = status != bus.StatusSucceeded
			if !r.asked && !r.refused {
				r.refused, asked = true, true
			}
		}
	}
	b.mu.Unlock()
	// Buffered for every run: never blocks the callback.
	if asked {
		b.asked <- struct{}{}
	}
	if ended {
		b.ended <- struct{}{}
	}
	if parked {
		b.parked <- struct{}{}
	}
}

// approvalsBenchRequest is a faux run whose calculator call waits for
// approval (up to a day), then says "done".
func approvalsBenchRequest() ([]byte, error) {
	m, _ := bus.ParseModelRef("faux/bench")
	req := &bus.RunRequest{Model: &m, Prompt: "compute 6*7", Tools: []string{"calculator"}, Metadata: map[string]string{"bench": "approvals"},
		Approval: &bus.Approval{Tools: []string{"calculator"}, TimeoutSeconds: 86400},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.ToolCall("c1", "calculator", map[string]any{"expression": "6*7"})}, StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text("done")}}}}}
	if err := req.Validate(""); err != nil {
		return nil, err
	}
	return json.Marshal(req)
}

// benchSenders bounds the submits and answers in flight.
const benchSenders = 32

func runApprovalsBench(ctx context.Context, e *env, c *bus.Client, bf *benchFlags) int {
	body, err := approvalsBenchRequest()
	if err != nil {
		return fail(e, err)
	}
	ctx, cancel := context.WithTimeout(ctx, bf.timeout)
	defer cancel()
	rss := rssReader{url: bf.workerMetrics}
	res := approvalsBenchResult{Runs: bf.runs}
	if rss.url != "" {
		if res.RSSIdle, err = rss.read(ctx); err != nil {
			return fail(e, fmt.Errorf("--worker-metrics: %w", err))
		}
	}
	b := &approvalsBench{prefix: c.Names().Prefix() + ".run.", runs: make(map[string]*approvalRun, bf.runs),
		asked: make(chan struct{}, bf.runs), ended: make(chan struct{}, bf.runs), parked: make(chan struct{}, bf.runs)}
	ids := make([]string, bf.runs)
	tag := bus.NewRunID()[:8]
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-appr-%s-%d", tag, i)
		b.runs[ids[i]] = &approvalRun{}
	}
	sub, err := c.Conn().Subscribe(b.prefix+"*.events", b.onEvent)
	if err != nil {
		return fail(e, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1)
	if err := c.Conn().FlushWithContext(ctx); err != nil {
		return fail(e, err)
	}
	begin := time.Now()
	if err := inParallel(ctx, ids, func(ctx context.Context, id string) error {
		_, err := c.SubmitRaw(ctx, bf.queue, id, body)
		return err
	}); err != nil {
		return fail(e, fleetError(c, err))
	}
	// Every run asks (or is refused); RSS is sampled meanwhile.
	sampler := rss.every(ctx, time.Second)
	for range bf.runs {
		select {
		case <-b.asked:
		case <-ctx.Done():
			sampler.stop()
			return fail(e, fmt.Errorf("runs not all waiting after %s: %w", bf.timeout, ctx.Err()))
		}
	}
	res.WaitSeconds = round3(time.Since(begin).Seconds())
	if bf.parked {
		b.mu.Lock()
		refused := 0
		for _, r := range b.runs {
			if r.refused {
				refused++ // refused at once: never parks
			}
		}
		b.mu.Unlock()
		for range bf.runs - refused {
			select {
			case <-b.parked:
			case <-ctx.Done():
				sampler.stop()
				return fail(e, fmt.Errorf("runs not all parked after %s (does the worker park: --park-after?): %w", bf.timeout, ctx.Err()))
			}
		}
		res.ParkSeconds = round3(time.Since(begin).Seconds())
	}
	// Three more seconds of samples with every run waiting (a window of
	// the measure: a GC cycle may lag the last wait).
	settle := time.NewTimer(3 * time.Second)
	select {
	case <-settle.C:
	case <-ctx.Done():
	}
	samples := sampler.stop()
	if n := len(samples); n > 0 {
		res.RSSSamples = n
		res.RSSWaitingMax, res.RSSWaitingLast = slices.Max(samples), samples[n-1]
	}
	var waiting []string
	b.mu.Lock()
	for _, id := range ids {
		if r := b.runs[id]; r.asked {
			waiting = append(waiting, id)
		} else if r.refused {
			res.Refused++
		}
	}
	b.mu.Unlock()
	res.Waiting = len(waiting)
	if res.Waiting > 0 && res.RSSIdle > 0 && res.RSSWaitingLast > 0 {
		res.RSSPerWaitingRun = round3(float64(res.RSSWaitingLast-res.RSSIdle) / float64(res.Waiting))
	}
	answering := time.Now()
	if err := inParallel(ctx, waiting, func(ctx context.Context, id string) error {
		_, err := c.Answer(ctx, id, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove, By: "bench"})
		stored := time.Now()
		if err == nil {
			b.mu.Lock()
			b.runs[id].answered = stored
			b.mu.Unlock()
		}
		return err
	}); err != nil {
		return fail(e, fleetError(c, err))
	}
	res.AnswerSeconds = round3(time.Since(answering).Seconds())
	for range bf.runs {
		select {
		case <-b.ended:
		case <-ctx.Done():
			return fail(e, fmt.Errorf("runs not all finished after %s: %w", bf.timeout, ctx.Err()))
		}
	}
	var wakes, starts []time.Duration
	b.mu.Lock()
	for _, id := range ids {
		r := b.runs[id]
		if r.finished {
			res.Finished++
		}
		if r.failed {
			res.Failed++
		}
		if !r.answered.IsZero() && !r.woke.IsZero() {
			// Seen before the ack came back: a wake at once.
			wakes = append(wakes, max(r.woke.Sub(r.answered), 0))
		}
		if !r.answered.IsZero() && !r.started.IsZero() {
			starts = append(starts, max(r.started.Sub(r.answered), 0))
		}
	}
	b.mu.Unlock()
	res.WakeLatencyMs = summarize(wakes) // stats.go
	if bf.parked {
		s := summarize(starts)
		res.StartLatencyMs = &s
	}
	if bf.json {
		if err := json.NewEncoder(e.stdout).Encode(res); err != nil {
			return fail(e, err)
		}
		return exitOK
	}
	writeApprovalsBench(e.stdout, &res)
	return exitOK
}

func writeApprovalsBench(w io.Writer, r *approvalsBenchResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "runs\t%d (%d waited, %d refused at once; %d finished, %d failed)\n", r.Runs, r.Waiting, r.Refused, r.Finished, r.Failed)
	fmt.Fprintf(tw, "all waiting after\t%.1f s\n", r.WaitSeconds)
	if r.ParkSeconds > 0 {
		fmt.Fprintf(tw, "all parked after\t%.1f s\n", r.ParkSeconds)
	}
	fmt.Fprintf(tw, "answers sent in\t%.1f s\n", r.AnswerSeconds)
	l := r.WakeLatencyMs
	fmt.Fprintf(tw, "answer stored->resolved\tp50 %.1f ms  p90 %.1f ms  p99 %.1f ms  max %.1f ms\n", l.P50, l.P90, l.P99, l.Max)
	if s := r.StartLatencyMs; s != nil {
		fmt.Fprintf(tw, "answer stored->run_started\tp50 %.1f ms  p90 %.1f ms  p99 %.1f ms  max %.1f ms\n", s.P50, s.P90, s.P99, s.Max)
	}
	if r.RSSIdle > 0 {
		fmt.Fprintf(tw, "worker RSS\tidle %.1f MiB, waiting %.1f MiB (max %.1f MiB, %d samples): %.1f KiB a waiting run\n",
			mib(r.RSSIdle), mib(r.RSSWaitingLast), mib(r.RSSWaitingMax), r.RSSSamples, r.RSSPerWaitingRun/1024)
	} else {
		fmt.Fprintln(tw, "worker RSS\tnot read (--worker-metrics)")
	}
	_ = tw.Flush()
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// inParallel calls f for every id, benchSenders at a time; the first
// error stops the rest and is returned.
func inParallel(ctx context.Context, ids []string, f func(context.Context, string) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan string)
	var wg sync.WaitGroup
	for range min(benchSenders, len(ids)) {
		wg.Go(func() {
			for id := range next {
				if err := f(ctx, id); err != nil {
					cancel(fmt.Errorf("%s: %w", id, err))
				}
			}
		})
	}
	for _, id := range ids {
		if ctx.Err() != nil {
			break
		}
		next <- id
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// rssReader reads a worker's RSS from its Prometheus /metrics.
type rssReader struct {
	url    string
	client http.Client
}

func (r *rssReader) read(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", r.url, resp.Status)
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_resident_memory_bytes "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("%s: process_resident_memory_bytes %q", r.url, v)
			}
			return int64(f), nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s has no process_resident_memory_bytes", r.url)
}

// rssSampler reads the RSS on a ticker until stopped.
type rssSampler struct {
	cancel  context.CancelFunc
	done    chan struct{}
	samples []int64
}

// every samples the RSS each interval (nothing without a URL).
func (r *rssReader) every(ctx context.Context, interval time.Duration) *rssSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &rssSampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if r.url == "" {
			return
		}
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if v, err := r.read(ctx); err == nil {
				s.samples = append(s.samples, v)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends the sampling and returns the samples, the oldest first.
func (s *rssSampler) stop() []int64 {
	s.cancel()
	<-s.done
	return s.samples
}
