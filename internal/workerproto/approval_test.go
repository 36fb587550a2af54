package workerproto

import (
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

func approvalEv(typ, id string, f func(*bus.ToolApproval)) bus.ToolApproval {
	a := bus.ToolApproval{Type: typ, ToolCallID: id}
	if f != nil {
		f(&a)
	}
	return a
}

// A gated call asked and not answered stays pending (no synthetic result);
// an answered one without a result gets the synthetic result; the answers
// used are reported.
func TestRecoverPendingApprovals(t *testing.T) {
	b := &recEnv{t: t}
	b.add(1, 1, bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1})
	b.add(1, 2, msgEnd(agent.UserText("go")))
	// An earlier turn with a call c1 that was answered and ran.
	b.add(1, 3, msgEnd(assistantCalls("c1")))
	b.add(1, 4, approvalEv(bus.EventToolApprovalRequested, "c1", func(a *bus.ToolApproval) { a.ExpiresAt = 10 }))
	b.add(1, 5, approvalEv(bus.EventToolApprovalResolved, "c1", func(a *bus.ToolApproval) { a.Decision = "approve"; a.ControlSeq = 3 }))
	b.add(1, 6, bus.AgentEvent{Type: "tool_execution_end", ToolCallID: "c1"})
	b.add(1, 7, msgEnd(toolResult("c1", "ok", false)))
	// This turn: c1 (the id again) waits, c2 was approved and cut off, c3
	// was never gated, c4 got an invalid edit and still waits.
	b.add(1, 8, msgEnd(assistantCalls("c1", "c2", "c3", "c4")))
	b.add(1, 9, approvalEv(bus.EventToolApprovalRequested, "c1", func(a *bus.ToolApproval) { a.ExpiresAt = 500 }))
	b.add(1, 10, approvalEv(bus.EventToolApprovalRequested, "c2", func(a *bus.ToolApproval) { a.ExpiresAt = 600 }))
	b.add(1, 11, approvalEv(bus.EventToolApprovalResolved, "c2", func(a *bus.ToolApproval) { a.Decision = "approve"; a.ControlSeq = 8 }))
	b.add(1, 12, approvalEv(bus.EventToolApprovalRequested, "c4", func(a *bus.ToolApproval) { a.ExpiresAt = 700 }))
	b.add(1, 13, approvalEv(bus.EventToolApprovalRejected, "c4", func(a *bus.ToolApproval) { a.Reason = "bad"; a.ControlSeq = 9 }))
	for i, id := range []string{"c1", "c2", "c3", "c4"} { // a parallel batch: all started (order does not matter here)
		b.add(1, uint64(14+i), bus.AgentEvent{Type: "tool_execution_start", ToolCallID: id})
	}
	rc := Recover(b.out, 1000)
	var pending []string
	for _, p := range rc.Pending {
		pending = append(pending, p.Call.ID)
		if p.Call.ID == "c1" && (p.Approval.ExpiresAt != 500 || p.Approval.RequestedAt != 99) {
			t.Errorf("c1 pending %+v: want this turn's request", p.Approval)
		}
	}
	if got := strings.Join(pending, ","); got != "c1,c4" {
		t.Fatalf("pending %s, want c1,c4", got)
	}
	var synthetic []string
	for _, m := range rc.Synthetic {
		synthetic = append(synthetic, m.ToolCallID)
	}
	if got := strings.Join(synthetic, ","); got != "c2,c3" {
		t.Fatalf("synthetic results for %s, want c2,c3", got)
	}
	if got := rc.AnsweredSeqs; len(got) != 3 || got[0] != 3 || got[1] != 8 || got[2] != 9 {
		t.Fatalf("answered seqs %v", got)
	}
}

// A sequential batch stopped at a waiting call: the calls after it that
// never started are deferred (no synthetic result). A parallel sibling
// that ended keeps its result; one whose end was interrupted does not.
func TestRecoverDeferredCallsAndEndedResults(t *testing.T) {
	b := &recEnv{t: t}
	b.add(1, 1, bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1})
	b.add(1, 2, msgEnd(agent.UserText("go")))
	b.add(1, 3, msgEnd(assistantCalls("c0", "c1", "c2", "c3")))
	b.add(1, 4, bus.AgentEvent{Type: "tool_execution_start", ToolCallID: "c0"})
	b.add(1, 5, bus.AgentEvent{Type: "tool_execution_end", ToolCallID: "c0", Result: &agent.ToolResult{Content: []agent.Content{agent.Text("zero")}}})
	b.add(1, 6, msgEnd(toolResult("c0", "zero", false)))
	b.add(1, 7, bus.AgentEvent{Type: "tool_execution_start", ToolCallID: "c1"})
	b.add(1, 8, approvalEv(bus.EventToolApprovalRequested, "c1", func(a *bus.ToolApproval) { a.ExpiresAt = 500 }))
	rc := Recover(b.out, 1000)
	var deferred []string
	for _, c := range rc.Deferred {
		deferred = append(deferred, c.ID)
	}
	if len(rc.Pending) != 1 || rc.Pending[0].Call.ID != "c1" || strings.Join(deferred, ",") != "c2,c3" || len(rc.Synthetic) != 0 {
		t.Fatalf("pending %+v, deferred %v, synthetic %+v", rc.Pending, deferred, rc.Synthetic)
	}

	yes := true
	b = &recEnv{t: t}
	b.add(1, 1, bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1})
	b.add(1, 2, msgEnd(agent.UserText("go")))
	b.add(1, 3, msgEnd(assistantCalls("c1", "e1", "e2")))
	for i, id := range []string{"c1", "e1", "e2"} {
		b.add(1, uint64(4+i), bus.AgentEvent{Type: "tool_execution_start", ToolCallID: id})
	}
	b.add(1, 7, approvalEv(bus.EventToolApprovalRequested, "c1", func(a *bus.ToolApproval) { a.ExpiresAt = 500 }))
	b.add(1, 8, bus.AgentEvent{Type: "tool_execution_end", ToolCallID: "e1", ToolName: "calc",
		Result: &agent.ToolResult{Content: []agent.Content{agent.Text("one")}}})
	b.add(1, 9, bus.AgentEvent{Type: "tool_execution_end", ToolCallID: "e2", ToolName: "calc", IsError: &yes,
		Result: &agent.ToolResult{Content: []agent.Content{agent.Text("context canceled")}}}, interrupted())
	rc = Recover(b.out, 1000)
	if len(rc.Pending) != 1 || len(rc.Deferred) != 0 || len(rc.Synthetic) != 2 {
		t.Fatalf("pending %+v, deferred %+v, synthetic %+v", rc.Pending, rc.Deferred, rc.Synthetic)
	}
	if m := rc.Synthetic[0]; m.ToolCallID != "e1" || m.IsError || m.TextOf() != "one" || m.Timestamp != 1000 {
		t.Fatalf("e1 %+v, want its ended result", m)
	}
	if m := rc.Synthetic[1]; m.ToolCallID != "e2" || !m.IsError || m.TextOf() != InterruptedToolResult {
		t.Fatalf("e2 %+v, want the synthetic error", m)
	}
}

func TestDecodeApproval(t *testing.T) {
	a, err := DecodeApproval([]byte(`{"toolCallId":"c1","decision":"approve","by":"alice","arguments":{"target":"staging"}}`))
	if err != nil || a.ToolCallID != "c1" || a.Arguments["target"] != "staging" {
		t.Fatalf("%v %+v", err, a)
	}
	for body, want := range map[string]string{
		`{"toolCallId":"c1","decision":"maybe"}`:                `decision "maybe"`,
		`{"toolCallId":"c1","decision":"approve","surprise":1}`: "surprise",
		`not json`:            "approval must be",
		`{"decision":"deny"}`: "toolCallId",
		`{"toolCallId":"c1","decision":"deny","arguments":{"a":1}}`: "only for approve",
	} {
		if _, err := DecodeApproval([]byte(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want it to say %q", body, err, want)
		}
	}
}

// A steer or follow-up an earlier attempt rejected (control_rejected) is
// not taken, nor rejected, again.
func TestRecoverRejectedControls(t *testing.T) {
	b := &recEnv{t: t}
	b.add(1, 1, bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1})
	b.add(1, 2, msgEnd(agent.UserText("go")))
	b.add(1, 3, bus.ControlRejected{Type: bus.EventControlRejected, Kind: bus.KindSteer, Reason: "bad", ControlSeq: 7})
	b.add(1, 4, msgEnd(assistantCalls("c1")))
	if got := Recover(b.out, 1000).AnsweredSeqs; len(got) != 1 || got[0] != 7 {
		t.Fatalf("answered seqs %v, want [7]", got)
	}
}

// The resolved keys span turns and attempts (an answer for one of them
// is dropped by the attempt that resumes); a pending call keeps its
// request's fence and is not among them, even when its key was resolved
// in an earlier turn (ids of a worker before 1.8 may repeat).
func TestRecoverResolvedKeysAndFences(t *testing.T) {
	b := &recEnv{t: t}
	b.add(1, 1, bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1})
	b.add(1, 2, msgEnd(agent.UserText("go")))
	b.add(1, 3, msgEnd(assistantCalls("c1", "s1")))
	b.add(1, 4, approvalEv(bus.EventToolApprovalRequested, "c1", func(a *bus.ToolApproval) { a.ExpiresAt = 10; a.AnswersAfter = 2 }))
	b.add(1, 5, approvalEv(bus.EventToolApprovalResolved, "c1", func(a *bus.ToolApproval) { a.Decision = "timeout" }))
	b.add(1, 6, bus.AgentEvent{Type: "tool_execution_end", ToolCallID: "c1"})
	// s1 asked and was stopped while waiting: its end came without a
	// resolution.
	b.add(1, 7, approvalEv(bus.EventToolApprovalRequested, "s1", func(a *bus.ToolApproval) { a.ExpiresAt = 10; a.AnswersAfter = 2 }))
	b.add(1, 8, bus.AgentEvent{Type: "tool_execution_end", ToolCallID: "s1"})
	b.add(1, 9, msgEnd(toolResult("c1", "not approved", true)))
	b.add(1, 10, msgEnd(toolResult("s1", "stopped", true)))
	b.add(2, 1, bus.RunStarted{Type: bus.EventRunStarted, Attempt: 2})
	b.add(2, 2, msgEnd(assistantCalls("c1-t2-1", "p1", "c1")))
	b.add(2, 3, approvalEv(bus.EventToolApprovalRequested, "c1-t2-1", func(a *bus.ToolApproval) { a.ExpiresAt = 20; a.AnswersAfter = 7 }))
	b.add(2, 4, approvalEv(bus.EventToolApprovalResolved, "c1-t2-1", func(a *bus.ToolApproval) { a.Decision = "deny"; a.ControlSeq = 9 }))
	b.add(2, 5, approvalEv(bus.EventToolApprovalRequested, "p1", func(a *bus.ToolApproval) { a.ExpiresAt = 30; a.AnswersAfter = 11 }))
	b.add(2, 6, approvalEv(bus.EventToolApprovalRequested, "c1", func(a *bus.ToolApproval) { a.ExpiresAt = 30 }))
	rc := Recover(b.out, 1000)
	want := map[string]string{"s1": "ended", "c1-t2-1": "deny"}
	if len(rc.Resolved) != len(want) {
		t.Fatalf("resolved %v, want %v", rc.Resolved, want)
	}
	for k, v := range want {
		if rc.Resolved[k] != v {
			t.Fatalf("resolved %v, want %v", rc.Resolved, want)
		}
	}
	if len(rc.Pending) != 2 || rc.Pending[0].Call.ID != "p1" || rc.Pending[0].AnswersAfter != 11 ||
		rc.Pending[1].Call.ID != "c1" || rc.Pending[1].AnswersAfter != 0 {
		t.Fatalf("pending %+v", rc.Pending)
	}
}

// The keys the run's tool events name are all reported, also those of
// events the view leaves out: after a gap in an attempt, and an older
// attempt's stored after a newer one's run_started (a lost lease).
func TestRecoverUsedKeysIncludeUnrestoredEvents(t *testing.T) {
	b := &recEnv{t: t}
	b.add(1, 1, bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1})
	b.add(1, 2, msgEnd(agent.UserText("go")))
	b.add(1, 3, msgEnd(assistantCalls("a1")))
	b.add(1, 4, bus.AgentEvent{Type: "tool_execution_start", ToolCallID: "a1"})
	// seq 5 lost: what follows is not restored.
	b.add(1, 6, msgEnd(assistantCalls("gap")))
	b.add(1, 7, approvalEv(bus.EventToolApprovalRequested, "gap", func(a *bus.ToolApproval) { a.ExpiresAt = 10 }))
	b.add(2, 1, bus.RunStarted{Type: bus.EventRunStarted, Attempt: 2})
	// Attempt 1, its lease lost, still stores a request and an update.
	b.add(1, 8, approvalEv(bus.EventToolApprovalRequested, "late", func(a *bus.ToolApproval) { a.ExpiresAt = 10 }))
	b.add(1, 9, bus.AgentEvent{Type: "tool_execution_update", ToolCallID: "upd"})
	b.add(2, 2, approvalEv(bus.EventToolApprovalRejected, "rej", func(a *bus.ToolApproval) { a.ControlSeq = 4 }))
	b.add(2, 3, approvalEv(bus.EventToolApprovalResolved, "res", func(a *bus.ToolApproval) { a.Decision = "deny" }))
	b.add(2, 4, bus.AgentEvent{Type: "tool_execution_end", ToolCallID: "end"})
	rc := Recover(b.out, 1000)
	if len(rc.Messages) != 2 {
		t.Fatalf("restored %d messages, want 2 (the prefix before the gap)", len(rc.Messages))
	}
	want := []string{"a1", "gap", "late", "upd", "rej", "res", "end"}
	for _, k := range want {
		if !rc.UsedKeys[k] {
			t.Errorf("key %s not among the used keys %v", k, rc.UsedKeys)
		}
	}
	if len(rc.UsedKeys) != len(want) {
		t.Fatalf("used keys %v, want %v", rc.UsedKeys, want)
	}
}
