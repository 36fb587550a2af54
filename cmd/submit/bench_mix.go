package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// Mixed-load mode (issue 55): groups of faux runs that sleep in a tool,
// each with its own count, rate, priority, concurrency key and start, all
// at once on one queue; it reports each group's and each priority's start
// latency and, from the events (each run's run_started and run_finished
// times, as the workers stamped them), the most runs of one key that ran
// at once.

// mixGroup is one --group: name:runs[,rate=R][,priority=P][,tenant=T][,key=K][,limit=L][,after=G][,nowait].
type mixGroup struct {
	name     string
	runs     int
	rate     float64
	priority string
	tenant   string
	key      string
	limit    int
	after    string
	wait     bool
}

type mixFlags struct {
	groups listFlag
	sleep  float64
}

func registerMixBench(fs *flag.FlagSet, mf *mixFlags) {
	fs.Var(&mf.groups, "group", "mixed-load mode: a group of runs, name:runs[,rate=R/s][,priority=high|normal|low][,tenant=T (metadata.tenant: its tenant lane)][,key=K][,limit=L][,after=G (start once group G is submitted)][,nowait (not waited for)]; repeatable")
	fs.Float64Var(&mf.sleep, "mix-sleep", 0.3, "mixed-load mode: each run sleeps this many seconds in a tool")
}

func parseMixGroup(s string) (mixGroup, error) {
	parts := strings.Split(s, ",")
	name, n, ok := strings.Cut(parts[0], ":")
	runs, err := strconv.Atoi(n)
	if !ok || name == "" || err != nil || runs < 1 {
		return mixGroup{}, fmt.Errorf("--group %q: begin with name:runs", s)
	}
	g := mixGroup{name: name, runs: runs, wait: true}
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "rate":
			g.rate, err = strconv.ParseFloat(strings.TrimSuffix(v, "/s"), 64)
		case "priority":
			g.priority = v
			if !bus.ValidPriority(v) {
				err = fmt.Errorf("priority %q", v)
			}
		case "tenant":
			g.tenant = v
			if !bus.ValidTenant(v) {
				err = fmt.Errorf("tenant %q: use [A-Za-z0-9_-]{1,64}", v)
			}
		case "key":
			g.key = v
		case "limit":
			g.limit, err = strconv.Atoi(v)
		case "after":
			g.after = v
		case "nowait":
			g.wait = false
		default:
			err = fmt.Errorf("unknown option %q", k)
		}
		if err != nil {
			return mixGroup{}, fmt.Errorf("--group %q: %v", s, err)
		}
	}
	return g, nil
}

// mixRun is one run's times.
type mixRun struct {
	group              *mixGroup
	submitted, started time.Time // here
	// The workers' stamps (Unix ms): one span per attempt, from its
	// run_started to the next run_started, run_parked or run_finished of
	// the run; open is the start of the attempt still running (0: none).
	spans [][2]int64
	open  int64
	// startTS is the last run_started's stamp (the tenants' starts).
	startTS int64
	done    bool
}

// event notes a run_started, run_parked or run_finished stamped ts. An
// earlier attempt's span counts too (a crash, a lease lost while it still
// ran): those are when a key's limit could be passed.
func (r *mixRun) event(typ string, ts int64) {
	if r.open > 0 {
		r.spans = append(r.spans, [2]int64{r.open, ts})
		r.open = 0
	}
	switch typ {
	case bus.EventRunStarted:
		r.open, r.startTS = ts, ts
	case bus.EventRunFinished:
		r.done = true
	}
}

// runSpans are the run's spans, one still open ending at end.
func (r *mixRun) runSpans(end int64) [][2]int64 {
	if r.open > 0 {
		return append(r.spans[:len(r.spans):len(r.spans)], [2]int64{r.open, max(end, r.open)})
	}
	return r.spans
}

type mixResult struct {
	Groups     map[string]mixGroupResult `json:"groups"`
	Priorities map[string]percentiles    `json:"priorityStartLatencyMs"`
	// KeyMaxConcurrent is, per key, the most attempts with it running
	// (run_started to the next run_started, run_parked or run_finished;
	// one still running, to the end of the bench) at one instant.
	KeyMaxConcurrent map[string]int `json:"keyMaxConcurrent"`
	// Tenants are the start latencies by tenant (groups with tenant=).
	Tenants map[string]percentiles `json:"tenantStartLatencyMs,omitempty"`
	// TenantStartsTogether counts each tenant's starts (the workers'
	// stamps) while every tenant was starting runs: from the latest first
	// start of a tenant to the earliest last start. Their proportion is
	// the fair share seen while all had work.
	TenantStartsTogether map[string]int `json:"tenantStartsTogether,omitempty"`
	Seconds              float64        `json:"seconds"`
}

type mixGroupResult struct {
	Runs           int         `json:"runs"`
	Started        int         `json:"started"`
	Failed         int         `json:"failed"`
	StartLatencyMs percentiles `json:"startLatencyMs"`
}

func runMixBench(ctx context.Context, e *env, c *bus.Client, queue string, mf *mixFlags, asJSON bool, timeout time.Duration) int {
	var groups []*mixGroup
	byName := map[string]*mixGroup{}
	for _, s := range mf.groups {
		g, err := parseMixGroup(s)
		if err != nil {
			return fail(e, usagef("%v", err))
		}
		groups = append(groups, &g)
		byName[g.name] = &g
	}
	for _, g := range groups {
		if g.after != "" && byName[g.after] == nil {
			return fail(e, usagef("--group %s: after=%s names no group", g.name, g.after))
		}
	}
	var mu sync.Mutex
	runs := map[string]*mixRun{}
	failed := map[*mixGroup]int{}
	waiting := 0
	for _, g := range groups {
		if g.wait {
			waiting += g.runs
		}
	}
	done := make(chan struct{})
	prefix := c.Names().Prefix() + ".run."
	sub, err := c.Conn().Subscribe(c.Names().Events("*"), func(m *nats.Msg) {
		id := strings.TrimSuffix(strings.TrimPrefix(m.Subject, prefix), ".events")
		typ, _ := eventTypes(m.Data)
		if typ != bus.EventRunStarted && typ != bus.EventRunFinished && typ != bus.EventRunParked {
			return
		}
		var env struct {
			TS int64 `json:"ts"`
		}
		_ = json.Unmarshal(m.Data, &env)
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		r := runs[id]
		if r == nil || r.done {
			return
		}
		r.event(typ, env.TS)
		if typ == bus.EventRunStarted && r.started.IsZero() {
			r.started = now
		}
		if typ != bus.EventRunFinished {
			return
		}
		if status, _ := finishedStatus(m.Data); status != bus.StatusSucceeded {
			failed[r.group]++
		}
		if r.group.wait {
			if waiting--; waiting == 0 {
				close(done)
			}
		}
	})
	if err != nil {
		return fail(e, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	begin := time.Now()
	submitted := map[*mixGroup]chan struct{}{}
	for _, g := range groups {
		submitted[g] = make(chan struct{})
	}
	errs := make(chan error, len(groups))
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			defer close(submitted[g])
			if g.after != "" {
				select {
				case <-submitted[byName[g.after]]:
				case <-ctx.Done():
					return
				}
			}
			errs <- submitGroup(ctx, c, queue, g, mf.sleep, func(id string) {
				mu.Lock()
				runs[id] = &mixRun{group: g, submitted: time.Now()}
				mu.Unlock()
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return fail(e, err)
		}
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		fmt.Fprintln(e.stderr, "bench: timeout; reporting the runs that started")
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	res := mixResult{Groups: map[string]mixGroupResult{}, Priorities: map[string]percentiles{}, KeyMaxConcurrent: map[string]int{},
		Seconds: round3(time.Since(begin).Seconds())}
	byGroup := map[*mixGroup][]time.Duration{}
	byPrio := map[string][]time.Duration{}
	spans := map[string][][2]int64{}
	byTenant := map[string][]time.Duration{}
	tenantStarts := map[string][]int64{}
	for _, r := range runs {
		if t := r.group.tenant; t != "" && r.startTS > 0 {
			byTenant[t] = append(byTenant[t], r.started.Sub(r.submitted))
			tenantStarts[t] = append(tenantStarts[t], r.startTS)
		}
		if !r.started.IsZero() {
			d := r.started.Sub(r.submitted)
			byGroup[r.group] = append(byGroup[r.group], d)
			p := r.group.priority
			if p == "" {
				p = bus.PriorityNormal
			}
			byPrio[p] = append(byPrio[p], d)
		}
		if r.group.key != "" {
			// Runs still running at the end count up to it.
			spans[r.group.key] = append(spans[r.group.key], r.runSpans(time.Now().UnixMilli())...)
		}
	}
	for _, g := range groups {
		res.Groups[g.name] = mixGroupResult{Runs: g.runs, Started: len(byGroup[g]), Failed: failed[g], StartLatencyMs: summarize(byGroup[g])}
	}
	for p, s := range byPrio {
		res.Priorities[p] = summarize(s)
	}
	for k, s := range spans {
		res.KeyMaxConcurrent[k] = mostAtOnce(s)
	}
	if len(byTenant) > 0 {
		res.Tenants = map[string]percentiles{}
		for t, s := range byTenant {
			res.Tenants[t] = summarize(s)
		}
		res.TenantStartsTogether = startsTogether(tenantStarts)
	}
	if asJSON {
		_ = json.NewEncoder(e.stdout).Encode(res)
	} else {
		writeMixTable(e.stdout, groups, res)
	}
	return exitOK
}

// submitGroup submits a group's runs, at its rate or as fast as it can
// (8 at a time).
func submitGroup(ctx context.Context, c *bus.Client, queue string, g *mixGroup, sleep float64, note func(id string)) error {
	ids := make(chan string)
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	for range 8 {
		wg.Go(func() {
			for id := range ids {
				req := &bus.RunRequest{ID: id, Prompt: "sleep", Tools: []string{"sleep"}, Priority: g.priority,
					Model:    &bus.ModelRef{Provider: "faux", ID: "bench"},
					Metadata: map[string]string{"bench": "mix", "group": g.name},
					Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
						{Content: []agent.Content{agent.ToolCall("s1", "sleep", map[string]any{"seconds": sleep})}, StopReason: agent.StopReasonToolUse},
						{Content: []agent.Content{agent.Text("done")}, StopReason: agent.StopReasonStop}}}}
				if g.tenant != "" {
					req.Metadata[bus.TenantMetadataKey] = g.tenant
				}
				if g.key != "" {
					req.Concurrency = &bus.Concurrency{Key: g.key, Limit: g.limit}
				}
				note(id)
				if _, err := c.Submit(ctx, queue, req); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("group %s: %w", g.name, err) })
				}
			}
		})
	}
	var tick *time.Ticker
	if g.rate > 0 {
		tick = time.NewTicker(time.Duration(float64(time.Second) / g.rate))
		defer tick.Stop()
	}
	for range g.runs {
		if tick != nil {
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		ids <- bus.NewRunID()
	}
	close(ids)
	wg.Wait()
	return firstErr
}

// startsTogether counts each tenant's starts from the latest first start
// of any tenant to the earliest last start.
func startsTogether(starts map[string][]int64) map[string]int {
	var from, to int64 = 0, 1 << 62
	for _, s := range starts {
		from, to = max(from, slices.Min(s)), min(to, slices.Max(s))
	}
	out := map[string]int{}
	for t, s := range starts {
		for _, at := range s {
			if at >= from && at <= to {
				out[t]++
			}
		}
	}
	return out
}

// mostAtOnce is the most spans [start, end) covering one instant; an end
// and a start at the same millisecond do not overlap (the next run of a
// key starts after its predecessor's run_finished is stored).
func mostAtOnce(spans [][2]int64) int {
	type edge struct {
		at   int64
		step int
	}
	var edges []edge
	for _, s := range spans {
		edges = append(edges, edge{s[0], 1}, edge{s[1], -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].step < edges[j].step
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.step
		most = max(most, n)
	}
	return most
}

func writeMixTable(w io.Writer, groups []*mixGroup, res mixResult) {
	fmt.Fprintf(w, "%-10s %8s %8s %7s %10s %10s %10s %10s\n", "group", "runs", "started", "failed", "p50 ms", "p90 ms", "p99 ms", "max ms")
	for _, g := range groups {
		r := res.Groups[g.name]
		fmt.Fprintf(w, "%-10s %8d %8d %7d %10.1f %10.1f %10.1f %10.1f\n", g.name, r.Runs, r.Started, r.Failed,
			r.StartLatencyMs.P50, r.StartLatencyMs.P90, r.StartLatencyMs.P99, r.StartLatencyMs.Max)
	}
	for _, p := range bus.Priorities() {
		if s, ok := res.Priorities[p]; ok {
			fmt.Fprintf(w, "priority %-8s start p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", p, s.P50, s.P99, s.Max)
		}
	}
	for t, s := range res.Tenants {
		fmt.Fprintf(w, "tenant %-8s start p50 %.1f ms, p99 %.1f ms, max %.1f ms; %d starts while every tenant started runs\n",
			t, s.P50, s.P99, s.Max, res.TenantStartsTogether[t])
	}
	for k, n := range res.KeyMaxConcurrent {
		fmt.Fprintf(w, "key %s: at most %d runs at once (from the events)\n", k, n)
	}
	fmt.Fprintf(w, "%.1f s\n", res.Seconds)
}
