package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// With the worker's only slot parked in the idle long pull, an answered
// run gets it back within offSlotPollWait, not PollWait.
func TestApprovalAnsweredRunGetsTheIdlePullsSlot(t *testing.T) {
	t.Parallel()
	_, c, d := approvalWorker(t, Config{Concurrency: 1, PollWait: 20 * time.Second})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	start := time.Now()
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	re.waitFor(t, bus.EventToolApprovalResolved, 1)
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the answered run waited %s for the slot of an idle pull (PollWait 20s)", took)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded || d.targets() != "prod" {
		t.Fatalf("finished %+v, deploy %q", fin, d.targets())
	}
}

// A call that times out with onTimeout abort ends its run without taking a
// slot: the only slot is held by another run meanwhile.
func TestApprovalTimeoutAbortNeedsNoSlot(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	block := agent.NewTool("block", "blocks", func(ctx context.Context, _ struct{}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return agent.TextResult("done"), nil
	})
	_, c, _ := approvalWorker(t, Config{Concurrency: 1, Tools: []*agent.Tool{block}})
	t.Cleanup(func() { close(release) }) // before the worker's stop
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}, TimeoutSeconds: 2, OnTimeout: "abort"}, "prod"))
	re := followRun(t, c, run)
	waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	other := submitRun(t, c, &bus.RunRequest{Prompt: "block", Tools: []string{"block"}, Model: fauxModel,
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.ToolCall("b1", "block", map[string]any{})}, StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text("done")}}}}})
	followRun(t, c, other).waitFor(t, string(agent.EventToolExecutionStart), 1) // it holds the slot
	if fin := re.finished(t); fin.Status != bus.StatusAborted || fin.Reason != bus.ReasonApprovalTimeout {
		t.Fatalf("finished %+v; events %s", fin, re.types())
	}
}

// An invalid answer for a waiting call is rejected with the reason
// (tool_approval_rejected); the call goes on waiting.
func TestApprovalInvalidAnswerForAWaitingCallIsRejected(t *testing.T) {
	t.Parallel()
	_, c, d := approvalWorker(t, Config{})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	sendAnswer(t, c, run, map[string]any{"toolCallId": "nobody", "decision": "maybe"}) // no waiting call: only logged
	seq := sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "maybe"})
	if rej := re.waitFor(t, bus.EventToolApprovalRejected, 1).Approval; rej.ToolCallID != "c1" || rej.ControlSeq != seq ||
		!strings.Contains(rej.Reason, `decision "maybe"`) {
		t.Fatalf("rejected %+v", rej)
	}
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded || d.targets() != "prod" {
		t.Fatalf("finished %+v, deploy %q", fin, d.targets())
	}
	if n := re.count(bus.EventToolApprovalRejected); n != 1 {
		t.Fatalf("%d rejections; events %s", n, re.types())
	}
}

// A worker with one slot finishes another run while a run waits.
func TestApprovalWaitingRunLeavesItsSlot(t *testing.T) {
	t.Parallel()
	w, c, _ := approvalWorker(t, Config{Concurrency: 1})
	waiting := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, waiting)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	other := submitRun(t, c, &bus.RunRequest{Prompt: "hi", Model: fauxModel, Faux: fauxTexts("hello")})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := c.LoadTranscript(ctx, other)
	if err != nil || tr.Finished == nil || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("the other run: %v %+v", err, tr.Finished)
	}
	if w.OffSlot() != 1 {
		t.Fatalf("%d runs off their slot", w.OffSlot())
	}
	sendAnswer(t, c, waiting, map[string]any{"toolCallId": "c1", "decision": "approve"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
}

// Past MaxWaiting a waiting run keeps its slot.
func TestApprovalPastMaxWaitingKeepsTheSlot(t *testing.T) {
	t.Parallel()
	w, c, _ := approvalWorker(t, Config{Concurrency: 1, MaxWaiting: -1})
	waiting := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, waiting)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	waitRecord(t, c, waiting, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	other := submitRun(t, c, &bus.RunRequest{Prompt: "hi", Model: fauxModel, Faux: fauxTexts("hello")})
	oe := followRun(t, c, other)
	// The other run can only start once the slot is free again.
	sendAnswer(t, c, waiting, map[string]any{"toolCallId": "c1", "decision": "approve"})
	re.finished(t)
	oe.finished(t)
	if w.OffSlot() != 0 {
		t.Fatal("a run left its slot")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, _ := c.Status(ctx, waiting)
	b, _ := c.Status(ctx, other)
	if !b.StartedAt.After(a.FinishedAt.Add(-time.Second)) || b.StartedAt.Before(a.StartedAt) {
		t.Fatalf("the other run started at %v, the waiting one ran %v..%v", b.StartedAt, a.StartedAt, a.FinishedAt)
	}
}

// The ungated calls of a batch keep the run's slot while they run: the run
// leaves it only once every running call waits.
func TestApprovalUngatedCallsOfTheBatchKeepTheSlot(t *testing.T) {
	t.Parallel()
	g := newTestGate()
	w, c, d := approvalWorker(t, Config{Concurrency: 1, Tools: []*agent.Tool{g.tool()}})
	req := gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod")
	req.Tools = []string{"deploy", "gate"}
	first := &req.Faux.Responses[0]
	first.Content = append(first.Content, agent.ToolCall("g1", "gate", map[string]any{"name": "x"}))
	run := submitRun(t, c, req)
	re := followRun(t, c, run)
	within(t, g.started, 20*time.Second, "the ungated call")
	waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	if n := w.OffSlot(); n != 0 {
		t.Fatalf("%d runs off their slot while an ungated call of the batch runs", n)
	}
	g.release <- struct{}{}
	other := submitRun(t, c, &bus.RunRequest{Prompt: "hi", Model: fauxModel, Faux: fauxTexts("hello")})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if tr, err := c.LoadTranscript(ctx, other); err != nil || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("the other run: %v", err)
	}
	if re.count(bus.EventToolApprovalResolved) != 0 || w.OffSlot() != 1 {
		t.Fatalf("events %s, %d off slot", re.types(), w.OffSlot())
	}
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded || d.targets() != "prod" {
		t.Fatalf("finished %+v, deploy %q", fin, d.targets())
	}
}
