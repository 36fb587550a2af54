package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
)

// A sequential batch (c1, c2 both gated) handed back while c1 waits: on
// the next attempt c2, which never started, still asks once c1 resolves,
// and runs; it gets no synthetic "worker stopped" result. Each call runs
// once its tool_approval_resolved is stored (toolstart_test.go).
func TestApprovalResumeSequentialRunsTheLaterCalls(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	d := &probeTool{}
	cfg := Config{Tools: []*agent.Tool{d.tool()}, DrainTimeout: time.Minute, HeartbeatInterval: time.Second}
	_, stopA := startOn(t, c, cfg)
	req := gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "one", "two")
	req.ToolExecution = agent.ExecutionSequential
	run := submitRun(t, c, req)
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	approveOnTheNextWorker(t, c, cfg, run, stopA)
	if a := re.waitFor(t, bus.EventToolApprovalRequested, 2).Approval; a.ToolCallID != "c2" {
		t.Fatalf("second request %+v, want c2; events %s", a, re.types())
	}
	waitRecord(t, c, run, "waiting for c2", func(r *bus.RunRecord) bool { return waitingFor(r, "c2") })
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c2", "decision": "approve"})
	wantSucceeded(t, re)
	if d.targets() != "one,two" {
		t.Fatalf("deploy ran %q, want one,two; events %s", d.targets(), re.types())
	}
	d.want(t, "one", "two")
	res := toolResults(t, c, run)
	for id, want := range map[string]string{"c1": "deployed one", "c2": "deployed two"} {
		if m := res[id]; m.IsError || m.TextOf() != want {
			t.Fatalf("%s result %+v, want %q", id, m, want)
		}
	}
}

// approveOnTheNextWorker hands the run, waiting for c1, to a new worker
// (stop ends the first) and approves c1 there.
func approveOnTheNextWorker(t *testing.T, c *bus.Client, cfg Config, run string, stop func()) {
	t.Helper()
	waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	stop()
	startOn(t, c, cfg)
	waitRecord(t, c, run, "waiting on attempt 2", func(r *bus.RunRecord) bool { return r.Attempt >= 2 && waitingFor(r, "c1") })
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
}

// echoRequest is a parallel batch: c1 deploy (gated), e1 echo (not).
func echoRequest(echo *agent.Tool) *bus.RunRequest {
	req := gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod")
	req.Tools = []string{"deploy", echo.Name}
	first := &req.Faux.Responses[0]
	first.Content = append(first.Content, agent.ToolCall("e1", echo.Name, map[string]any{"text": "hi"}))
	return req
}

func echoTool(run func(ctx context.Context) error) *agent.Tool {
	return agent.NewTool("echo", "echoes", func(ctx context.Context, a struct {
		Text string `json:"text"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		if err := run(ctx); err != nil {
			return agent.ToolResult{}, err
		}
		return agent.TextResult("echo " + a.Text), nil
	})
}

// A parallel batch handed back while its gated call waits: the ungated
// call that finished before (its tool_execution_end stored, its toolResult
// message not yet) keeps its real result on the next attempt.
func TestApprovalResumeParallelKeepsAFinishedSiblingsResult(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	d := &deployTool{}
	echo := echoTool(func(context.Context) error { return nil })
	cfg := Config{Tools: []*agent.Tool{d.tool(), echo}, DrainTimeout: time.Minute, HeartbeatInterval: time.Second}
	_, stopA := startOn(t, c, cfg)
	run := submitRun(t, c, echoRequest(echo))
	re := followRun(t, c, run)
	waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	re.waitFor(t, string(agent.EventToolExecutionEnd), 1) // e1 done
	stopA()
	startOn(t, c, cfg)
	waitRecord(t, c, run, "waiting on attempt 2", func(r *bus.RunRecord) bool { return r.Attempt >= 2 && waitingFor(r, "c1") })
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	wantSucceeded(t, re)
	res := toolResults(t, c, run)
	if m := res["e1"]; m.IsError || m.TextOf() != "echo hi" {
		t.Fatalf("e1 result %+v, want its real one; events %s", m, re.types())
	}
	if m := res["c1"]; m.IsError || m.TextOf() != "deployed prod" {
		t.Fatalf("c1 result %+v", m)
	}
}

// A drain while the gated call waits lets the ungated sibling still
// running finish (within DrainTimeout) instead of cancelling it: its
// result is kept for the next attempt.
func TestApprovalHandBackLetsRunningSiblingsFinish(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	d := &deployTool{}
	var wA *Worker
	started := make(chan struct{}, 1)
	echo := echoTool(func(ctx context.Context) error {
		r, _ := ctx.Value(runKey{}).(*run)
		if r == nil || r.w != wA {
			return nil // a later attempt's
		}
		started <- struct{}{}
		<-r.w.drainCtx().Done()
		// Cancelled by the hand-back, or waited for by it.
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return errors.New("cancelled by the hand-back")
			case <-tick.C:
			}
			r.wait.mu.Lock()
			waited := r.wait.idle != nil
			r.wait.mu.Unlock()
			if waited {
				return nil
			}
		}
	})
	cfg := Config{Tools: []*agent.Tool{d.tool(), echo}, DrainTimeout: time.Minute, HeartbeatInterval: time.Second}
	wA, stopA := startOn(t, c, cfg)
	run := submitRun(t, c, echoRequest(echo))
	re := followRun(t, c, run)
	<-started
	approveOnTheNextWorker(t, c, cfg, run, stopA)
	wantSucceeded(t, re)
	if m := toolResults(t, c, run)["e1"]; m.IsError || m.TextOf() != "echo hi" {
		t.Fatalf("e1 result %+v, want its real one; events %s", m, re.types())
	}
}

// Calls a resumed attempt waits for again publish their results as each
// resolves, not once the whole batch has: a drain meanwhile keeps them.
func TestApprovalResumedCallsPublishEachResultAtOnce(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	d := &deployTool{}
	cfg := Config{Tools: []*agent.Tool{d.tool()}, DrainTimeout: time.Minute, HeartbeatInterval: time.Second}
	_, stopA := startOn(t, c, cfg)
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "one", "two"))
	re := followRun(t, c, run)
	waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1", "c2") })
	stopA()
	_, stopB := startOn(t, c, cfg)
	waitRecord(t, c, run, "waiting on attempt 2", func(r *bus.RunRecord) bool { return r.Attempt >= 2 && waitingFor(r, "c1", "c2") })
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	if e := re.waitFor(t, string(agent.EventToolExecutionEnd), 1).Agent; e.ToolCallID != "c1" {
		t.Fatalf("first tool_execution_end %+v, want c1's; events %s", e, re.types())
	}
	waitRecord(t, c, run, "waiting for c2 only", func(r *bus.RunRecord) bool { return waitingFor(r, "c2") })
	stopB()
	startOn(t, c, cfg)
	waitRecord(t, c, run, "waiting on attempt 3", func(r *bus.RunRecord) bool { return r.Attempt >= 3 && waitingFor(r, "c2") })
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c2", "decision": "approve"})
	wantSucceeded(t, re)
	if d.targets() != "one,two" {
		t.Fatalf("deploy ran %q, want one,two; events %s", d.targets(), re.types())
	}
	res := toolResults(t, c, run)
	if m := res["c1"]; m.IsError || m.TextOf() != "deployed one" {
		t.Fatalf("c1 result %+v; events %s", m, re.types())
	}
}

// wantSucceeded waits for the run's end and wants it succeeded.
func wantSucceeded(t *testing.T, re *runEvents) {
	t.Helper()
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v; events %s", fin, re.types())
	}
}

// A duplicate answer for a resolved call, sent while no worker holds the
// run, is dropped by the attempt that resumes it (the resolved keys come
// from the stored events) and not read again by the one after: it never
// approves the later call with the same id, which waits under its own key.
func TestApprovalResumeKeepsDroppingResolvedKeys(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	d := &deployTool{}
	cfg := Config{Tools: []*agent.Tool{d.tool()}, DrainTimeout: time.Minute, HeartbeatInterval: time.Second}
	_, stopA := startOn(t, c, cfg)
	run := submitRun(t, c, repeatedIDRequest(&bus.Approval{Tools: []string{"deploy"}}, []string{"one"}, []string{"two"}))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "alice"})
	second := re.waitFor(t, bus.EventToolApprovalRequested, 2).Approval
	waitRecord(t, c, run, "waiting for the second call", func(r *bus.RunRecord) bool { return waitingFor(r, second.ToolCallID) })
	stopA()
	waitRecord(t, c, run, "handed back", func(r *bus.RunRecord) bool { return r.WaitingHandBacks > 0 })
	dup := sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "bob"})
	_, stopB := startOn(t, c, cfg)
	if rej := re.rejectedFor(t, dup); rej.ToolCallID != "c1" || !strings.Contains(rej.Reason, "already resolved") {
		t.Fatalf("rejection of the duplicate %+v", rej)
	}
	if second.ToolCallID != "c1-t2-1" {
		t.Fatalf("second request %+v; events %s", second, re.types())
	}
	waitRecord(t, c, run, "waiting on attempt 2", func(r *bus.RunRecord) bool { return r.Attempt >= 2 && waitingFor(r, "c1-t2-1") })
	stopB()
	startOn(t, c, cfg)
	waitRecord(t, c, run, "waiting on attempt 3", func(r *bus.RunRecord) bool { return r.Attempt >= 3 && waitingFor(r, "c1-t2-1") })
	if n := re.count(bus.EventToolApprovalResolved); n != 1 || d.targets() != "one" {
		t.Fatalf("%d resolved, deploy %q: the duplicate approved the later call; events %s", n, d.targets(), re.types())
	}
	deny := sendAnswer(t, c, run, map[string]any{"toolCallId": "c1-t2-1", "decision": "deny"})
	if res := re.waitFor(t, bus.EventToolApprovalResolved, 2).Approval; res.ToolCallID != "c1-t2-1" || res.ControlSeq != deny {
		t.Fatalf("second resolved %+v; events %s", res, re.types())
	}
	wantSucceeded(t, re)
	if d.targets() != "one" || re.count(bus.EventToolApprovalRejected) != 1 {
		t.Fatalf("deploy ran %q; events %s", d.targets(), re.types())
	}
}

// startOn runs a worker on c until the returned stop (a drain) is called.
// handBackTwice stops the worker (stop) while the run waits for c1's
// answer, then starts one on cfg and stops it again the same way: with
// MaxDeliver 2 the request's deliveries are used up by waiting alone.
func handBackTwice(t *testing.T, c *bus.Client, cfg Config, run string, stop func()) {
	t.Helper()
	for i := 1; i <= 2; i++ {
		if i > 1 {
			_, stop = startOn(t, c, cfg)
		}
		waitRecord(t, c, run, fmt.Sprintf("waiting on attempt %d", i), func(r *bus.RunRecord) bool { return r.Attempt >= i && waitingFor(r, "c1") })
		stop()
		waitRecord(t, c, run, "handed back", func(r *bus.RunRecord) bool { return r.WaitingHandBacks > 0 || r.Finished() })
	}
}

func startOn(t *testing.T, c *bus.Client, cfg Config) (*Worker, func()) {
	t.Helper()
	cfg.Client = c
	if cfg.PollWait == 0 {
		cfg.PollWait = 200 * time.Millisecond
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case <-w.Ready():
	case err := <-done:
		t.Fatalf("worker stopped before it was ready: %v", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return w, stop
}

// A drained worker hands its waiting run back at once; the next worker
// resumes it still waiting, with the same expiry and no second request.
// answerWhileNone sends the answer while no worker holds the run.
func testApprovalResume(t *testing.T, answerWhileNone bool) {
	c := connectTestServer(t)
	d := &deployTool{}
	cfg := Config{Tools: []*agent.Tool{d.tool()}, DrainTimeout: time.Minute, HeartbeatInterval: time.Second}
	_, stopA := startOn(t, c, cfg)
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	asked := re.waitFor(t, bus.EventToolApprovalRequested, 1).Approval
	before := waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	start := time.Now()
	stopA()
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("the drain took %s: the waiting run held it", took)
	}
	var seq uint64
	if answerWhileNone {
		seq = sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "offline"})
	}
	startOn(t, c, cfg)
	if !answerWhileNone {
		rec := waitRecord(t, c, run, "waiting on a later attempt", func(r *bus.RunRecord) bool { return r.Attempt >= 2 && waitingFor(r, "c1") })
		if got := rec.Waiting.Approvals[0]; got.ExpiresAt != asked.ExpiresAt || !rec.Waiting.Since.Equal(before.Waiting.Since) {
			t.Fatalf("resumed wait %+v since %v; first %+v since %v", got, rec.Waiting.Since, before.Waiting.Approvals[0], before.Waiting.Since)
		}
		seq = sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "later"})
	}
	if res := re.waitFor(t, bus.EventToolApprovalResolved, 1).Approval; res.ControlSeq != seq {
		t.Fatalf("resolved %+v, want controlSeq %d", res, seq)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v; events %s", fin, re.types())
	}
	if n := re.count(bus.EventToolApprovalRequested); n != 1 || d.targets() != "prod" {
		t.Fatalf("%d requests (want 1), deploy %q; events %s", n, d.targets(), re.types())
	}
	res := toolResults(t, c, run)["c1"]
	if res.IsError || res.TextOf() != "deployed prod" {
		t.Fatalf("tool result %+v", res)
	}
}

func TestApprovalResumeKeepsWaiting(t *testing.T) { testApprovalResume(t, false) }

func TestApprovalAnswerWhileNoWorkerHoldsTheRun(t *testing.T) { testApprovalResume(t, true) }

// Drains while a run waits do not use up MaxDeliver: once its deliveries
// run out, the request is requeued and the run goes on waiting.
func TestApprovalHandBacksWhileWaitingDoNotUseUpMaxDeliver(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	d := &deployTool{}
	cfg := Config{Tools: []*agent.Tool{d.tool()}, MaxDeliver: 2, HeartbeatInterval: time.Second}
	_, stop := startOn(t, c, cfg)
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	asked := re.waitFor(t, bus.EventToolApprovalRequested, 1).Approval
	handBackTwice(t, c, cfg, run, stop)
	startOn(t, c, cfg)
	rec := waitRecord(t, c, run, "waiting after the requeue", func(r *bus.RunRecord) bool { return r.Attempt > 2 && waitingFor(r, "c1") || r.Finished() })
	if rec.Finished() || rec.Waiting.Approvals[0].ExpiresAt != asked.ExpiresAt {
		t.Fatalf("after the drains: %+v %+v", rec, rec.Waiting)
	}
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded || d.targets() != "prod" {
		t.Fatalf("finished %+v, deploy %q; events %s", fin, d.targets(), re.types())
	}
	if n := re.count(bus.EventToolApprovalRequested); n != 1 {
		t.Fatalf("%d requests", n)
	}
}

// A worker that vanishes while its run waits (its connection gone, as with
// kill -9): after AckWait another worker resumes the run from the record
// and the events, still waiting with the same expiry, and no new request.
func TestApprovalResumeAfterTheWorkerVanished(t *testing.T) {
	t.Parallel()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir(), MaxMemory: 64 << 20, MaxStore: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	connect := func() *bus.Client {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	d := &deployTool{}
	cfg := Config{Tools: []*agent.Tool{d.tool()}, AckWait: 2 * time.Second, HeartbeatInterval: 300 * time.Millisecond,
		DrainTimeout: time.Second}
	ca, c := connect(), connect()
	startOn(t, ca, cfg)
	req := gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod")
	req.Limits = &bus.Limits{TimeoutSeconds: 1} // the wait, on both workers, is not counted
	run := submitRun(t, c, req)
	re := followRun(t, c, run)
	asked := re.waitFor(t, bus.EventToolApprovalRequested, 1).Approval
	before := waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	ca.Close() // the worker is cut off: no heartbeat, no hand-back
	startOn(t, c, cfg)
	rec := waitRecord(t, c, run, "waiting on a later attempt", func(r *bus.RunRecord) bool { return r.Attempt >= 2 && waitingFor(r, "c1") })
	if got := rec.Waiting.Approvals[0]; got.ExpiresAt != asked.ExpiresAt || got.RequestedAt != before.Waiting.Approvals[0].RequestedAt ||
		!rec.Waiting.Since.Equal(before.Waiting.Since) {
		t.Fatalf("resumed wait %+v since %v; first %+v since %v", got, rec.Waiting.Since, before.Waiting.Approvals[0], before.Waiting.Since)
	}
	seq := sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	if res := re.waitFor(t, bus.EventToolApprovalResolved, 1).Approval; res.ControlSeq != seq {
		t.Fatalf("resolved %+v", res)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded || d.targets() != "prod" {
		t.Fatalf("finished %+v, deploy %q; events %s", fin, d.targets(), re.types())
	}
	if n := re.count(bus.EventToolApprovalRequested); n != 1 {
		t.Fatalf("%d requests", n)
	}
}

// An answer sent after the call expired, while no worker held the run, does
// not approve it: the worker that resumes the run times the call out.
func TestApprovalLateAnswerWhileNoWorkerHoldsTheRun(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	d := &deployTool{}
	cfg := Config{Tools: []*agent.Tool{d.tool()}, HeartbeatInterval: time.Second}
	_, stopA := startOn(t, c, cfg)
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}, TimeoutSeconds: 1}, "prod"))
	re := followRun(t, c, run)
	asked := re.waitFor(t, bus.EventToolApprovalRequested, 1).Approval
	stopA()
	// The expiry is a time: wait for it to pass, then answer.
	<-time.After(time.Until(time.UnixMilli(asked.ExpiresAt)) + 50*time.Millisecond)
	seq := sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctl, err := c.JetStream().Stream(ctx, c.Names().ControlStream())
	if err != nil {
		t.Fatal(err)
	}
	if raw, err := ctl.GetMsg(ctx, seq); err != nil || raw.Time.UnixMilli() <= asked.ExpiresAt {
		t.Fatalf("the answer was stored before the expiry: %v", err)
	}
	startOn(t, c, cfg)
	if res := re.waitFor(t, bus.EventToolApprovalResolved, 1).Approval; res.Decision != bus.DecisionTimeout {
		t.Fatalf("resolved %+v, want timeout (the answer %d came after the expiry)", res, seq)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded || d.targets() != "" {
		t.Fatalf("finished %+v, deploy %q", fin, d.targets())
	}
}
