package worker

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// A call runs only once its run's events so far are stored: its
// tool_execution_start, the assistant message that made it, and for a
// gated call its tool_approval_resolved. A worker killed while the call
// runs then leaves them behind, and the next attempt does not run the
// call again. Before, they were still on their way (a batch commits every
// 2 ms): under load a kill lost them, and the next attempt asked the
// model again, or took an approved call for one still waiting.

// probeTool is a "deploy" tool that records, for each target, how many
// of its run's events were not stored when the call ran.
type probeTool struct {
	mu       sync.Mutex
	ran      []string // targets, in the order their calls ran
	unstored map[string]int
	// after runs once the call has looked, before it returns.
	after func(target string)
}

func (pt *probeTool) tool() *agent.Tool {
	pt.unstored = map[string]int{}
	return agent.NewTool("deploy", "deploys", func(ctx context.Context, a struct {
		Target string `json:"target"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		n := -1 // not in a run
		if r, ok := ctx.Value(runKey{}).(*run); ok {
			n = r.pub.Unacknowledged()
		}
		pt.mu.Lock()
		pt.ran = append(pt.ran, a.Target)
		pt.unstored[a.Target] = n
		pt.mu.Unlock()
		if pt.after != nil {
			pt.after(a.Target)
		}
		return agent.TextResult("deployed " + a.Target), nil
	})
}

// want fails unless every target ran with all its run's events stored.
func (pt *probeTool) want(t *testing.T, targets ...string) {
	t.Helper()
	pt.mu.Lock()
	defer pt.mu.Unlock()
	want := map[string]int{}
	for _, target := range targets {
		want[target] = 0
	}
	if !maps.Equal(pt.unstored, want) {
		t.Fatalf("events not stored when each call ran: %v, want %v", pt.unstored, want)
	}
}

func (pt *probeTool) targets() string {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return strings.Join(pt.ran, ",")
}

// TestAToolRunsOnlyOnceItsStartIsStored: a parallel batch, both starts
// out before either call runs. Each call looks, then waits until the
// other has looked: neither's end is published while the other looks.
func TestAToolRunsOnlyOnceItsStartIsStored(t *testing.T) {
	t.Parallel()
	pt := &probeTool{}
	var mu sync.Mutex
	looked, both := 0, make(chan struct{})
	pt.after = func(string) {
		mu.Lock()
		if looked++; looked == 2 {
			close(both)
		}
		mu.Unlock()
		select {
		case <-both:
		case <-time.After(20 * time.Second):
			t.Error("the two calls did not run together")
		}
	}
	_, c := startInternal(t, Config{Tools: []*agent.Tool{pt.tool()}, HeartbeatInterval: time.Second}, nil)
	run := submitRun(t, c, &bus.RunRequest{Prompt: "deploy", Tools: []string{"deploy"}, Model: fauxModel, Faux: deployScript("a", "b")})
	wantSucceeded(t, followRun(t, c, run))
	pt.want(t, "a", "b")
}

// TestAnApprovedCallRunsOnlyOnceItsApprovalIsStored: the approval's
// tool_approval_resolved is stored before the call runs (on an attempt
// that took the waiting call over: TestApprovalResumeSequentialRunsTheLaterCalls).
func TestAnApprovedCallRunsOnlyOnceItsApprovalIsStored(t *testing.T) {
	t.Parallel()
	pt := &probeTool{}
	_, c := startInternal(t, Config{Tools: []*agent.Tool{pt.tool()}, HeartbeatInterval: time.Second}, nil)
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	wantSucceeded(t, re)
	pt.want(t, "prod")
}

// TestADeferredCallRunsOnlyOnceItsStartIsStored: an ungated call that
// never started (sequential, after a waiting one) runs on the resumed
// attempt once the waiting call resolves; that attempt publishes its
// start itself, and the call runs only once it is stored.
func TestADeferredCallRunsOnlyOnceItsStartIsStored(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	pt := &probeTool{}
	echo := echoTool(func(context.Context) error { return nil })
	cfg := Config{Tools: []*agent.Tool{pt.tool(), echo}, DrainTimeout: time.Minute, HeartbeatInterval: time.Second}
	_, stopA := startOn(t, c, cfg)
	run := submitRun(t, c, &bus.RunRequest{Prompt: "go", Tools: []string{"echo", "deploy"}, Model: fauxModel,
		ToolExecution: agent.ExecutionSequential, Approval: &bus.Approval{Tools: []string{"echo"}},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{
				agent.ToolCall("c1", "echo", map[string]any{"text": "first"}),
				agent.ToolCall("c2", "deploy", map[string]any{"target": "later"}),
			}, StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text("done")}},
		}}})
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	approveOnTheNextWorker(t, c, cfg, run, stopA)
	wantSucceeded(t, re)
	pt.want(t, "later")
}

// TestACallWhoseRunStopsWhileItWaitsDoesNotRun: the run is aborted while
// its call waits for the run's events to be stored (their acks held):
// the call does not run, and its wait leaves nothing behind.
func TestACallWhoseRunStopsWhileItWaitsDoesNotRun(t *testing.T) {
	t.Parallel()
	pt := &probeTool{}
	w, c := startInternal(t, Config{Tools: []*agent.Tool{pt.tool()}, NoEventBatches: true, PublishAckTimeout: time.Minute,
		HeartbeatInterval: time.Second}, nil)
	var mu sync.Mutex
	holding, held := true, []*nats.Msg(nil)
	routeAcks(t, w, func(m *nats.Msg) *nats.Msg {
		mu.Lock()
		defer mu.Unlock()
		if holding {
			held = append(held, m)
			return nil
		}
		return m
	})
	id := submitRun(t, c, gatedRequest(nil, "prod"))
	var call <-chan struct{} // the call's wait
	var r *run
	until(t, "the call waiting", func() bool {
		w.mu.Lock()
		r = w.runs[id]
		w.mu.Unlock()
		if r == nil {
			return false
		}
		if waits := r.pub.SyncWaits(); len(waits) == 1 {
			call = waits[0]
		}
		return call != nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Abort(ctx, id, "stop"); err != nil {
		t.Fatal(err)
	}
	until(t, "the call's wait given up", func() bool { // the run's finish waits next
		return !slices.Contains(r.pub.SyncWaits(), call)
	})
	mu.Lock()
	holding = false
	for _, m := range held {
		w.events.Acks.Apply(m)
	}
	mu.Unlock()
	if _, fin := followToFinished(ctx, t, c, id); fin.Status != bus.StatusAborted {
		t.Fatalf("run %s/%s, want aborted", fin.Status, fin.Reason)
	}
	pt.want(t) // none ran
	// Events stored as the run stopped: the call does not run either.
	stopped, stop := context.WithCancel(context.WithValue(context.Background(), runKey{}, r))
	stop()
	if err := r.storedBeforeTheCall(stopped); err == nil {
		t.Fatal("a call of a stopped run would run")
	}
}

// until polls ok until it holds, for at most 20 s.
func until(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20 s for %s", what)
		}
	}
}
