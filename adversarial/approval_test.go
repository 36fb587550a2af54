//go:build adversarial

package adversarial

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/rolefleet"
	"github.com/agentfleet/agentfleet/llm/openai"
	"github.com/agentfleet/agentfleet/worker"
)

// Issue 50, item 3: an approval answer approves only the call it names,
// by the key the worker gave it, and only if it was stored after that
// call asked. The model is hostile: its script repeats the id c1 with
// other arguments. Item 5: the operator's ceilings bound approval waits.

// calc is a scripted turn calling the calculator once with id c1.
func calc(expr string) agent.ScriptedResponse {
	return fleettest.ToolCall("c1", "calculator", map[string]any{"expression": expr})
}

// events follows a run as a role and keeps its events for the test.
type events struct {
	mu   sync.Mutex
	evs  []*bus.Event
	wake chan struct{}
	done chan struct{}
}

func follow(t *testing.T, c *rolefleet.Client, run string) *events {
	t.Helper()
	fctx, cancel := context.WithCancel(context.Background())
	e := &events{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(e.done)
		for env, err := range c.Follow(fctx, run) {
			if err != nil {
				if bus.IsFatalFollowError(err) {
					return
				}
				continue
			}
			ev, err := env.Decode()
			if err != nil {
				continue
			}
			e.mu.Lock()
			e.evs = append(e.evs, ev)
			e.mu.Unlock()
			select {
			case e.wake <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-e.done })
	return e
}

// wait returns the first event that ok accepts, waiting up to 30 s.
func (e *events) wait(t *testing.T, what string, ok func(*bus.Event) bool) *bus.Event {
	t.Helper()
	return e.waitNth(t, what, 1, ok)
}

// waitNth returns the n-th (from 1) event that ok accepts.
func (e *events) waitNth(t *testing.T, what string, n int, ok func(*bus.Event) bool) *bus.Event {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		e.mu.Lock()
		seen := 0
		for _, ev := range e.evs {
			if ok(ev) {
				if seen++; seen == n {
					e.mu.Unlock()
					return ev
				}
			}
		}
		e.mu.Unlock()
		select {
		case <-e.wake:
		case <-e.done:
			t.Fatalf("the run's events ended before %s: %s", what, e.summary())
		case <-deadline:
			t.Fatalf("waited 30s for %s: %s", what, e.summary())
		}
	}
}

// approval returns the n-th (from 1) approval event of a type.
func (e *events) approval(t *testing.T, typ string, n int) *bus.ToolApproval {
	t.Helper()
	return e.waitNth(t, fmt.Sprintf("%s #%d", typ, n), n, func(ev *bus.Event) bool { return ev.Type == typ }).Approval
}

// rejected returns the rejection of the answer stored at seq.
func (e *events) rejected(t *testing.T, seq uint64) *bus.ToolApproval {
	t.Helper()
	return e.wait(t, fmt.Sprintf("the rejection of answer %d", seq), func(ev *bus.Event) bool {
		return ev.Type == bus.EventToolApprovalRejected && ev.Approval.ControlSeq == seq
	}).Approval
}

func (e *events) finished(t *testing.T) *bus.RunFinished {
	t.Helper()
	return e.wait(t, "run_finished", func(ev *bus.Event) bool { return ev.Type == bus.EventRunFinished }).RunFinished
}

func (e *events) summary() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.evs {
		switch {
		case ev.Approval != nil:
			out = append(out, ev.Type+":"+ev.Approval.ToolCallID+":"+ev.Approval.Decision)
		case ev.Agent != nil && ev.Agent.ToolCallID != "":
			out = append(out, ev.Type+":"+ev.Agent.ToolCallID)
		case ev.Agent == nil:
			out = append(out, ev.Type)
		}
	}
	return strings.Join(out, " ")
}

// answer publishes an answer as the approver role; it returns its stream
// sequence.
func answer(t *testing.T, approver *rolefleet.Client, run, key, decision, by string) uint64 {
	t.Helper()
	seq, err := approver.Answer(ctx(t, 10*time.Second), run, bus.ApprovalAnswer{ToolCallID: key, Decision: decision, By: by})
	if err != nil {
		t.Fatalf("answer as %s: %v", approver.Role, err)
	}
	return seq
}

// results are the run's tool results by call key, once it finished.
func results(t *testing.T, c *rolefleet.Client, run string) map[string]string {
	t.Helper()
	tr, err := c.LoadTranscript(ctx(t, 30*time.Second), run)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult {
			out[m.ToolCallID] = m.TextOf()
		}
	}
	return out
}

func submit(t *testing.T, sub *rolefleet.Client, req *bus.RunRequest) {
	t.Helper()
	if _, err := sub.Submit(ctx(t, 10*time.Second), "", req); err != nil {
		t.Fatalf("submit as %s: %v", sub.Role, err)
	}
}

// A late answer (its call timed out) does not approve the model's next
// call, which repeats the id with other arguments.
func TestApprovalLateAnswerDoesNotApproveALaterCall(t *testing.T) {
	f := startFleet(t, &worker.Config{})
	sub, approver := f.Connect(t, "submitter"), f.Connect(t, "approver")
	req := fauxRun("late-answer", "compute", calc("1+1"), calc("6*7"), fleettest.Text("done"))
	req.Approval = &bus.Approval{Tools: []string{"calculator"}, TimeoutSeconds: 1}
	submit(t, sub, req)
	ev := follow(t, approver, req.ID)
	if first := ev.approval(t, bus.EventToolApprovalResolved, 1); first.Decision != bus.DecisionTimeout {
		t.Fatalf("first call resolved %+v", first)
	}
	late := answer(t, approver, req.ID, "c1", bus.DecisionApprove, "late click")
	if fin := ev.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	res := results(t, sub, req.ID)
	second := ev.approval(t, bus.EventToolApprovalRequested, 2)
	if r := res[second.ToolCallID]; second.ToolCallID == "c1" || strings.Contains(r, "42") || !strings.Contains(r, "not approved") {
		t.Fatalf("the later call %q (6*7) got %q: the late answer approved it; events %s", second.ToolCallID, r, ev.summary())
	}
	if rej := ev.rejected(t, late); rej.ToolCallID != "c1" {
		t.Fatalf("rejection %+v", rej)
	}
}

// Two approvers answer the same call: the second answer does not approve
// the model's next call with the same id; that call runs only once
// approved for its own key.
func TestApprovalDuplicateAnswerDoesNotApproveALaterCall(t *testing.T) {
	f := startFleet(t, &worker.Config{})
	sub, alice, bob := f.Connect(t, "submitter"), f.Connect(t, "approver"), f.Connect(t, "approver")
	req := fauxRun("duplicate-answer", "compute", calc("1+1"), calc("6*7"), calc("2*3"), fleettest.Text("done"))
	req.Approval = &bus.Approval{Tools: []string{"calculator"}}
	submit(t, sub, req)
	ev := follow(t, alice, req.ID)
	ev.approval(t, bus.EventToolApprovalRequested, 1)
	a := answer(t, alice, req.ID, "c1", bus.DecisionApprove, "alice")
	b := answer(t, bob, req.ID, "c1", bus.DecisionApprove, "bob")
	if res := ev.approval(t, bus.EventToolApprovalResolved, 1); res.ControlSeq != a {
		t.Fatalf("first resolved %+v, want alice's %d", res, a)
	}
	if rej := ev.rejected(t, b); rej.ToolCallID != "c1" || !strings.Contains(rej.Reason, "already resolved") {
		t.Fatalf("bob's answer %+v", rej)
	}
	second := ev.approval(t, bus.EventToolApprovalRequested, 2)
	if second.ToolCallID == "c1" || second.Args["expression"] != "6*7" {
		t.Fatalf("second request %+v", second)
	}
	// Still waiting: nobody answered its key.
	pending, err := bob.PendingOf(ctx(t, 10*time.Second), req.ID)
	if err != nil || len(pending) != 1 || pending[0].ToolCallID != second.ToolCallID {
		t.Fatalf("pending %+v %v; events %s", pending, err, ev.summary())
	}
	answer(t, bob, req.ID, second.ToolCallID, bus.DecisionDeny, "bob")
	third := ev.approval(t, bus.EventToolApprovalRequested, 3)
	answer(t, alice, req.ID, third.ToolCallID, bus.DecisionApprove, "alice")
	if fin := ev.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	res := results(t, sub, req.ID)
	if res["c1"] != "2" || strings.Contains(res[second.ToolCallID], "42") || !strings.Contains(res[second.ToolCallID], "denied by bob") || res[third.ToolCallID] != "6" {
		t.Fatalf("results %v: each call must run only on its own answer", res)
	}
	if v := f.Log.Lines("Violation"); len(v) > 0 {
		t.Fatalf("the approvers' reads and answers were refused: %q", v)
	}
}

// An answer stored before its call asked (the approver guessed the id
// while an earlier tool ran) is not applied: the call times out.
func TestApprovalAnswerStoredBeforeTheRequestIsNotApplied(t *testing.T) {
	f := startFleet(t, &worker.Config{})
	sub, approver := f.Connect(t, "submitter"), f.Connect(t, "approver")
	req := fauxRun("early-answer", "compute",
		fleettest.ToolCall("s1", "sleep", map[string]any{"seconds": 1}), calc("6*7"), fleettest.Text("done"))
	req.Tools = []string{"sleep", "calculator"}
	req.Approval = &bus.Approval{Tools: []string{"calculator"}, TimeoutSeconds: 2}
	submit(t, sub, req)
	ev := follow(t, approver, req.ID)
	ev.wait(t, "the sleep's start", func(e *bus.Event) bool {
		return e.Type == string(agent.EventToolExecutionStart) && e.Agent.ToolCallID == "s1"
	})
	early := answer(t, approver, req.ID, "c1", bus.DecisionApprove, "guess")
	if fin := ev.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	if r := results(t, sub, req.ID)["c1"]; strings.Contains(r, "42") || !strings.Contains(r, "not approved") {
		t.Fatalf("c1 got %q: the early answer was applied; events %s", r, ev.summary())
	}
	if asked := ev.approval(t, bus.EventToolApprovalRequested, 1); asked.AnswersAfter < early {
		t.Fatalf("request %+v: answersAfter below the early answer %d", asked, early)
	}
	ev.rejected(t, early)
}

// A request asking the protocol's longest wait on a worker with a small
// --max-run-timeout waits at most that long (its expiresAt says so).
func TestApprovalWaitIsBoundedByTheWorkersCeiling(t *testing.T) {
	f := startFleet(t, &worker.Config{MaxRunTimeout: 3 * time.Second})
	sub := f.Connect(t, "submitter")
	req := fauxRun("long-wait", "compute", calc("6*7"), fleettest.Text("done"))
	req.Approval = &bus.Approval{Tools: []string{"calculator"}, TimeoutSeconds: bus.MaxApprovalTimeoutSeconds}
	submit(t, sub, req)
	ev := follow(t, sub, req.ID)
	asked := ev.approval(t, bus.EventToolApprovalRequested, 1)
	if left := time.Until(time.UnixMilli(asked.ExpiresAt)); left > 3*time.Second {
		t.Fatalf("expiresAt %v away on a worker with --max-run-timeout 3s", left)
	}
	if res := ev.approval(t, bus.EventToolApprovalResolved, 1); res.Decision != bus.DecisionTimeout {
		t.Fatalf("resolved %+v", res)
	}
	if fin := ev.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
}

// 13 gated requests on a worker with 8 slots and --max-waiting 5 do not
// starve another run: past the 5 waiting runs a gated call gets a tool
// error at once and its run goes on (and finishes) on its first attempt.
func TestApprovalPastMaxWaitingDoesNotStarveANormalRun(t *testing.T) {
	f := startFleet(t, &worker.Config{Concurrency: 8, MaxWaiting: 5})
	sub, approver := f.Connect(t, "submitter"), f.Connect(t, "approver")
	var gated []string
	for i := range 13 {
		req := fauxRun(fmt.Sprintf("gated-%d", i), "compute", calc("6*7"), fleettest.Text("done"))
		req.Approval = &bus.Approval{Tools: []string{"calculator"}}
		submit(t, sub, req)
		gated = append(gated, req.ID)
	}
	normal := fauxRun("normal", "hi", fleettest.Text("hello"))
	submit(t, sub, normal)
	tr, err := sub.LoadTranscript(ctx(t, 30*time.Second), normal.ID)
	if err != nil || tr.Finished == nil || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("the normal run was starved: %v", err)
	}
	var waiting []string
	refused := 0
	for _, run := range gated {
		rec := waitRecord(t, sub, run, func(r *bus.RunRecord) bool {
			return r.Finished() || r.Waiting != nil && r.Waiting.For == bus.WaitingApproval && len(r.Waiting.Approvals) == 1
		})
		if !rec.Finished() {
			waiting = append(waiting, run)
			continue
		}
		refused++
		if r := results(t, sub, run)["c1"]; rec.State != bus.StatusSucceeded || rec.Attempt != 1 || !strings.Contains(r, "too many runs waiting") {
			t.Fatalf("refused run %s: %s on attempt %d, c1 got %q", run, rec.State, rec.Attempt, r)
		}
	}
	if len(waiting) != 5 || refused != 8 {
		t.Fatalf("%d runs waiting, %d refused; want 5 and 8", len(waiting), refused)
	}
	for _, run := range waiting {
		answer(t, approver, run, "c1", bus.DecisionDeny, "ops")
	}
	for _, run := range waiting {
		waitRecord(t, sub, run, func(r *bus.RunRecord) bool { return r.Finished() })
	}
}

// waitRecord watches a run's record (as the role of c) until ok.
func waitRecord(t *testing.T, c *rolefleet.Client, run string, ok func(*bus.RunRecord) bool) *bus.RunRecord {
	t.Helper()
	wctx := ctx(t, 30*time.Second)
	kv, err := c.Records(wctx)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(wctx, run)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	var last *bus.RunRecord
	for {
		select {
		case e := <-w.Updates():
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			if rec, err := bus.DecodeRecord(e); err == nil {
				if last = rec; ok(rec) {
					return rec
				}
			}
		case <-wctx.Done():
			t.Fatalf("record of %s: last %+v", run, last)
		}
	}
}

// An OpenAI-compatible endpoint that names every tool call call_0 (as some
// servers do, and a hostile one may): both calls run, each approved under
// its own key; the duplicate click approves nothing; and the next request
// carries the keys as tool_call_id, so the conversation stays consistent.
func TestApprovalHostileEndpointRepeatingIDs(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, raw)
		n := len(bodies)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := func(s string) { fmt.Fprintf(w, "data: %s\n\n", s) }
		switch n {
		case 1, 2:
			expr := map[int]string{1: "1+1", 2: "6*7"}[n]
			chunk(`{"id":"r","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"calculator","arguments":"{\"expression\":\"` + expr + `\"}"}}]}}]}`)
			chunk(`{"id":"r","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`)
		default:
			chunk(`{"id":"r","choices":[{"index":0,"delta":{"role":"assistant","content":"done"}}]}`)
			chunk(`{"id":"r","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`)
		}
		chunk("[DONE]")
	}))
	t.Cleanup(srv.Close)
	endpoint, err := openai.New(openai.Config{BaseURL: srv.URL, APIKey: "k", MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	f := startFleet(t, &worker.Config{Providers: map[string]worker.Provider{"openai": endpoint}})
	sub, alice, bob := f.Connect(t, "submitter"), f.Connect(t, "approver"), f.Connect(t, "approver")
	req := &bus.RunRequest{ID: "hostile-endpoint", Prompt: "compute", Model: &bus.ModelRef{Provider: "openai", ID: "m"},
		Tools: []string{"calculator"}, Approval: &bus.Approval{Tools: []string{"calculator"}}}
	submit(t, sub, req)
	ev := follow(t, alice, req.ID)
	if first := ev.approval(t, bus.EventToolApprovalRequested, 1); first.ToolCallID != "call_0" {
		t.Fatalf("first request %+v", first)
	}
	answer(t, alice, req.ID, "call_0", bus.DecisionApprove, "alice")
	dup := answer(t, bob, req.ID, "call_0", bus.DecisionApprove, "bob")
	second := ev.approval(t, bus.EventToolApprovalRequested, 2)
	if second.ToolCallID != "call_0-t2-1" || second.Args["expression"] != "6*7" {
		t.Fatalf("second request %+v", second)
	}
	ev.rejected(t, dup)
	answer(t, bob, req.ID, second.ToolCallID, bus.DecisionApprove, "bob")
	if fin := ev.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v; events %s", fin, ev.summary())
	}
	if res := results(t, sub, req.ID); res["call_0"] != "2" || res["call_0-t2-1"] != "42" {
		t.Fatalf("results %v", res)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 3 {
		t.Fatalf("%d model requests", len(bodies))
	}
	var last struct {
		Messages []struct {
			Role       string `json:"role"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID string `json:"id"`
			} `json:"tool_calls"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(bodies[2], &last); err != nil {
		t.Fatal(err)
	}
	var calls, results []string
	for _, m := range last.Messages {
		for _, c := range m.ToolCalls {
			calls = append(calls, c.ID)
		}
		if m.Role == "tool" {
			results = append(results, m.ToolCallID)
		}
	}
	if got := strings.Join(calls, ",") + " / " + strings.Join(results, ","); got != "call_0,call_0-t2-1 / call_0,call_0-t2-1" {
		t.Fatalf("the third request's tool calls / results: %s", got)
	}
}
