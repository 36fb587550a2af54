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
