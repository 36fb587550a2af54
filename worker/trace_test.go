package worker_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/budget"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/llm/openai"
	"github.com/agentfleet/agentfleet/ratelimit"
	"github.com/agentfleet/agentfleet/tracing"
	"github.com/agentfleet/agentfleet/worker"
)

// spans is an in-memory exporter's view of one trace.
type spans struct {
	t   *testing.T
	rec *tracetest.SpanRecorder
	tp  *sdktrace.TracerProvider
}

func newSpans(t *testing.T) *spans {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &spans{t: t, rec: rec, tp: tp}
}

// waitFor waits until n ended spans match ok (the worker ends
// invoke_agent after run_finished is published).
func (s *spans) waitFor(n int, what string, ok func(sdktrace.ReadOnlySpan) bool) []sdktrace.ReadOnlySpan {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var got []sdktrace.ReadOnlySpan
		for _, sp := range s.rec.Ended() {
			if ok(sp) {
				got = append(got, sp)
			}
		}
		if len(got) >= n || time.Now().After(deadline) {
			if len(got) < n {
				s.t.Fatalf("%d spans %s ended, want %d:\n%s", len(got), what, n, s.dump())
			}
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *spans) dump() string {
	var b strings.Builder
	for _, sp := range s.rec.Ended() {
		b.WriteString(sp.Name() + " " + sp.SpanContext().SpanID().String() + " parent " + sp.Parent().SpanID().String() + "\n")
	}
	return b.String()
}

func named(name string) func(sdktrace.ReadOnlySpan) bool {
	return func(sp sdktrace.ReadOnlySpan) bool { return sp.Name() == name }
}

func attrs(sp sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range sp.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func wantAttrs(t *testing.T, sp sdktrace.ReadOnlySpan, want map[string]any) {
	t.Helper()
	got := attrs(sp)
	for k, v := range want {
		a, ok := got[attribute.Key(k)]
		if !ok {
			t.Errorf("%s: no attribute %s (has %v)", sp.Name(), k, sp.Attributes())
			continue
		}
		if g := a.AsInterface(); !equalAttr(g, v) {
			t.Errorf("%s: %s = %v (%T), want %v", sp.Name(), k, g, g, v)
		}
	}
}

func equalAttr(got, want any) bool {
	switch w := want.(type) {
	case []string:
		g, ok := got.([]string)
		return ok && strings.Join(g, ",") == strings.Join(w, ",")
	case func(any) bool:
		return w(got)
	}
	return got == want
}

var contentKeys = []string{"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
	"gen_ai.tool.call.arguments", "gen_ai.tool.call.result"}

func childOf(parent sdktrace.ReadOnlySpan) func(sdktrace.ReadOnlySpan) bool {
	return func(sp sdktrace.ReadOnlySpan) bool { return sp.Parent().SpanID() == parent.SpanContext().SpanID() }
}

// submitTraced submits req under a span of the submitter's and returns
// the run id and that span's context.
func submitTraced(t *testing.T, f *fleettest.Fleet, tp trace.TracerProvider, req *bus.RunRequest) (string, trace.SpanContext) {
	t.Helper()
	ctx, span := tp.Tracer("test").Start(fleettest.Context(t), "submit")
	defer span.End()
	res, err := f.Client.Submit(ctx, bus.DefaultQueue, req)
	if err != nil {
		t.Fatal(err)
	}
	return res.ID, span.SpanContext()
}

func toolRunRequest() *bus.RunRequest {
	return &bus.RunRequest{Prompt: "compute", SystemPrompt: "be exact", Tools: []string{"calculator"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("c1", "calculator", map[string]any{"expression": "(2+3)*4^2"}),
			fleettest.Text("It is 80."),
		}}}
}

func TestTraceToolRun(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := newSpans(t)
	f.StartWorker(worker.Config{TracerProvider: s.tp})
	id, submit := submitTraced(t, f, s.tp, toolRunRequest())
	envs := f.Follow(id)
	if fin := checkEnvelopes(t, id, envs); fin.Status != bus.StatusSucceeded {
		t.Fatalf("run_finished %+v", fin)
	}
	inv := s.waitFor(1, "invoke_agent", named("invoke_agent"))[0]
	if inv.SpanContext().TraceID() != submit.TraceID() || inv.Parent().SpanID() != submit.SpanID() {
		t.Fatalf("invoke_agent is not the submit span's child: %v parent %v, submit %v", inv.SpanContext(), inv.Parent(), submit)
	}
	wantAttrs(t, inv, map[string]any{"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": id,
		"gen_ai.provider.name": "faux", "gen_ai.request.model": "scripted",
		"agentfleet.run.id": id, "agentfleet.queue": "default", "agentfleet.attempt": int64(1),
		"agentfleet.resumed": false, "agentfleet.run.status": "succeeded",
		"agentfleet.worker": func(v any) bool { return v != "" }})
	if started := fleettest.Decode(t, envs[0]); started.RunStarted == nil ||
		started.RunStarted.Traceparent != tracing.Traceparent(inv.SpanContext()) {
		t.Fatalf("run_started %s, invoke_agent %s", envs[0].Event, tracing.Traceparent(inv.SpanContext()))
	}
	qw := s.waitFor(1, "queue wait", named("agentfleet.queue.wait"))[0]
	if qw.Parent().SpanID() != submit.SpanID() || qw.EndTime().After(inv.StartTime().Add(time.Millisecond)) {
		t.Fatalf("queue wait %v..%v parent %v; invoke_agent starts %v", qw.StartTime(), qw.EndTime(), qw.Parent(), inv.StartTime())
	}

	children := s.waitFor(5, "under invoke_agent", childOf(inv))
	var names []string
	for _, sp := range children {
		names = append(names, sp.Name())
	}
	if got := strings.Join(names, ","); got != "agentfleet.lease.take,chat scripted,execute_tool calculator,chat scripted,agentfleet.record.write" {
		t.Fatalf("invoke_agent's children (in end order): %s", got)
	}
	wantAttrs(t, children[1], map[string]any{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "faux",
		"gen_ai.request.model": "scripted", "gen_ai.conversation.id": id, "gen_ai.response.finish_reasons": []string{"tool_call"},
		"gen_ai.usage.input_tokens":  func(v any) bool { return v.(int64) > 0 },
		"gen_ai.usage.output_tokens": func(v any) bool { return v.(int64) > 0 },
		"agentfleet.cost_usd":        0.0, "agentfleet.time_to_first_chunk_ms": func(v any) bool { return v.(int64) >= 0 }})
	wantAttrs(t, children[3], map[string]any{"gen_ai.response.finish_reasons": []string{"stop"}})
	if children[1].SpanKind() != trace.SpanKindClient {
		t.Errorf("chat span kind %v", children[1].SpanKind())
	}
	wantAttrs(t, children[2], map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calculator",
		"gen_ai.tool.call.id": "c1"})
	for _, sp := range s.rec.Ended() {
		for _, k := range contentKeys {
			if _, ok := attrs(sp)[attribute.Key(k)]; ok {
				t.Errorf("%s records %s without %s", sp.Name(), k, tracing.CaptureContentEnv)
			}
		}
	}
	in, out := attrs(children[1])["gen_ai.usage.input_tokens"].AsInt64(), attrs(children[1])["gen_ai.usage.output_tokens"].AsInt64()
	in += attrs(children[3])["gen_ai.usage.input_tokens"].AsInt64()
	out += attrs(children[3])["gen_ai.usage.output_tokens"].AsInt64()
	wantAttrs(t, inv, map[string]any{"gen_ai.usage.input_tokens": in, "gen_ai.usage.output_tokens": out})
}

func TestTraceContentCapture(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := newSpans(t)
	f.StartWorker(worker.Config{TracerProvider: s.tp, TraceContent: true})
	id, _ := submitTraced(t, f, s.tp, toolRunRequest())
	f.WaitFinished(id)
	chats := s.waitFor(2, "chat", named("chat scripted"))
	var input []map[string]any
	if err := json.Unmarshal([]byte(attrs(chats[0])["gen_ai.input.messages"].AsString()), &input); err != nil ||
		len(input) != 1 || input[0]["role"] != "user" {
		t.Fatalf("input messages %v: %v", attrs(chats[0])["gen_ai.input.messages"], err)
	}
	wantAttrs(t, chats[0], map[string]any{
		"gen_ai.input.messages":      `[{"role":"user","parts":[{"type":"text","content":"compute"}]}]`,
		"gen_ai.system_instructions": `[{"type":"text","content":"be exact"}]`,
		"gen_ai.output.messages":     `[{"role":"assistant","parts":[{"type":"tool_call","id":"c1","name":"calculator","arguments":{"expression":"(2+3)*4^2"}}],"finish_reason":"tool_call"}]`,
	})
	wantAttrs(t, chats[1], map[string]any{
		"gen_ai.output.messages": `[{"role":"assistant","parts":[{"type":"text","content":"It is 80."}],"finish_reason":"stop"}]`,
		"gen_ai.input.messages": func(v any) bool {
			return strings.Contains(v.(string), `{"role":"tool","parts":[{"type":"tool_call_response","id":"c1","response":"80"}]}`)
		},
	})
	tool := s.waitFor(1, "execute_tool", named("execute_tool calculator"))[0]
	wantAttrs(t, tool, map[string]any{"gen_ai.tool.call.arguments": `{"expression":"(2+3)*4^2"}`, "gen_ai.tool.call.result": "80"})
}

// A resumed attempt links to the earlier attempt's invoke_agent (its
// run_started traceparent) and to the sender of a control message; it
// makes spans only for the model calls it makes, none for the history it
// restored.
func TestTraceResumedRun(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := newSpans(t)
	g := newCancelGate()
	first := newObs()
	cfg := worker.Config{Tools: []*agent.Tool{g.tool()}, AckWait: time.Second, HeartbeatInterval: 250 * time.Millisecond,
		TracerProvider: s.tp, Observer: first}
	kill := killable(f, cfg)
	id, submit := submitTraced(t, f, s.tp, &bus.RunRequest{Prompt: "go", Tools: []string{"gate"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("c1", "gate", map[string]any{"name": "x"}),
			fleettest.Text("done"),
		}}})
	waitFor(t, g.started, "gate x")
	// A steer while attempt 1 runs (it comes live), then the worker dies
	// before the steer reaches the transcript: attempt 2 reads it from
	// the stream, headers included.
	sctx, steer := s.tp.Tracer("test").Start(fleettest.Context(t), "steer")
	if _, err := f.Client.Steer(sctx, id, "also y"); err != nil {
		t.Fatal(err)
	}
	steer.End()
	first.waitControl(t, bus.KindSteer)
	kill() // the gate runs: its start is stored before it ran (tools.go), the kill cannot lose it
	waitFor(t, g.cancelled, "gate x cancelled")
	one := s.waitFor(1, "invoke_agent of attempt 1", named("invoke_agent"))[0]
	wantAttrs(t, one, map[string]any{"agentfleet.run.status": "handed_back", "agentfleet.attempt": int64(1)})
	if l := one.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != steer.SpanContext().SpanID() {
		t.Errorf("attempt 1's links %v, want the steer's sender %v", l, steer.SpanContext())
	}

	cfg.Observer = nil
	f.StartWorker(cfg)
	envs := f.Follow(id)
	tr := transcriptOf(t, envs)
	if tr.Finished == nil || tr.Finished.Status != bus.StatusSucceeded || tr.Attempt != 2 {
		t.Fatalf("resumed run: %+v\n%s", tr.Finished, fleettest.Dump(envs))
	}
	second := s.waitFor(2, "invoke_agent", named("invoke_agent"))[1]
	if second.SpanContext().TraceID() != submit.TraceID() || second.Parent().SpanID() != submit.SpanID() {
		t.Fatalf("attempt 2 is not the submit span's child")
	}
	wantAttrs(t, second, map[string]any{"agentfleet.attempt": int64(2), "agentfleet.resumed": true, "agentfleet.run.status": "succeeded"})
	links := map[string]trace.SpanContext{}
	for _, l := range second.Links() {
		for _, kv := range l.Attributes {
			if kv.Key == "agentfleet.link" {
				links[kv.Value.AsString()] = l.SpanContext
			}
		}
	}
	if sc := links["earlier_attempt"]; sc.SpanID() != one.SpanContext().SpanID() || sc.TraceID() != one.SpanContext().TraceID() {
		t.Errorf("attempt 2's link to attempt 1: %v, want %v (links %v)", sc, one.SpanContext(), second.Links())
	}
	if sc := links["control.steer"]; sc.SpanID() != steer.SpanContext().SpanID() {
		t.Errorf("attempt 2's link to the steer's sender: %v, want %v", sc, steer.SpanContext())
	}

	// Spans of attempt 2: one chat per assistant message it published,
	// and no execute_tool (the gate's call was restored, not run again).
	made := 0
	for _, e := range envs {
		if e.Attempt == 2 && e.Type == "message_end" && strings.Contains(string(e.Event), `"role":"assistant"`) {
			made++
		}
	}
	var chats, tools int
	for _, sp := range s.rec.Ended() {
		if sp.Parent().SpanID() != second.SpanContext().SpanID() {
			continue
		}
		switch {
		case strings.HasPrefix(sp.Name(), "chat "):
			chats++
		case strings.HasPrefix(sp.Name(), "execute_tool "):
			tools++
		}
	}
	if made == 0 || chats != made || tools != 0 {
		t.Fatalf("attempt 2: %d chat spans for %d assistant messages, %d tool spans:\n%s", chats, made, tools, s.dump())
	}
}

// Without a provider the run publishes no traceparent.
func TestNoTracing(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	ctx, span := newSpans(t).tp.Tracer("test").Start(fleettest.Context(t), "submit")
	defer span.End()
	res, err := f.Client.Submit(ctx, "", fleettest.FauxRun("hi", fleettest.Text("hello")))
	if err != nil {
		t.Fatal(err)
	}
	envs := f.Follow(res.ID)
	if started := fleettest.Decode(t, envs[0]); started.RunStarted == nil || started.RunStarted.Traceparent != "" {
		t.Fatalf("run_started %s", envs[0].Event)
	}
}

// A model call that waits for the fleet's shared limits has a
// agentfleet.ratelimit.wait span under its chat span, one per model_wait
// event; the chat spans of a real (OpenAI-compatible) endpoint carry its
// response model and usage.
func TestTraceRateLimitWait(t *testing.T) {
	t.Parallel()
	p := &limitedProvider{rpm: 100, tpm: 1 << 30, window: time.Second}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	f := newFleet(t)
	s := newSpans(t)
	seam := ratelimit.NewSeam(map[string]string{"m": "main"})
	cfg := worker.Config{Concurrency: 4, DefaultModel: "openai/m", TracerProvider: s.tp,
		RateLimits: &worker.RateLimits{Window: time.Second, Liveness: time.Second, Seam: seam,
			Models: map[string]worker.ModelLimit{"openai/m": {Group: "main", Limits: ratelimit.Limits{RPM: 2}, MaxTokens: 50}}}}
	prov, err := openai.New(openai.Config{BaseURL: srv.URL + "/v1", Models: []openai.ModelInfo{{ID: "m", MaxTokens: 50}},
		Gate: seam.Gate, OnRetryAfter: seam.OnRetryAfter})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prov.CloseIdleConnections)
	cfg.Providers = map[string]worker.Provider{"openai": prov}
	f.StartWorker(cfg)
	var ids []string
	for range 2 {
		id, _ := submitTraced(t, f, s.tp, &bus.RunRequest{Prompt: "what is 6*7?", Tools: []string{"calculator"}})
		ids = append(ids, id)
	}
	waits := 0
	for _, id := range ids {
		for _, e := range f.Follow(id) {
			if ev := fleettest.Decode(t, e); ev.ModelWait != nil {
				waits++
			}
		}
	}
	if waits == 0 {
		t.Fatal("4 calls at 2 a second never waited: the test proves nothing")
	}
	s.waitFor(2, "invoke_agent", named("invoke_agent"))
	chats := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, sp := range s.waitFor(4, "chat m", named("chat m")) {
		chats[sp.SpanContext().SpanID()] = sp
		wantAttrs(t, sp, map[string]any{"gen_ai.provider.name": "openai", "gen_ai.response.model": "m",
			"gen_ai.usage.output_tokens": int64(5)})
	}
	limitWaits := s.waitFor(waits, "rate limit waits", named("agentfleet.ratelimit.wait"))
	if len(limitWaits) != waits {
		t.Fatalf("%d rate limit wait spans for %d model_wait events", len(limitWaits), waits)
	}
	long := 0
	for _, sp := range limitWaits {
		chat, ok := chats[sp.Parent().SpanID()]
		if !ok {
			t.Errorf("rate limit wait's parent %v is not a chat span", sp.Parent())
			continue
		}
		wantAttrs(t, sp, map[string]any{"agentfleet.ratelimit.group": "main"})
		// The endpoint answers at once: its first chunk comes well within
		// the wait, which time_to_first_chunk_ms leaves out.
		if waited := sp.EndTime().Sub(sp.StartTime()); waited > 200*time.Millisecond {
			long++
			if first := attrs(chat)["agentfleet.time_to_first_chunk_ms"].AsInt64(); first >= waited.Milliseconds() {
				t.Errorf("time_to_first_chunk_ms %d after a wait of %s: the wait is counted", first, waited)
			}
		}
	}
	if long == 0 {
		t.Fatal("no wait of over 200ms: the first-chunk check proves nothing")
	}
}

// A run that waits for its tenant's budget at pickup has an
// agentfleet.budget.wait span under invoke_agent, as long as the wait.
func TestTraceBudgetWait(t *testing.T) {
	t.Parallel()
	const period = 2 * time.Second
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	f := newFleet(t)
	s := newSpans(t)
	tb := budget.Tenant{USD: 5, OnExhausted: budget.Wait}
	b := &budget.Budgets{Period: period, Tenants: map[string]budget.Tenant{"acme": tb}}
	prov, err := openai.New(openai.Config{BaseURL: srv.URL + "/v1", Models: []openai.ModelInfo{
		{ID: "m", MaxTokens: tenantMaxTokens, Cost: agent.ModelCost{Input: 1000, Output: 1000}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prov.CloseIdleConnections)
	f.StartWorker(worker.Config{DefaultModel: "openai/m", Providers: map[string]worker.Provider{"openai": prov},
		Budgets: &worker.TenantBudgets{Budgets: b}, TracerProvider: s.tp})
	// This period and the next are spent: a rollover between the spend
	// and the run's call still leaves it waiting (with only this one
	// spent, a clean-clone CI's run came after the rollover and did not).
	now := time.Now()
	spendPeriods(t, ledger(t, f), "acme", tb, period, now, now.Add(period))
	id, _ := submitTraced(t, f, s.tp, tenantRun("acme"))
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("run: %s/%s (%s)", fin.Status, fin.Reason, fin.Error)
	}
	waitedMs, eventAt := int64(0), time.Time{}
	for _, e := range f.Follow(id) {
		if ev := fleettest.Decode(t, e); ev.ModelWait != nil && ev.ModelWait.Reason == bus.WaitBudget {
			waitedMs, eventAt = ev.ModelWait.WaitedMs, time.UnixMilli(e.TS)
		}
	}
	if waitedMs == 0 {
		t.Fatal("the run never waited for its budget: the test proves nothing")
	}
	invoke := s.waitFor(1, "invoke_agent", named("invoke_agent"))[0]
	wait := s.waitFor(1, "budget wait", named("agentfleet.budget.wait"))[0]
	if wait.Parent().SpanID() != invoke.SpanContext().SpanID() {
		t.Fatalf("budget wait's parent is not invoke_agent:\n%s", s.dump())
	}
	wantAttrs(t, wait, map[string]any{"agentfleet.wait.for": "budget"})
	// The span covers the wait: it starts when the wait began (the
	// event's time less its waitedMs, both in whole milliseconds) and ends
	// no earlier than the period the budget was free again began, and no
	// later than the model_wait event. The event's waitedMs also counts
	// retaking the slot after the span ended, which on a loaded machine
	// takes a while: the span is not compared with it.
	began := eventAt.Add(-time.Duration(waitedMs) * time.Millisecond)
	if wait.StartTime().After(began.Add(2 * time.Millisecond)) {
		t.Fatalf("budget wait span starts at %s, after the wait began (%s)", wait.StartTime(), began)
	}
	free := budget.AccountAt("acme", tb, period, now.Add(period)).End
	if wait.EndTime().Before(free) {
		t.Fatalf("budget wait span ends at %s, before the budget's next period (%s)", wait.EndTime(), free)
	}
	if wait.EndTime().After(eventAt.Add(time.Millisecond)) {
		t.Fatalf("budget wait span ends at %s, after the run's model_wait event (%s)", wait.EndTime(), eventAt)
	}
}

// A child run's trace (issue 56) is a child of its parent's execute_tool
// span: the run_agent call's span is the child's submit.
func TestTraceChildRun(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := newSpans(t)
	f.StartWorker(worker.Config{TracerProvider: s.tp})
	req := fleettest.FauxRun("plan",
		fleettest.ToolCall("k", bus.ToolRunAgent, map[string]any{"prompt": "task", "request": map[string]any{"faux": fleettest.Texts("answer")}}),
		fleettest.Text("merged"))
	req.Tools = []string{bus.ToolRunAgent}
	id, _ := submitTraced(t, f, s.tp, req)
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("run_finished %+v", fin)
	}
	call := s.waitFor(1, "execute_tool run_agent", named("execute_tool run_agent"))[0]
	child := s.waitFor(1, "the child's invoke_agent", func(sp sdktrace.ReadOnlySpan) bool {
		return sp.Name() == "invoke_agent" && attrs(sp)["agentfleet.run.id"].AsString() == childID(t, f.Client, id, "k")
	})[0]
	if child.SpanContext().TraceID() != call.SpanContext().TraceID() || child.Parent().SpanID() != call.SpanContext().SpanID() {
		t.Fatalf("the child's invoke_agent is not the call's child: parent %v, call %v\n%s", child.Parent(), call.SpanContext(), s.dump())
	}
}
