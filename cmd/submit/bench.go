package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

type benchFlags struct {
	runs, concurrency, deltas, tools int
	rate, sleep                      float64
	model, queue, prompt             string
	json                             bool
	timeout                          time.Duration
	cpuProfile                       string
	// Streaming mode: concurrency runs, each streaming deltasPerSecond
	// text deltas for duration.
	streaming       bool
	deltasPerSecond float64
	fixedPace       bool
	duration        time.Duration
	// Approvals mode (bench_approvals.go).
	approvals     bool
	parked        bool
	workerMetrics string
}

func cmdBench(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "bench", "submit bench [--runs N] [--concurrency C] [--rate R] [--deltas D] [--tools T] [--model M] [--json]")
	var cf conn
	var bf benchFlags
	var cb continueBenchFlags
	cf.register(fs.FlagSet, e)
	cb.register(fs.FlagSet) // bench_continue.go
	fs.IntVar(&bf.runs, "runs", 1000, "runs to submit")
	fs.IntVar(&bf.concurrency, "concurrency", 64, "runs in flight at most (0: unbounded, with --rate)")
	fs.Float64Var(&bf.rate, "rate", 0, "runs per second offered (0: as fast as the concurrency allows)")
	fs.IntVar(&bf.deltas, "deltas", 20, "text deltas per faux reply (16 characters each)")
	fs.IntVar(&bf.tools, "tools", 0, "faux tool calls per run (calculator, in one turn before the reply)")
	fs.Float64Var(&bf.sleep, "sleep", 0, "faux runs first call the sleep tool for this many `seconds` (at most 60): runs in flight waiting in a tool")
	fs.StringVar(&bf.model, "model", "faux/bench", "model, provider/id; faux is scripted, a real model answers --prompt")
	fs.StringVar(&bf.queue, "queue", env2(e.getenv, "AGENTS_QUEUE", bus.DefaultQueue), "queue to submit to [AGENTS_QUEUE]")
	fs.StringVar(&bf.prompt, "prompt", "Say hello in twenty words.", "prompt of each run")
	fs.BoolVar(&bf.json, "json", false, "print one JSON object: runs, failed, seconds, runsPerSec, eventsPerSec, startLatencyMs, firstDeltaLatencyMs, cpuCores and cpuSeconds (this process's own CPU; with --streaming over the sustained window)")
	fs.DurationVar(&bf.timeout, "timeout", 10*time.Minute, "give up on runs not finished after this long")
	fs.StringVar(&bf.cpuProfile, "cpuprofile", "", "write a CPU profile of submit to this `file`")
	fs.BoolVar(&bf.streaming, "streaming", false, "streaming mode: --concurrency runs at once, each streaming --deltas-per-second text deltas for --duration (a paced faux script; the worker must allow faux); reports events/s and the delay from each event's creation (its ts) to its arrival, once every run has started")
	fs.Float64Var(&bf.deltasPerSecond, "deltas-per-second", 10, "streaming mode: text deltas per second of each run")
	fs.DurationVar(&bf.duration, "duration", 30*time.Second, "streaming mode: how long each run streams")
	fs.BoolVar(&bf.fixedPace, "fixed-pace", true, "streaming mode: deltas at fixed times, a late run making its lateness up (the faux script's fixedPace, protocol 1.5: needs 1.5 workers; false for older ones, whose pacing carries lateness)")
	registerApprovalsBench(fs.FlagSet, &bf) // bench_approvals.go
	var mf mixFlags
	registerMixBench(fs.FlagSet, &mf) // bench_mix.go
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return fail(e, usagef("bench takes no arguments (got %q)", pos[0]))
	}
	switch {
	case bf.runs < 1:
		return fail(e, usagef("--runs must be at least 1"))
	case bf.concurrency < 0 || bf.concurrency == 0 && bf.rate <= 0:
		return fail(e, usagef("--concurrency must be at least 1 (0 only with --rate)"))
	case bf.rate < 0:
		return fail(e, usagef("--rate must not be negative"))
	case bf.deltas < 1:
		return fail(e, usagef("--deltas must be at least 1"))
	case bf.tools < 0 || bf.tools > 100:
		return fail(e, usagef("--tools must be in 0..100"))
	case bf.sleep < 0 || bf.sleep > 60:
		return fail(e, usagef("--sleep must be in 0..60"))
	}
	if bf.streaming {
		switch {
		case bf.concurrency < 1:
			return fail(e, usagef("--streaming needs --concurrency of at least 1"))
		case bf.deltasPerSecond <= 0 || bf.deltasPerSecond > 1000:
			return fail(e, usagef("--deltas-per-second must be in (0, 1000]"))
		case bf.duration < time.Second:
			return fail(e, usagef("--duration must be at least 1s"))
		}
		bf.runs, bf.rate, bf.tools = bf.concurrency, 0, 0
		bf.deltas = max(1, int(bf.deltasPerSecond*bf.duration.Seconds()))
		bf.model = "faux/bench"
	}
	body, err := benchRequest(&bf)
	if err != nil {
		return fail(e, usagef("%v", err))
	}
	if err := bus.CheckQueue(bf.queue); err != nil {
		return fail(e, usagef("--queue: %v", err))
	}
	if bf.cpuProfile != "" {
		stop, err := startCPUProfile(bf.cpuProfile)
		if err != nil {
			return fail(e, err)
		}
		defer stop()
	}
	// The command's context carries the caller's TRACEPARENT to every run.
	ctx, endTrace := cf.traceCommand(ctx, e, "agentfleet.bench") // trace.go
	defer endTrace()
	c, err := cf.connect(ctx, e)
	if err != nil {
		return fail(e, err)
	}
	defer c.Close()
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = c.Stream(sctx, c.Names().RunsStream())
	scancel()
	if err != nil {
		return fail(e, fleetError(c, err))
	}
	if cb.bytes != "" {
		return continueBench(ctx, e, c, &bf, &cb) // bench_continue.go
	}
	if bf.approvals {
		return runApprovalsBench(ctx, e, c, &bf) // bench_approvals.go
	}
	if len(mf.groups) > 0 {
		return runMixBench(ctx, e, c, bf.queue, &mf, bf.json, bf.timeout) // bench_mix.go
	}
	queueing := queueingNote(ctx, c, bf.queue, bf.concurrency)
	if bf.streaming {
		code := streamBench(ctx, e, c, &bf, body)
		if queueing != "" {
			fmt.Fprintln(e.stderr, queueing)
		}
		return code
	}
	rep, err := runBench(ctx, e, c, &bf, body)
	if err != nil {
		return fail(e, err)
	}
	if bf.json {
		if err := json.NewEncoder(e.stdout).Encode(rep.benchResult); err != nil {
			return fail(e, err)
		}
		if queueing != "" {
			fmt.Fprintln(e.stderr, queueing)
		}
	} else {
		writeBenchTable(e.stdout, rep)
		if queueing != "" {
			fmt.Fprintln(e.stdout, "\n"+queueing)
		}
	}
	switch {
	case rep.Interrupted:
		return exitDetached
	case rep.Failed > 0:
		return exitFailed
	}
	return exitOK
}

// benchRequest builds the request body every bench run shares (the run id
// is in the subject): a faux script of one reply with D text deltas,
// preceded by T tool calls when asked.
func benchRequest(bf *benchFlags) ([]byte, error) {
	m, err := bus.ParseModelRef(bf.model)
	if err != nil {
		return nil, fmt.Errorf("--model: %v", err)
	}
	req := &bus.RunRequest{Model: &m, Prompt: bf.prompt, Metadata: map[string]string{"bench": "1"}}
	if bf.tools > 0 {
		req.Tools = []string{"calculator"}
	}
	if bf.sleep > 0 {
		req.Tools = append(req.Tools, "sleep")
	}
	if m.Provider == "faux" {
		// The faux model streams 16 characters per delta (tokenSize 4).
		text := strings.Repeat("lorem ipsum dolo", bf.deltas)
		s := &bus.FauxScript{}
		if bf.sleep > 0 {
			call := agent.ToolCall("s1", "sleep", map[string]any{"seconds": bf.sleep})
			s.Responses = append(s.Responses, agent.ScriptedResponse{Content: []agent.Content{call}, StopReason: agent.StopReasonToolUse})
		}
		if bf.tools > 0 {
			calls := make([]agent.Content, bf.tools)
			for i := range calls {
				calls[i] = agent.ToolCall("c"+strconv.Itoa(i+1), "calculator", map[string]any{"expression": strconv.Itoa(i) + "+1"})
			}
			s.Responses = append(s.Responses, agent.ScriptedResponse{Content: calls, StopReason: agent.StopReasonToolUse})
		}
		s.Responses = append(s.Responses, agent.ScriptedResponse{Content: []agent.Content{agent.Text(text)}})
		if bf.streaming {
			// A delta is 4 tokens: 4 tokens/s per delta/s.
			s.TokenSize, s.TokensPerSecond = 4, 4*bf.deltasPerSecond
			// Open loop: a run late on a busy machine makes the lateness
			// up, so the rate offered stays the one asked for.
			s.FixedPace = bf.fixedPace
		}
		req.Faux = s
	}
	if err := req.Validate(""); err != nil {
		return nil, err
	}
	return json.Marshal(req)
}

// benchRun is one run's measurements.
type benchRun struct {
	submitted  time.Time
	started    time.Duration // submit -> run_started received; 0 until then
	firstDelta time.Duration
	events     int
	done       bool
}

// bench follows every run with one core subscription on the events
// wildcard, matching envelopes to runs by the subject's run token: no
// JetStream consumer per run. It subscribes before the first submit, so
// no event is missed.
type bench struct {
	prefix string // "<prefix>.run."
	slots  chan struct{}
	doneCh chan struct{} // one value per finished run

	mu       sync.Mutex
	runs     map[string]*benchRun
	starts   []time.Duration
	deltas   []time.Duration
	events   int
	finished int
	failed   int
	reasons  map[string]int
	lastDone time.Time
	total    int     // runs the bench submits
	cpuAtEnd cpuMark // taken with the last run's run_finished
}

func (b *bench) onEvent(m *nats.Msg) {
	now := time.Now()
	id, ok := strings.CutPrefix(m.Subject, b.prefix)
	if !ok {
		return
	}
	id, ok = strings.CutSuffix(id, ".events")
	if !ok {
		return
	}
	typ, sub := eventTypes(m.Data)
	b.mu.Lock()
	r := b.runs[id]
	if r == nil || r.done {
		b.mu.Unlock()
		return
	}
	r.events++
	b.events++
	switch typ {
	case bus.EventRunStarted:
		if r.started == 0 {
			r.started = max(now.Sub(r.submitted), 1)
			b.starts = append(b.starts, r.started)
		}
	case string(agent.EventMessageUpdate):
		if sub == string(agent.StreamTextDelta) && r.firstDelta == 0 {
			r.firstDelta = max(now.Sub(r.submitted), 1)
			b.deltas = append(b.deltas, r.firstDelta)
		}
	case bus.EventRunFinished:
		r.done = true
		b.finished++
		b.lastDone = now
		if b.finished == b.total {
			b.cpuAtEnd = markCPU(now)
		}
		if status, reason := finishedStatus(m.Data); status != bus.StatusSucceeded {
			b.failed++
			b.reasons[status+"/"+reason]++
		}
	}
	done := r.done
	b.mu.Unlock()
	if done {
		if b.slots != nil {
			<-b.slots
		}
		b.doneCh <- struct{}{}
	}
}

// eventTypes finds an envelope's event type, and for message_update the
// type of its assistantMessageEvent, without decoding the whole envelope:
// envelopes are written by bus.Envelope.AppendJSON with the event last and its
// "type" first. Anything else falls back to a full decode.
func eventTypes(data []byte) (typ, sub string) {
	const evKey = `"event":{"type":"`
	if i := bytes.LastIndex(data, []byte(evKey)); i >= 0 {
		rest := data[i+len(evKey):]
		if j := bytes.IndexByte(rest, '"'); j >= 0 {
			typ = string(rest[:j])
			if typ == string(agent.EventMessageUpdate) {
				const subKey = `"assistantMessageEvent":{"type":"`
				if k := bytes.Index(rest, []byte(subKey)); k >= 0 {
					r2 := rest[k+len(subKey):]
					if l := bytes.IndexByte(r2, '"'); l >= 0 {
						return typ, string(r2[:l])
					}
				}
			} else {
				return typ, ""
			}
		}
	}
	env, err := bus.DecodeEnvelope(data)
	if err != nil {
		return "", ""
	}
	if env.Type == string(agent.EventMessageUpdate) {
		var ev struct {
			A struct {
				Type string `json:"type"`
			} `json:"assistantMessageEvent"`
		}
		_ = json.Unmarshal(env.Event, &ev)
		return env.Type, ev.A.Type
	}
	return env.Type, ""
}

func finishedStatus(data []byte) (status, reason string) {
	env, err := bus.DecodeEnvelope(data)
	if err != nil {
		return "undecodable", ""
	}
	f, err := decodeFinished(env)
	if err != nil || f == nil {
		return "undecodable", ""
	}
	return f.Status, f.Reason
}

func runBench(ctx context.Context, e *env, c *bus.Client, bf *benchFlags, body []byte) (*benchReport, error) {
	names := c.Names()
	b := &bench{
		prefix:  names.Prefix() + ".run.",
		doneCh:  make(chan struct{}, bf.runs),
		runs:    make(map[string]*benchRun, bf.runs),
		reasons: map[string]int{},
		total:   bf.runs,
	}
	if bf.concurrency > 0 {
		b.slots = make(chan struct{}, bf.concurrency)
	}
	sub, err := c.Conn().Subscribe(names.Events("*"), b.onEvent)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, 512<<20)
	if err := c.Conn().Flush(); err != nil {
		return nil, err
	}

	bctx, cancel := context.WithTimeout(ctx, bf.timeout)
	defer cancel()
	interrupted := false
	var submitErr error
	var errOnce sync.Once
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }

	prefix := "bench-" + bus.NewRunID()[:8] + "-"
	start := time.Now()
	cpuAtStart := markCPU(start)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range bf.runs {
			if b.slots != nil {
				select {
				case b.slots <- struct{}{}:
				case <-stop:
					return
				}
			}
			if bf.rate > 0 {
				at := start.Add(time.Duration(float64(i) / bf.rate * float64(time.Second)))
				if d := time.Until(at); d > 0 {
					t := time.NewTimer(d)
					select {
					case <-t.C:
					case <-stop:
						t.Stop()
						return
					}
				}
			}
			id := prefix + strconv.Itoa(i)
			r := &benchRun{}
			b.mu.Lock()
			b.runs[id] = r
			r.submitted = time.Now()
			b.mu.Unlock()
			wg.Go(func() {
				// The request carries the agentfleet.bench span: a span
				// per run would add nothing the worker's queue.wait does not.
				if _, err := c.SubmitRaw(bctx, bf.queue, id, body); err != nil && bctx.Err() == nil {
					errOnce.Do(func() { submitErr = fleetError(c, err) })
					halt()
				}
			})
		}
	})

	// Progress (a terminal only) and the no-worker notice.
	var tick <-chan time.Time
	if e.stderrTTY {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		tick = t.C
	}
	notice := time.NewTimer(5 * time.Second)
	defer notice.Stop()
	finished := 0
wait:
	for finished < bf.runs {
		select {
		case <-b.doneCh:
			finished++
		case <-tick:
			b.mu.Lock()
			done, failed := b.finished, b.failed
			b.mu.Unlock()
			fmt.Fprint(e.stderr, "\r\x1b[K"+progressBar(done, bf.runs, failed, time.Since(start), 80))
		case <-notice.C:
			b.mu.Lock()
			n := len(b.starts)
			b.mu.Unlock()
			if n == 0 {
				fmt.Fprintln(e.stderr, noWorkerNotice(bctx, c, prefix+"0", bf.queue, time.Since(start)))
			}
		case <-stop:
			break wait
		case <-e.interrupts:
			interrupted = true
			break wait
		case <-bctx.Done():
			break wait
		}
	}
	halt()
	cancel()
	wg.Wait()
	if tick != nil {
		fmt.Fprint(e.stderr, "\r\x1b[K")
	}
	if submitErr != nil && !interrupted {
		return nil, submitErr
	}
	dropped, _ := sub.Dropped()
	b.mu.Lock()
	defer b.mu.Unlock()
	end, cpuAtEnd := b.lastDone, b.cpuAtEnd
	if end.IsZero() || b.finished < bf.runs {
		end = time.Now()
		cpuAtEnd = markCPU(end)
	}
	secs := end.Sub(start).Seconds()
	rep := &benchReport{
		benchResult: benchResult{
			Runs:                bf.runs,
			Failed:              b.failed + (bf.runs - b.finished),
			Seconds:             round3(secs),
			RunsPerSec:          round3(float64(b.finished) / secs),
			EventsPerSec:        round3(float64(b.events) / secs),
			StartLatencyMs:      summarize(b.starts),
			FirstDeltaLatencyMs: summarize(b.deltas),
			benchCPU:            cpuBetween(cpuAtStart, cpuAtEnd),
		},
		Finished: b.finished, Events: b.events, Dropped: dropped,
		Offered: bf.rate, Concurrency: bf.concurrency, Reasons: b.reasons, Interrupted: interrupted,
	}
	if missing := bf.runs - b.finished; missing > 0 && !interrupted {
		rep.Reasons["unfinished"] = missing
	}
	return rep, nil
}

func round3(f float64) float64 {
	return float64(int64(f*1000+0.5)) / 1000
}

// queueingNote says when more runs are in flight at once than the queue's
// workers have slots (their presence): the surplus waits in the queue, so
// the latency figures then measure mostly that wait. "" when they fit or
// the presence cannot be read.
func queueingNote(ctx context.Context, c *bus.Client, queue string, concurrency int) string {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	ws, err := c.ListWorkers(ctx)
	if err != nil {
		return ""
	}
	slots, workers := 0, 0
	for _, w := range ws {
		if slices.Contains(w.Queues, queue) {
			slots += w.Slots
			workers++
		}
	}
	if slots == 0 || (concurrency > 0 && concurrency <= slots) {
		return ""
	}
	conc := fmt.Sprintf("--concurrency %d", concurrency)
	if concurrency == 0 {
		conc = "unbounded concurrency"
	}
	return fmt.Sprintf("note: %s is more than the %d slots of the %d worker(s) on queue %q: the runs past them wait in the queue, so the latencies are mostly that wait (compare with --concurrency %d)",
		conc, slots, workers, queue, slots)
}
