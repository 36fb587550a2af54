package worker_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/budget"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/llm/openai"
	"github.com/agentfleet/agentfleet/metrics"
	"github.com/agentfleet/agentfleet/ratelimit"
	"github.com/agentfleet/agentfleet/worker"
)

// Spending that fails closed (issue 51): a call cut off before its usage
// arrives, or answered without usage, is charged its input estimate and
// the output it streamed; a forged usage is clamped to what the call could
// use. Each case runs against spendEndpoint, which knows what every call
// really used, and checks the tenant's ledger, run_finished.cost and the
// charge in the call's message; TestSpendFailsClosed logs a table of the
// charges against the real counts.

// Prices of model m: dollars per million tokens.
const (
	spendInputPrice  = 1000
	spendOutputPrice = 4000
	spendMaxTokens   = 200
)

// spendPrompt is about 11 KB of English.
var spendPrompt = func() string {
	var b strings.Builder
	for i := range 40 {
		fmt.Fprintf(&b, "Paragraph %d. The quarterly report covers revenue, costs and the outlook for the next year; "+
			"each section lists the figures, the assumptions behind them and the risks the team sees, "+
			"so that a reader can check every number against the ledger and the contracts it came from. ", i)
	}
	return b.String()
}()

// spendAnswer is what the endpoint streams, in chunks: 180 tokens, within
// the model's maxTokens (200).
var spendAnswer = func() []string {
	var out []string
	for i := range 18 {
		out = append(out, fmt.Sprintf("Point %d: the figures hold up. ", i))
	}
	return out
}()

// spendReply is how the endpoint answers one call.
type spendReply struct {
	hold  bool   // after the chunks, hold the connection until the client leaves
	usage string // "real": the real counts; "none": no usage; "forged": 2^53 of each
}

// spendCall is what one call really used, by the endpoint's tokenizer.
type spendCall struct {
	input, output int
	maxTokens     int // the request's max_tokens (0: none sent)
}

// spendEndpoint is an OpenAI-compatible endpoint that counts each call's
// real tokens: OpenAI's way of counting a chat (3 tokens per message, 3
// to prime the reply) over cl100k's pre-tokenizer, one token per piece (a
// close lower bound of its BPE on plain English).
type spendEndpoint struct {
	reply func(call int) spendReply

	mu    sync.Mutex
	calls []spendCall
}

var cl100kPieces = regexp.MustCompile(`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+`)

func realTokens(s string) int { return len(cl100kPieces.FindAllStringIndex(s, -1)) }

func (e *spendEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		MaxTokens int `json:"max_tokens"`
	}
	_ = json.Unmarshal(body, &req)
	in := 3
	for _, m := range req.Messages {
		in += 3
		var s string
		var parts []struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(m.Content, &s) != nil && json.Unmarshal(m.Content, &parts) == nil {
			for _, p := range parts {
				s += p.Text
			}
		}
		in += realTokens(s)
	}
	e.mu.Lock()
	n := len(e.calls)
	e.calls = append(e.calls, spendCall{input: in, maxTokens: req.MaxTokens})
	e.mu.Unlock()
	rep := e.reply(n)

	w.Header().Set("Content-Type", "text/event-stream")
	chunk := func(delta, finish string) {
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":%s}]}\n\n", delta, finish)
	}
	out := 0
	for i, c := range spendAnswer {
		d, _ := json.Marshal(map[string]string{"content": c})
		if i == 0 {
			d, _ = json.Marshal(map[string]string{"role": "assistant", "content": c})
		}
		chunk(string(d), "null")
		out += realTokens(c)
	}
	e.mu.Lock()
	e.calls[n].output = out
	e.mu.Unlock()
	w.(http.Flusher).Flush()
	if rep.hold {
		<-r.Context().Done()
		return
	}
	chunk(`{}`, `"stop"`)
	switch rep.usage {
	case "real":
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", in, out, in+out)
	case "forged":
		fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":9007199254740992,\"completion_tokens\":9007199254740992,\"total_tokens\":9007199254740992}}\n\n")
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (e *spendEndpoint) call(i int) spendCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	if i >= len(e.calls) {
		return spendCall{}
	}
	return e.calls[i]
}

func (e *spendEndpoint) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.calls)
}

// spendFleet is a fleet whose workers run model m at spendEndpoint with
// every tenant's budget at $1,000 an hour; startWorker starts one (limits:
// the model's shared rate limits, if any).
type spendFleet struct {
	*fleettest.Fleet
	t    *testing.T
	srv  *httptest.Server
	reg  *prometheus.Registry
	obs  worker.Observer
	logs *logbuf.Buffer
}

func newSpendFleet(t *testing.T, e *spendEndpoint) *spendFleet {
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	return &spendFleet{Fleet: newFleet(t), t: t, srv: srv, reg: reg,
		obs: worker.MetricsObserver(metrics.New(reg, metrics.Config{Models: []string{"m"}})), logs: &logbuf.Buffer{}}
}

func (f *spendFleet) startWorker(drain time.Duration, limits *worker.RateLimits) *fleettest.Worker {
	return f.startWorkerWith(openai.ModelInfo{ID: "m", MaxTokens: spendMaxTokens}, drain, limits)
}

// startWorkerWith starts a worker whose model m is info, at the prices.
func (f *spendFleet) startWorkerWith(info openai.ModelInfo, drain time.Duration, limits *worker.RateLimits) *fleettest.Worker {
	info.Cost = agent.ModelCost{Input: spendInputPrice, Output: spendOutputPrice}
	prov, err := openai.New(openai.Config{BaseURL: f.srv.URL + "/v1", Models: []openai.ModelInfo{info}})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(prov.CloseIdleConnections)
	b := &budget.Budgets{Period: time.Hour, Default: &budget.Tenant{USD: 1000}}
	return f.StartWorker(worker.Config{DefaultModel: "openai/m", Providers: map[string]worker.Provider{"openai": prov},
		Budgets: &worker.TenantBudgets{Budgets: b}, RateLimits: limits, DrainTimeout: drain, Observer: f.obs,
		Logger: slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
}

func spendRun(tenant string) *bus.RunRequest {
	return &bus.RunRequest{Prompt: spendPrompt, Metadata: map[string]string{"tenant": tenant}}
}

// spent is what the tenant's ledger says it spent, and the holds left.
func (f *spendFleet) spent(tenant string) (float64, int) {
	usd, holds := 0.0, 0
	for _, e := range entries(f.t, f.Fleet) {
		if e.Tenant == tenant {
			usd += e.SpentUSD
			holds += len(e.Holds)
		}
	}
	return usd, holds
}

// unreported reads model_calls_unreported_total{model="m",charged}.
func (f *spendFleet) counter(name string, labels map[string]string) float64 {
	fams, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, fam := range fams {
		if fam.GetName() != name {
			continue
		}
	next:
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// waitStreamed follows the run until the worker published the whole
// answer the endpoint streamed before it held the connection.
func waitStreamed(t *testing.T, f *spendFleet, id string) {
	t.Helper()
	want := strings.Join(spendAnswer, "")
	tr := &bus.Transcript{}
	for env, err := range f.Client.Follow(fleettest.Context(t), id) {
		if err != nil {
			t.Fatal(err)
		}
		_ = tr.Apply(env)
		if p := tr.Partial(); p != nil && p.TextOf() == want {
			return
		}
		if tr.Done() {
			t.Fatalf("the run finished before the answer streamed: %+v", tr.Finished)
		}
	}
	t.Fatal("the run's events ended before the answer streamed")
}

// cutOffMessage is the run's assistant message that ended aborted: the
// charge is its usage.
func cutOffMessage(t *testing.T, envs []*bus.Envelope) agent.Message {
	t.Helper()
	for _, e := range envs {
		ev := fleettest.Decode(t, e)
		if ev.Agent != nil && ev.Type == string(agent.EventMessageEnd) && ev.Agent.Message.Role == agent.RoleAssistant &&
			ev.Agent.Message.StopReason == agent.StopReasonAborted {
			return *ev.Agent.Message
		}
	}
	t.Fatalf("no aborted assistant message:\n%s", fleettest.Dump(envs))
	return agent.Message{}
}

func assistantUsage(t *testing.T, envs []*bus.Envelope) agent.Usage {
	t.Helper()
	for _, e := range envs {
		ev := fleettest.Decode(t, e)
		if ev.Agent != nil && ev.Type == string(agent.EventMessageEnd) && ev.Agent.Message.Role == agent.RoleAssistant {
			return ev.Agent.Message.Usage
		}
	}
	t.Fatalf("no assistant message:\n%s", fleettest.Dump(envs))
	return agent.Usage{}
}

func costOf(in, out int) float64 {
	return (float64(in)*spendInputPrice + float64(out)*spendOutputPrice) / 1e6
}

func same(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// spendRow is one line of the report: a call's real tokens (by the
// endpoint) and what it was charged.
type spendRow struct {
	name              string
	realIn, realOut   int
	chargeIn, chargeO int
	charged           float64
}

// checkEstimate checks that a call without usage was charged its input
// estimate (the first call's: CallInputTokens, what the rate limiter
// reserves) plus the output it streamed (bytes / 3), at the prices.
func checkEstimate(t *testing.T, u agent.Usage, streamed string) {
	t.Helper()
	in := worker.CallInputTokens(agent.Context{Messages: []agent.Message{agent.UserText(spendPrompt)}})
	out := (len(streamed) + worker.OutputBytesPerToken - 1) / worker.OutputBytesPerToken
	if u.Input != in || u.Output != out || !same(u.Cost.Total, costOf(in, out)) {
		t.Fatalf("charged %d in, %d out, $%v; want the estimate: %d in, %d out, $%v", u.Input, u.Output, u.Cost.Total, in, out, costOf(in, out))
	}
}

// checkCharged checks that the tenant's ledger and run_finished.cost both
// say the run spent want, and that no hold is left.
func checkCharged(t *testing.T, f *spendFleet, tenant string, fin *bus.RunFinished, want float64) {
	t.Helper()
	spent, holds := f.spent(tenant)
	if !same(spent, want) || !same(fin.Cost, want) || holds != 0 {
		t.Fatalf("tenant ledger $%v (%d holds left), run_finished.cost $%v; want both $%v", spent, holds, fin.Cost, want)
	}
	if want <= 0 {
		t.Fatal("nothing charged")
	}
}

func TestSpendFailsClosed(t *testing.T) {
	t.Parallel()
	var rows []spendRow
	add := func(r spendRow) { rows = append(rows, r) }

	// A call aborted by the user after its first chunks, its connection
	// held open: no usage ever comes.
	t.Run("aborted", func(t *testing.T) {
		e := &spendEndpoint{reply: func(int) spendReply { return spendReply{hold: true} }}
		f := newSpendFleet(t, e)
		f.startWorker(0, nil)
		id := f.Submit("", spendRun("aborted"))
		waitStreamed(t, f, id)
		if _, err := f.Client.Abort(fleettest.Context(t), id, "enough"); err != nil {
			t.Fatal(err)
		}
		envs := f.Follow(id)
		fin := finishedOf(t, envs)
		if fin.Status != bus.StatusAborted {
			t.Fatalf("finished %s/%s (%s), want aborted", fin.Status, fin.Reason, fin.Error)
		}
		m := cutOffMessage(t, envs)
		checkEstimate(t, m.Usage, m.TextOf())
		checkCharged(t, f, "aborted", fin, m.Usage.Cost.Total)
		if n := f.counter("agentfleet_model_calls_unreported_total", map[string]string{"model": "m", "charged": "estimate"}); n != 1 {
			t.Fatalf("model_calls_unreported_total{charged=estimate} %v, want 1", n)
		}
		c := e.call(0)
		add(spendRow{"aborted", c.input, c.output, m.Usage.Input, m.Usage.Output, m.Usage.Cost.Total})
	})

	// A call cut off by the run's timeout (timeoutSeconds 1).
	t.Run("timed out", func(t *testing.T) {
		e := &spendEndpoint{reply: func(int) spendReply { return spendReply{hold: true} }}
		f := newSpendFleet(t, e)
		f.startWorker(0, nil)
		req := spendRun("timeout")
		req.Limits = &bus.Limits{TimeoutSeconds: 1}
		id := f.Submit("", req)
		envs := f.Follow(id)
		fin := finishedOf(t, envs)
		if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonTimeout {
			t.Fatalf("finished %s/%s (%s), want failed/timeout", fin.Status, fin.Reason, fin.Error)
		}
		m := cutOffMessage(t, envs)
		checkEstimate(t, m.Usage, m.TextOf())
		checkCharged(t, f, "timeout", fin, m.Usage.Cost.Total)
		c := e.call(0)
		add(spendRow{"timed out", c.input, c.output, m.Usage.Input, m.Usage.Output, m.Usage.Cost.Total})
	})

	// A call cut off by a drain's hard stop: the run is handed back, the
	// next worker makes the call again and finishes. Both calls are
	// charged, to the tenant and in the run's cost.
	t.Run("drained", func(t *testing.T) {
		e := &spendEndpoint{reply: func(n int) spendReply { return spendReply{hold: n == 0, usage: "real"} }}
		f := newSpendFleet(t, e)
		first := f.startWorker(200*time.Millisecond, nil)
		id := f.Submit("", spendRun("drained"))
		waitStreamed(t, f, id)
		first.Stop() // the drain ends in a hard stop: the call is held open
		f.startWorker(0, nil)
		envs := f.Follow(id)
		fin := finishedOf(t, envs)
		if fin.Status != bus.StatusSucceeded {
			t.Fatalf("finished %s/%s (%s), want succeeded", fin.Status, fin.Reason, fin.Error)
		}
		m := cutOffMessage(t, envs)
		checkEstimate(t, m.Usage, m.TextOf())
		var resumed *bus.RunResumed
		for _, env := range envs {
			if ev := fleettest.Decode(t, env); ev.RunResumed != nil {
				resumed = ev.RunResumed
			}
		}
		if resumed == nil || resumed.CutOffUsage == nil || *resumed.CutOffUsage != m.Usage {
			t.Fatalf("run_resumed %+v, want the cut-off call's usage %+v", resumed, m.Usage)
		}
		second := e.call(1)
		checkCharged(t, f, "drained", fin, m.Usage.Cost.Total+costOf(second.input, second.output))
		c := e.call(0)
		add(spendRow{"drained (hard stop)", c.input, c.output, m.Usage.Input, m.Usage.Output, m.Usage.Cost.Total})
	})

	// An endpoint that never sends usage.
	t.Run("no usage", func(t *testing.T) {
		e := &spendEndpoint{reply: func(int) spendReply { return spendReply{usage: "none"} }}
		f := newSpendFleet(t, e)
		f.startWorker(0, nil)
		envs := f.Follow(f.Submit("", spendRun("nousage")))
		fin := finishedOf(t, envs)
		if fin.Status != bus.StatusSucceeded {
			t.Fatalf("finished %s/%s (%s), want succeeded", fin.Status, fin.Reason, fin.Error)
		}
		u := assistantUsage(t, envs)
		checkEstimate(t, u, strings.Join(spendAnswer, ""))
		checkCharged(t, f, "nousage", fin, u.Cost.Total)
		if n := f.counter("agentfleet_model_calls_unreported_total", map[string]string{"model": "m", "charged": "estimate"}); n != 1 {
			t.Fatalf("model_calls_unreported_total{charged=estimate} %v, want 1", n)
		}
		c := e.call(0)
		add(spendRow{"no usage", c.input, c.output, u.Input, u.Output, u.Cost.Total})
	})

	// A usage of 2^53 tokens each way is clamped: the tenant is charged at
	// most the call's bounds and is not locked out, and the next run of
	// the model's rate-limit group is admitted without waiting for the
	// window.
	t.Run("forged", func(t *testing.T) {
		e := &spendEndpoint{reply: func(n int) spendReply {
			if n == 0 {
				return spendReply{usage: "forged"}
			}
			return spendReply{usage: "real"}
		}}
		f := newSpendFleet(t, e)
		const window = 20 * time.Second
		f.startWorker(0, &worker.RateLimits{Window: window, Models: map[string]worker.ModelLimit{
			"openai/m": {Group: "g", Limits: ratelimit.Limits{RPM: 100, TPM: 100_000}, MaxTokens: spendMaxTokens}}})
		envs := f.Follow(f.Submit("", spendRun("forged")))
		fin := finishedOf(t, envs)
		if fin.Status != bus.StatusSucceeded {
			t.Fatalf("finished %s/%s (%s), want succeeded", fin.Status, fin.Reason, fin.Error)
		}
		u := assistantUsage(t, envs)
		est := worker.CallInputTokens(agent.Context{Messages: []agent.Message{agent.UserText(spendPrompt)}})
		maxIn := worker.InputClampFactor*est + worker.InputClampFloor
		maxOut := spendMaxTokens + spendMaxTokens/worker.OutputClampMargin + 64
		if u.Input > maxIn || u.Output > maxOut || u.Cost.Total > costOf(maxIn, maxOut)+1e-9 {
			t.Fatalf("charged %d in, %d out, $%v; want at most the clamp: %d in, %d out, $%v", u.Input, u.Output, u.Cost.Total, maxIn, maxOut, costOf(maxIn, maxOut))
		}
		checkCharged(t, f, "forged", fin, u.Cost.Total)
		if n := f.counter("agentfleet_model_usage_clamped_total", map[string]string{"model": "m"}); n != 1 {
			t.Fatalf("model_usage_clamped_total %v, want 1", n)
		}
		if n := f.counter("agentfleet_model_usage_excess_tokens_total", map[string]string{"model": "m", "kind": "input"}); n != float64(1<<53-maxIn) {
			t.Fatalf("excess input tokens %v, want %d", n, 1<<53-maxIn)
		}
		if n := strings.Count(f.logs.String(), "reported more than the call could use"); n != 1 {
			t.Fatalf("the excess logged %d times, want once:\n%s", n, f.logs.String())
		}
		c := e.call(0)
		add(spendRow{"forged 2^53", c.input, c.output, u.Input, u.Output, u.Cost.Total})

		// The same tenant's next run, in the same rate-limit group: its
		// call is admitted at once (no model_wait: it did not queue),
		// where a group charged 2^54 tokens would make it wait for the
		// window to pass.
		envs = f.Follow(f.Submit("", spendRun("forged")))
		if fin := finishedOf(t, envs); fin.Status != bus.StatusSucceeded {
			t.Fatalf("the next run finished %s/%s (%s), want succeeded", fin.Status, fin.Reason, fin.Error)
		}
		for _, env := range envs {
			if ev := fleettest.Decode(t, env); ev.ModelWait != nil {
				t.Fatalf("the next run waited %d ms (%s) for its call: the group is stalled", ev.ModelWait.WaitedMs, ev.ModelWait.Reason)
			}
		}
	})

	var b strings.Builder
	fmt.Fprintf(&b, "\ncharge against the endpoint's real token count, model m at $%d/M input, $%d/M output (prompt %d bytes):\n", spendInputPrice, spendOutputPrice, len(spendPrompt))
	fmt.Fprintf(&b, "%-20s %9s %9s %10s | %9s %9s %10s | %7s\n", "case", "real in", "real out", "real $", "charge in", "charge out", "charged $", "ratio")
	for _, r := range rows {
		real := costOf(r.realIn, r.realOut)
		fmt.Fprintf(&b, "%-20s %9d %9d %10.4f | %9d %9d %10.4f | %7.2f\n", r.name, r.realIn, r.realOut, real, r.chargeIn, r.chargeO, r.charged, r.charged/real)
	}
	t.Log(b.String())
}
