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
