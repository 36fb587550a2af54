package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/tracing"
	"github.com/agentfleet/agentfleet/worker/internal/runtrace"
)

func spanRecorder(t *testing.T) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, tp
}

// endedSpans waits until n ended spans match ok.
func endedSpans(t *testing.T, rec *tracetest.SpanRecorder, n int, ok func(sdktrace.ReadOnlySpan) bool) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var got []sdktrace.ReadOnlySpan
		for _, sp := range rec.Ended() {
			if ok(sp) {
				got = append(got, sp)
			}
		}
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d matching spans ended, want %d:\n%s", len(got), n, dumpSpans(rec))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func spanNamed(name string) func(sdktrace.ReadOnlySpan) bool {
	return func(sp sdktrace.ReadOnlySpan) bool { return sp.Name() == name }
}

func dumpSpans(rec *tracetest.SpanRecorder) string {
	var b strings.Builder
	for _, sp := range rec.Ended() {
		fmt.Fprintf(&b, "%s trace=%s span=%s parent=%s %v\n", sp.Name(), sp.SpanContext().TraceID(), sp.SpanContext().SpanID(), sp.Parent().SpanID(), sp.Attributes())
	}
	return b.String()
}

func spanAttr(sp sdktrace.ReadOnlySpan, key string) (any, bool) {
	for _, kv := range sp.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.AsInterface(), true
		}
	}
	return nil, false
}

// A tool that panics (the agent recovers it) still ends its execute_tool
// span, as failed.
func TestTraceToolPanicEndsSpan(t *testing.T) {
	t.Parallel()
	rec, tp := spanRecorder(t)
	boom := &agent.Tool{Name: "boom", Description: "panics", Parameters: []byte(`{"type":"object"}`),
		Execute: func(ctx context.Context, id string, args map[string]any, u agent.UpdateFunc) (agent.ToolResult, error) {
			panic("kaboom")
		}}
	_, c := startInternal(t, Config{Tools: []*agent.Tool{boom}, TracerProvider: tp}, nil)
	run := submitRun(t, c, &bus.RunRequest{Prompt: "go", Tools: []string{"boom"}, Model: fauxModel,
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{{Type: agent.ContentToolCall, ID: "c1", Name: "boom", Arguments: map[string]any{}}}, StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text("ok")}},
		}}})
	waitRecord(t, c, run, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
	// invoke_agent ends after the tool call: a span not ended by then never is.
	endedSpans(t, rec, 1, spanNamed("invoke_agent"))
	var ended []sdktrace.ReadOnlySpan
	for _, sp := range rec.Ended() {
		if sp.Name() == "execute_tool boom" {
			ended = append(ended, sp)
		}
	}
	if len(ended) != 1 {
		t.Fatalf("%d execute_tool boom spans ended, want 1:\n%s", len(ended), dumpSpans(rec))
	}
	if et, _ := spanAttr(ended[0], "error.type"); et != "tool_panic" || ended[0].Status().Code.String() != "Error" {
		t.Fatalf("error.type %v, status %v", et, ended[0].Status())
	}
	if strings.Contains(ended[0].Status().Description, "kaboom") {
		t.Fatalf("the panic's value is in the span: %v", ended[0].Status())
	}
}

// An approval wait has an agentfleet.approval.wait span under invoke_agent
// with the call and its decision; a denied call has it too (it never runs).
func TestTraceApprovalWait(t *testing.T) {
	t.Parallel()
	rec, tp := spanRecorder(t)
	_, c, d := approvalWorker(t, Config{TracerProvider: tp})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod", "staging"))
	waitRecord(t, c, run, "waiting for c1, c2", func(r *bus.RunRecord) bool { return waitingFor(r, "c1", "c2") })
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c2", "decision": "deny", "reason": "not today"})
	waitRecord(t, c, run, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
	invoke := endedSpans(t, rec, 1, spanNamed("invoke_agent"))[0]
	waits := endedSpans(t, rec, 2, spanNamed("agentfleet.approval.wait"))
	got := map[any]any{}
	for _, sp := range waits {
		if sp.Parent().SpanID() != invoke.SpanContext().SpanID() {
			t.Errorf("approval wait's parent %v, want invoke_agent", sp.Parent().SpanID())
		}
		if f, _ := spanAttr(sp, "agentfleet.wait.for"); f != "approval" {
			t.Errorf("agentfleet.wait.for = %v", f)
		}
		id, _ := spanAttr(sp, "gen_ai.tool.call.id")
		got[id], _ = spanAttr(sp, "agentfleet.approval.decision")
	}
	if got["c1"] != "approve" || got["c2"] != "deny" || len(got) != 2 {
		t.Fatalf("decisions %v, want c1 approve, c2 deny:\n%s", got, dumpSpans(rec))
	}
	if ran := d.targets(); ran != "prod" {
		t.Fatalf("deploy ran %q", ran)
	}
}

// traceGaveUp makes the give-up's attempt an invoke_agent under the
// request's trace, with the finish's outcome or the give-up's error.
func TestTraceGaveUpHelper(t *testing.T) {
	t.Parallel()
	rec, tp := spanRecorder(t)
	w, _ := startInternal(t, Config{TracerProvider: tp}, nil)
	_, submit := tp.Tracer("test").Start(context.Background(), "submit")
	submit.End()
	h := nats.Header{}
	h.Set("traceparent", tracing.Traceparent(submit.SpanContext()))

	r := w.newRun("r1", "default", 4, 7, time.Now())
	end := r.traceGaveUp(h)
	if r.traceparent() == "" {
		t.Fatal("no traceparent for the give-up's run_started")
	}
	r.traceFinished(bus.RunFinished{Status: bus.StatusFailed, Reason: bus.ReasonGaveUp, Error: "gave up"})
	end(nil)
	r2 := w.newRun("r2", "default", 4, 8, time.Now())
	r2.traceGaveUp(nil)(errors.New("lease: boom"))

	spans := endedSpans(t, rec, 2, spanNamed("invoke_agent"))
	byRun := map[any]sdktrace.ReadOnlySpan{}
	for _, sp := range spans {
		id, _ := spanAttr(sp, "agentfleet.run.id")
		byRun[id] = sp
	}
	one, two := byRun["r1"], byRun["r2"]
	if one.Parent().SpanID() != submit.SpanContext().SpanID() || one.SpanContext().TraceID() != submit.SpanContext().TraceID() {
		t.Fatalf("give-up span is not the submit's child:\n%s", dumpSpans(rec))
	}
	for k, want := range map[string]any{"agentfleet.run.status": "failed", "error.type": "gave_up", "agentfleet.give_up": true, "agentfleet.attempt": int64(4)} {
		if v, _ := spanAttr(one, k); v != want {
			t.Errorf("%s = %v, want %v", k, v, want)
		}
	}
	if v, _ := spanAttr(two, "agentfleet.run.status"); v != "not_started" || two.Status().Code.String() != "Error" {
		t.Errorf("failed give-up: status %v, %v", v, two.Status())
	}
}

// gen_ai.usage.input_tokens counts cached input tokens too; the cache's
// share has its own attributes, on chat and on invoke_agent.
func TestTraceInputTokensCountCache(t *testing.T) {
	t.Parallel()
	rec, tp := spanRecorder(t)
	w := &Worker{tracer: newTracer(tp)}
	r := &run{w: w, id: "r1"}
	_, r.trace.Span = w.tracer.Start(context.Background(), "invoke_agent")
	_, span := w.tracer.Start(context.Background(), "chat m")
	r.traceResponse(span, &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonStop,
		Usage: agent.Usage{Input: 10, CacheRead: 990, CacheWrite: 100, Output: 5, TotalTokens: 1105}}, 0, false)
	span.End()
	r.traceEnd()
	for _, sp := range endedSpans(t, rec, 2, func(sdktrace.ReadOnlySpan) bool { return true }) {
		for k, want := range map[string]any{"gen_ai.usage.input_tokens": int64(1100), "gen_ai.usage.output_tokens": int64(5),
			"gen_ai.usage.cache_read.input_tokens": int64(990), "gen_ai.usage.cache_creation.input_tokens": int64(100)} {
			if v, _ := spanAttr(sp, k); v != want {
				t.Errorf("%s: %s = %v, want %v", sp.Name(), k, v, want)
			}
		}
	}
}

// A lease or record span is a child of invoke_agent, also when only the
// span was set (as the tests above do), not the root of a new trace.
func TestTraceStepParentWithoutTraceBegin(t *testing.T) {
	t.Parallel()
	rec, tp := spanRecorder(t)
	w := &Worker{tracer: newTracer(tp)}
	r := &run{w: w, id: "r1"}
	_, r.trace.Span = w.tracer.Start(context.Background(), "invoke_agent")
	r.traceStep(runtrace.SpanLeaseTake, time.Now(), nil)
	r.trace.Span.End()
	inv := r.trace.Span.SpanContext()
	for _, sp := range endedSpans(t, rec, 2, func(sdktrace.ReadOnlySpan) bool { return true }) {
		if sp.Name() == runtrace.SpanLeaseTake && (sp.Parent().SpanID() != inv.SpanID() || sp.SpanContext().TraceID() != inv.TraceID()) {
			t.Errorf("lease span: parent %v, want invoke_agent %v", sp.Parent(), inv)
		}
	}
}

// A request without a trace context still makes one trace: its queue wait
// is a child of invoke_agent.
func TestTraceQueueWaitWithoutAParent(t *testing.T) {
	t.Parallel()
	rec, tp := spanRecorder(t)
	_, c := startInternal(t, Config{TracerProvider: tp}, nil)
	run := submitRun(t, c, &bus.RunRequest{Prompt: "hi", Model: fauxModel, Faux: fauxTexts("hello")})
	waitRecord(t, c, run, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
	inv := endedSpans(t, rec, 1, spanNamed("invoke_agent"))[0]
	qw := endedSpans(t, rec, 1, spanNamed("agentfleet.queue.wait"))[0]
	if inv.Parent().IsValid() {
		t.Fatalf("the request had no trace context, invoke_agent has a parent %v", inv.Parent())
	}
	if qw.SpanContext().TraceID() != inv.SpanContext().TraceID() || qw.Parent().SpanID() != inv.SpanContext().SpanID() {
		t.Fatalf("queue wait is not invoke_agent's child:\n%s", dumpSpans(rec))
	}
	if !qw.EndTime().Equal(inv.StartTime()) || !qw.StartTime().Before(qw.EndTime()) {
		t.Fatalf("queue wait %v..%v, invoke_agent starts %v", qw.StartTime(), qw.EndTime(), inv.StartTime())
	}
}

// Without content capture a failed tool's span says it failed, not what
// its error text says (it may quote arguments or output); with capture
// it keeps the text.
func TestTraceToolErrorTextOnlyWithCapture(t *testing.T) {
	t.Parallel()
	for _, capture := range []bool{false, true} {
		rec, tp := spanRecorder(t)
		leak := &agent.Tool{Name: "leak", Description: "fails", Parameters: []byte(`{"type":"object"}`),
			Execute: func(ctx context.Context, id string, args map[string]any, u agent.UpdateFunc) (agent.ToolResult, error) {
				return agent.ToolResult{}, errors.New("cannot open /home/alice/secret-plan.txt")
			}}
		_, c := startInternal(t, Config{Tools: []*agent.Tool{leak}, TracerProvider: tp, TraceContent: capture}, nil)
		run := submitRun(t, c, &bus.RunRequest{Prompt: "go", Tools: []string{"leak"}, Model: fauxModel,
			Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
				{Content: []agent.Content{{Type: agent.ContentToolCall, ID: "c1", Name: "leak", Arguments: map[string]any{}}}, StopReason: agent.StopReasonToolUse},
				{Content: []agent.Content{agent.Text("ok")}},
			}}})
		waitRecord(t, c, run, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
		sp := endedSpans(t, rec, 1, spanNamed("execute_tool leak"))[0]
		if et, _ := spanAttr(sp, "error.type"); et != "tool_error" || sp.Status().Code.String() != "Error" {
			t.Fatalf("capture %v: error.type %v, status %v", capture, et, sp.Status())
		}
		if got := strings.Contains(sp.Status().Description, "secret-plan"); got != capture {
			t.Errorf("capture %v: status %q", capture, sp.Status().Description)
		}
	}
}

// invoke_agent's agentfleet.resumed says whether a transcript was
// restored; an attempt that found the run finished says so; error.type is
// never empty.
func TestTraceResumedStatusAndErrorType(t *testing.T) {
	t.Parallel()
	rec, tp := spanRecorder(t)
	w := &Worker{tracer: newTracer(tp), id: "w"}
	for _, c := range []struct {
		id       string
		restored bool
		err      error
		fin      *bus.RunFinished
	}{
		{id: "nothing"},
		{id: "restored", restored: true},
		{id: "finished", err: errAlreadyFinished},
		{id: "failed", restored: true, fin: &bus.RunFinished{Status: bus.StatusFailed, Error: "x"}},
	} {
		r := &run{w: w, id: c.id, attempt: 2, startedAt: time.Now()}
		r.traceBeginFrom(nil)
		r.traceResumed(c.restored, c.err)
		if c.fin != nil {
			r.traceFinished(*c.fin)
		}
		r.traceEnd()
	}
	got := map[any]map[string]any{}
	for _, sp := range endedSpans(t, rec, 4, spanNamed("invoke_agent")) {
		id, _ := spanAttr(sp, "agentfleet.run.id")
		got[id] = map[string]any{}
		for _, k := range []string{"agentfleet.resumed", "agentfleet.run.status", "error.type"} {
			got[id][k], _ = spanAttr(sp, k)
		}
	}
	want := map[any]map[string]any{
		"nothing":  {"agentfleet.resumed": false, "agentfleet.run.status": "not_started", "error.type": nil},
		"restored": {"agentfleet.resumed": true, "agentfleet.run.status": "not_started", "error.type": nil},
		"finished": {"agentfleet.resumed": false, "agentfleet.run.status": "already_finished", "error.type": nil},
		"failed":   {"agentfleet.resumed": true, "agentfleet.run.status": "failed", "error.type": "failed"},
	}
	for id, w := range want {
		for k, v := range w {
			if got[id][k] != v {
				t.Errorf("%s: %s = %v, want %v", id, k, got[id][k], v)
			}
		}
	}
}
