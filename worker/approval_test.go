package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/metrics"
)

// deployTool records the arguments it ran with; target is required.
type deployTool struct {
	mu  sync.Mutex
	ran []string
}

func (d *deployTool) tool() *agent.Tool {
	return agent.NewTool("deploy", "deploys", func(_ context.Context, a struct {
		Target string `json:"target"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		d.mu.Lock()
		d.ran = append(d.ran, a.Target)
		d.mu.Unlock()
		return agent.TextResult("deployed " + a.Target), nil
	})
}

func (d *deployTool) targets() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return strings.Join(d.ran, ",")
}

var fauxModel = &bus.ModelRef{Provider: "faux", ID: "s"}

// deployScript: one turn calling deploy once per target (ids c1, c2, ...),
// then a final text.
func deployScript(targets ...string) *bus.FauxScript {
	var calls []agent.Content
	for i, t := range targets {
		calls = append(calls, agent.ToolCall(fmt.Sprintf("c%d", i+1), "deploy", map[string]any{"target": t}))
	}
	return &bus.FauxScript{Responses: []agent.ScriptedResponse{
		{Content: calls, StopReason: agent.StopReasonToolUse},
		{Content: []agent.Content{agent.Text("done")}}}}
}

func gatedRequest(approval *bus.Approval, targets ...string) *bus.RunRequest {
	return &bus.RunRequest{Prompt: "deploy", Tools: []string{"deploy"}, Model: fauxModel,
		Faux: deployScript(targets...), Approval: approval}
}

// answer publishes an answer as any NATS client would.
func sendAnswer(t *testing.T, c *bus.Client, run string, a map[string]any) uint64 {
	t.Helper()
	data, _ := json.Marshal(a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := c.JetStream().Publish(ctx, c.Names().Control(run, bus.KindApprove), data)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// runEvents collects a run's decoded events as they come.
type runEvents struct {
	mu   sync.Mutex
	evs  []*bus.Event
	wake chan struct{}
	done chan struct{}
}

func followRun(t *testing.T, c *bus.Client, run string) *runEvents {
	ctx, cancel := context.WithCancel(context.Background())
	re := &runEvents{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(re.done)
		for env, err := range c.Follow(ctx, run) {
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
			re.mu.Lock()
			re.evs = append(re.evs, ev)
			re.mu.Unlock()
			select {
			case re.wake <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-re.done })
	return re
}

// waitFor returns the n-th (1-based) event of type typ, waiting for it.
func (re *runEvents) waitFor(t *testing.T, typ string, n int) *bus.Event {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		re.mu.Lock()
		seen := 0
		for _, ev := range re.evs {
			if ev.Type == typ {
				if seen++; seen == n {
					re.mu.Unlock()
					return ev
				}
			}
		}
		re.mu.Unlock()
		select {
		case <-re.wake:
		case <-re.done:
			if re.count(typ) >= n {
				continue
			}
			t.Fatalf("the run ended without %s #%d; events: %s", typ, n, re.types())
		case <-deadline:
			t.Fatalf("no %s #%d within 30s; events: %s", typ, n, re.types())
		}
	}
}

func (re *runEvents) finished(t *testing.T) *bus.RunFinished {
	t.Helper()
	return re.waitFor(t, bus.EventRunFinished, 1).RunFinished
}

// types lists the events so far, tool calls and approvals with their ids.
func (re *runEvents) types() string {
	re.mu.Lock()
	defer re.mu.Unlock()
	var out []string
	for _, ev := range re.evs {
		s := ev.Type
		switch {
		case ev.Approval != nil:
			s += ":" + ev.Approval.ToolCallID
			if ev.Approval.Decision != "" {
				s += ":" + ev.Approval.Decision
			}
		case ev.Agent != nil && ev.Agent.ToolCallID != "":
			s += ":" + ev.Agent.ToolCallID
		case ev.Type == string(agent.EventMessageUpdate) || ev.Type == string(agent.EventMessageStart) || ev.Type == string(agent.EventMessageEnd):
			continue
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// count returns how many events of a type came.
func (re *runEvents) count(typ string) int {
	re.mu.Lock()
	defer re.mu.Unlock()
	n := 0
	for _, ev := range re.evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// toolResults returns the run's tool results by call id.
func toolResults(t *testing.T, c *bus.Client, run string) map[string]agent.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := c.LoadTranscript(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]agent.Message{}
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult {
			out[m.ToolCallID] = m
		}
	}
	return out
}

func submitRun(t *testing.T, c *bus.Client, req *bus.RunRequest) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.Submit(ctx, "", req)
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

// waitRecord waits until the run's record satisfies ok.
func waitRecord(t *testing.T, c *bus.Client, run string, what string, ok func(*bus.RunRecord) bool) *bus.RunRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, run)
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
			rec, err := bus.DecodeRecord(e)
			if err != nil {
				continue
			}
			if last = rec; ok(rec) {
				return rec
			}
		case <-ctx.Done():
			t.Fatalf("record of %s never %s; last %+v", run, what, last)
		}
	}
}

func waitingFor(rec *bus.RunRecord, ids ...string) bool {
	if rec.State != bus.StateRunning || rec.Waiting == nil || rec.Waiting.For != bus.WaitingApproval || len(rec.Waiting.Approvals) != len(ids) {
		return false
	}
	have := map[string]bool{}
	for _, a := range rec.Waiting.Approvals {
		have[a.ToolCallID] = true
	}
	for _, id := range ids {
		if !have[id] {
			return false
		}
	}
	return true
}

func approvalWorker(t *testing.T, cfg Config) (*Worker, *bus.Client, *deployTool) {
	d := &deployTool{}
	cfg.Tools = append(cfg.Tools, d.tool())
	w, c := startInternal(t, cfg, nil)
	return w, c, d
}

func TestApprovalApproveRunsTheCall(t *testing.T) {
	t.Parallel()
	w, c, d := approvalWorker(t, Config{Concurrency: 2})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"dep*"}}, "prod"))
	re := followRun(t, c, run)
	req := re.waitFor(t, bus.EventToolApprovalRequested, 1).Approval
	if req.ToolCallID != "c1" || req.ToolName != "deploy" || req.Args["target"] != "prod" || req.ExpiresAt <= time.Now().UnixMilli() {
		t.Fatalf("request %+v", req)
	}
	rec := waitRecord(t, c, run, "waiting for c1", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	if a := rec.Waiting.Approvals[0]; a.ExpiresAt != req.ExpiresAt || a.ToolName != "deploy" || rec.Waiting.Since.IsZero() {
		t.Fatalf("record waiting %+v, request %+v", rec.Waiting, req)
	}
	if d.targets() != "" {
		t.Fatal("the gated call ran before its answer")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	listed, err := c.List(ctx, bus.ListOptions{State: bus.StateWaiting})
	if err != nil || len(listed) != 1 || listed[0].ID != run {
		t.Fatalf("list waiting: %v %+v", err, listed)
	}
	if w.OffSlot() != 1 {
		t.Fatalf("%d runs off their slot, want 1", w.OffSlot())
	}
	seq := sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "alice"})
	res := re.waitFor(t, bus.EventToolApprovalResolved, 1).Approval
	if res.Decision != bus.DecisionApprove || res.By != "alice" || res.ControlSeq != seq || res.Arguments != nil {
		t.Fatalf("resolved %+v, want approve by alice at %d, no edit", res, seq)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	if d.targets() != "prod" {
		t.Fatalf("deploy ran with %q", d.targets())
	}
	// The approval events sit between the call's start and end.
	if got, want := re.types(), "tool_execution_start:c1 tool_approval_requested:c1 tool_approval_resolved:c1:approve tool_execution_end:c1"; !strings.Contains(got, want) {
		t.Fatalf("events %s, want %s in them", got, want)
	}
	final := waitRecord(t, c, run, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
	if final.Waiting != nil || w.OffSlot() != 0 {
		t.Fatalf("after the run: record waiting %+v, %d off slot", final.Waiting, w.OffSlot())
	}
	// The final record's write purged the run's waiting-index entry.
	idx, err := c.JetStream().Stream(ctx, c.Names().WaitingStream())
	if err != nil {
		t.Fatal(err)
	}
	if m, err := idx.GetLastMsgForSubject(ctx, c.Names().WaitingEntry(final.Queue, run)); err == nil {
		t.Fatalf("the finished run's index entry is left: %s", m.Data)
	}
}

func TestApprovalDenyGivesTheModelTheReason(t *testing.T) {
	t.Parallel()
	_, c, d := approvalWorker(t, Config{})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "deny", "reason": "freeze week", "by": "bob"})
	if res := re.waitFor(t, bus.EventToolApprovalResolved, 1).Approval; res.Decision != bus.DecisionDeny || res.Reason != "freeze week" {
		t.Fatalf("resolved %+v", res)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v (a denial is the model's to handle)", fin)
	}
	res := toolResults(t, c, run)["c1"]
	if !res.IsError || !strings.Contains(res.TextOf(), "freeze week") || !strings.Contains(res.TextOf(), "bob") {
		t.Fatalf("tool result %+v", res)
	}
	if d.targets() != "" {
		t.Fatalf("a denied call ran: %q", d.targets())
	}
}

func TestApprovalEditedArgumentsInvalidThenValid(t *testing.T) {
	t.Parallel()
	_, c, d := approvalWorker(t, Config{})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	bad := sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "arguments": map[string]any{"target": map[string]any{"env": "prod"}}})
	rej := re.waitFor(t, bus.EventToolApprovalRejected, 1).Approval
	if rej.ControlSeq != bad || rej.Reason == "" {
		t.Fatalf("rejected %+v, want controlSeq %d and a reason", rej, bad)
	}
	if n := re.count(bus.EventToolApprovalResolved); n != 0 {
		t.Fatalf("%d resolved after an invalid edit; the call must stay pending", n)
	}
	good := sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "arguments": map[string]any{"target": "staging"}})
	// The resolution shows the edit the call runs with (since 1.8).
	if res := re.waitFor(t, bus.EventToolApprovalResolved, 1).Approval; res.ControlSeq != good || res.Decision != bus.DecisionApprove ||
		fmt.Sprint(res.Arguments) != "map[target:staging]" {
		t.Fatalf("resolved %+v", res)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	if d.targets() != "staging" {
		t.Fatalf("deploy ran with %q, want the edit", d.targets())
	}
}

// An approver's edit to no arguments at all ({}, for a tool whose
// arguments are all optional) is an edit: the call runs with {}, and the
// resolution shows "arguments":{} (omitempty dropped an empty map, so the
// event read as approved unedited and the answer sent by bus.Client.Answer
// lost its edit).
func TestApprovalEditToNoArgumentsIsShown(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var ran []string
	probe := agent.NewTool("probe", "probes", func(_ context.Context, a struct {
		Target string `json:"target,omitempty"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		mu.Lock()
		ran = append(ran, "target="+a.Target)
		mu.Unlock()
		return agent.TextResult("probed"), nil
	})
	_, c := startInternal(t, Config{Tools: []*agent.Tool{probe}}, nil)
	run := submitRun(t, c, &bus.RunRequest{Prompt: "probe", Tools: []string{"probe"}, Model: fauxModel,
		Approval: &bus.Approval{Tools: []string{"probe"}},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.ToolCall("c1", "probe", map[string]any{"target": "prod"})}, StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text("done")}}}}})
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seq, err := c.Answer(ctx, run, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove, Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	res := re.waitFor(t, bus.EventToolApprovalResolved, 1).Approval
	if res.ControlSeq != seq || res.Arguments == nil || len(res.Arguments) != 0 {
		t.Fatalf("resolved %+v, want the edit to {} shown", res)
	}
	if b, _ := json.Marshal(res); !strings.Contains(string(b), `"arguments":{}`) {
		t.Fatalf("resolved encodes as %s, want \"arguments\":{}", b)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(ran, ",") != "target=" {
		t.Fatalf("probe ran with %q, want the edit (no target)", ran)
	}
}

func TestApprovalTimeoutDenies(t *testing.T) {
	t.Parallel()
	_, c, d := approvalWorker(t, Config{})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}, TimeoutSeconds: 1}, "prod"))
	re := followRun(t, c, run)
	if res := re.waitFor(t, bus.EventToolApprovalResolved, 1).Approval; res.Decision != bus.DecisionTimeout {
		t.Fatalf("resolved %+v", res)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	if res := toolResults(t, c, run)["c1"]; !res.IsError || !strings.Contains(res.TextOf(), "not approved within") {
		t.Fatalf("tool result %+v", res)
	}
	if d.targets() != "" {
		t.Fatal("a timed-out call ran")
	}
}

func TestApprovalTimeoutAborts(t *testing.T) {
	t.Parallel()
	_, c, _ := approvalWorker(t, Config{})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}, TimeoutSeconds: 1, OnTimeout: "abort"}, "prod"))
	re := followRun(t, c, run)
	if fin := re.finished(t); fin.Status != bus.StatusAborted || fin.Reason != bus.ReasonApprovalTimeout {
		t.Fatalf("finished %+v, want aborted/approval_timeout", fin)
	}
	if re.count(bus.EventToolApprovalResolved) != 1 {
		t.Fatalf("events %s", re.types())
	}
}

func TestApprovalAbortWhileWaitingEndsTheRunAtOnce(t *testing.T) {
	t.Parallel()
	_, c, d := approvalWorker(t, Config{})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := c.Abort(ctx, run, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	if fin := re.finished(t); fin.Status != bus.StatusAborted || fin.Reason != bus.ReasonAbortedByUser {
		t.Fatalf("finished %+v", fin)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the abort took %s", took)
	}
	if d.targets() != "" || re.count(bus.EventToolApprovalResolved) != 0 {
		t.Fatalf("deploy %q, events %s", d.targets(), re.types())
	}
}

// Two gated calls of one parallel batch ask together; each answer goes to
// its call, whatever the order.
func TestApprovalParallelCallsAnsweredInOppositeOrder(t *testing.T) {
	t.Parallel()
	_, c, d := approvalWorker(t, Config{})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"*"}}, "one", "two"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 2)
	waitRecord(t, c, run, "waiting for both", func(r *bus.RunRecord) bool { return waitingFor(r, "c1", "c2") })
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c2", "decision": "approve"})
	first := re.waitFor(t, bus.EventToolApprovalResolved, 1).Approval
	if first.ToolCallID != "c2" {
		t.Fatalf("first resolved %+v, want c2", first)
	}
	waitRecord(t, c, run, "waiting for c1 only", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "deny", "reason": "not one"})
	if second := re.waitFor(t, bus.EventToolApprovalResolved, 2).Approval; second.ToolCallID != "c1" || second.Decision != bus.DecisionDeny {
		t.Fatalf("second resolved %+v", second)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	if d.targets() != "two" {
		t.Fatalf("deploy ran with %q, want two only", d.targets())
	}
}

// Time spent waiting does not count against limits.timeoutSeconds.
func TestApprovalWaitNotCountedInTheTimeout(t *testing.T) {
	t.Parallel()
	_, c, d := approvalWorker(t, Config{HeartbeatInterval: 300 * time.Millisecond})
	req := gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod")
	req.Limits = &bus.Limits{TimeoutSeconds: 1}
	run := submitRun(t, c, req)
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	rec := waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	// Wait well past the timeout, on the record's own clock: a heartbeat
	// written 2s after the run started.
	waitRecord(t, c, run, "2s into its wait", func(r *bus.RunRecord) bool {
		return r.HeartbeatAt.Sub(rec.StartedAt) > 2*time.Second || r.Finished()
	})
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v: the wait counted against the timeout", fin)
	}
	final := waitRecord(t, c, run, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
	if final.WaitedMs < 1500 || d.targets() != "prod" {
		t.Fatalf("waitedMs %d, deploy %q", final.WaitedMs, d.targets())
	}
}

// In sequential mode each gated call asks when it is reached.
func TestApprovalSequentialAsksOneAtATime(t *testing.T) {
	t.Parallel()
	_, c, d := approvalWorker(t, Config{})
	req := gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "one", "two")
	req.ToolExecution = agent.ExecutionSequential
	run := submitRun(t, c, req)
	re := followRun(t, c, run)
	if a := re.waitFor(t, bus.EventToolApprovalRequested, 1).Approval; a.ToolCallID != "c1" {
		t.Fatalf("first request %+v", a)
	}
	waitRecord(t, c, run, "waiting for c1", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	if n := re.count(bus.EventToolApprovalRequested); n != 1 {
		t.Fatalf("%d requests before the first answer: %s", n, re.types())
	}
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	if a := re.waitFor(t, bus.EventToolApprovalRequested, 2).Approval; a.ToolCallID != "c2" {
		t.Fatalf("second request %+v", a)
	}
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c2", "decision": "approve"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded || d.targets() != "one,two" {
		t.Fatalf("finished %+v, deploy %q", fin, d.targets())
	}
	if got := re.types(); !strings.Contains(got, "tool_execution_end:c1 tool_execution_start:c2 tool_approval_requested:c2") {
		t.Fatalf("events %s", got)
	}
}

// Steering sent while a call waits is taken after the batch resolves.
func TestApprovalSteeringWaitsForTheBatch(t *testing.T) {
	t.Parallel()
	o := ctlObs{got: make(chan string, 10)}
	_, c, _ := approvalWorker(t, Config{Observer: o})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Steer(ctx, run, "use staging next time"); err != nil {
		t.Fatal(err)
	}
	within(t, o.got, 10*time.Second, "the steer taken")
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	tr, err := c.LoadTranscript(ctx2, run)
	if err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, m := range tr.Messages {
		roles = append(roles, m.Role)
	}
	if got := strings.Join(roles, ","); got != "user,assistant,toolResult,user,assistant" {
		t.Fatalf("transcript roles %s: the steer must come after the batch's results", got)
	}
}

func TestApprovalMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, metrics.Config{Tools: []string{"deploy"}})
	_, c, _ := approvalWorker(t, Config{Observer: MetricsObserver(m)})
	value := func(name, label string) float64 {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
			for _, s := range f.GetMetric() {
				if label != "" && (len(s.GetLabel()) == 0 || s.GetLabel()[0].GetValue() != label) {
					continue
				}
				switch {
				case s.Counter != nil:
					return s.Counter.GetValue()
				case s.Gauge != nil:
					return s.Gauge.GetValue()
				case s.Histogram != nil:
					return float64(s.Histogram.GetSampleCount())
				}
			}
		}
		return -1
	}
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	if v := value("agentfleet_runs_waiting", ""); v != 1 {
		t.Fatalf("runs_waiting %v while waiting", v)
	}
	if v := value("agentfleet_approvals_requested_total", ""); v != 1 {
		t.Fatalf("approvals_requested_total %v", v)
	}
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	re.finished(t)
	for name, want := range map[string]float64{"agentfleet_runs_waiting": 0, "agentfleet_approval_wait_seconds": 1} {
		if v := value(name, ""); v != want {
			t.Errorf("%s %v, want %v", name, v, want)
		}
	}
	if v := value("agentfleet_approvals_resolved_total", "approve"); v != 1 {
		t.Errorf("approvals_resolved_total{decision=approve} %v", v)
	}
}
