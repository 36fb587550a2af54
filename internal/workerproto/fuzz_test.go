package workerproto

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

func FuzzDecodeControl(f *testing.F) {
	for _, s := range []string{
		`{"text":"answer in French"}`,
		`{"message":{"role":"user","content":[{"type":"text","text":"x"}],"timestamp":1}}`,
		`{"message":{"role":"assistant","content":[]}}`,
		`{"reason":"stop"}`, `{"text":""}`, `{}`, `{"text":"a","message":{"role":"user","content":"b"}}`, `x`,
		`{"toolCallId":"c1","decision":"approve","by":"a","arguments":{"x":[1,{"y":null}]}}`, `{"toolCallId":"c1","decision":"deny","reason":"no"}`,
	} {
		f.Add([]byte(s))
	}
	stored := time.UnixMilli(1_700_000_000_000)
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeUserControl(data, stored)
		if err == nil {
			if m.Role != "user" {
				t.Fatalf("control became a %q message", m.Role)
			}
			if _, err := json.Marshal(m); err != nil {
				t.Fatalf("accepted message does not encode: %v", err)
			}
		}
		if a, err := DecodeApproval(data); err == nil {
			if len(a.Problems()) > 0 || len(a.By) > bus.MaxApprovalBy {
				t.Fatalf("accepted answer with problems %v", a.Problems())
			}
		}
		reason := DecodeAbort(data)
		if len(reason) > MaxAbortReason+len("…")+4 {
			t.Fatalf("abort reason of %d bytes", len(reason))
		}
	})
}

// FuzzRecoverApprovals folds arbitrary runs of approval events: whatever
// the order, a call left waiting belongs to the last assistant message,
// has no result, and is not among the resolved keys (whose answers a
// resumed attempt drops).
func FuzzRecoverApprovals(f *testing.F) {
	f.Add([]byte{0, 3, 1, 1, 2, 1, 4, 1, 5, 1, 0, 1, 1, 1})
	f.Add([]byte{0, 2, 1, 1, 1, 2, 6, 0, 1, 3, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 200 {
			return
		}
		b := &recEnv{t: t}
		attempt, seq := 1, uint64(1)
		add := func(ev any) {
			b.add(attempt, seq, ev)
			seq++
		}
		add(bus.RunStarted{Type: bus.EventRunStarted, Attempt: attempt})
		add(msgEnd(agent.UserText("go")))
		for i := 0; i+1 < len(ops); i += 2 {
			id := fmt.Sprintf("c%d", ops[i+1]%4)
			switch ops[i] % 7 {
			case 0:
				ids := []string{}
				for j := range int(ops[i+1]%3) + 1 {
					ids = append(ids, fmt.Sprintf("c%d", j))
				}
				add(msgEnd(assistantCalls(ids...)))
			case 1:
				add(bus.ToolApproval{Type: bus.EventToolApprovalRequested, ToolCallID: id, ExpiresAt: 10, AnswersAfter: uint64(ops[i+1])})
			case 2:
				add(bus.ToolApproval{Type: bus.EventToolApprovalResolved, ToolCallID: id, Decision: "deny", ControlSeq: uint64(i + 1)})
			case 3:
				add(bus.AgentEvent{Type: "tool_execution_start", ToolCallID: id})
			case 4:
				add(bus.AgentEvent{Type: "tool_execution_end", ToolCallID: id})
			case 5:
				add(msgEnd(toolResult(id, "r", false)))
			case 6:
				attempt++
				seq = 1
				add(bus.RunStarted{Type: bus.EventRunStarted, Attempt: attempt})
			}
		}
		rc := Recover(b.out, 1000)
		last := -1
		for i, m := range rc.Messages {
			if m.Role == agent.RoleAssistant {
				last = i
			}
		}
		calls := map[string]bool{}
		results := map[string]bool{}
		if last >= 0 {
			for _, c := range rc.Messages[last].ToolCalls() {
				calls[c.ID] = true
			}
			for _, m := range rc.Messages[last+1:] {
				if m.Role == agent.RoleToolResult {
					results[m.ToolCallID] = true
				}
			}
		}
		for _, p := range rc.Pending {
			if !calls[p.Call.ID] || results[p.Call.ID] {
				t.Fatalf("pending %s: not a call of the last message, or it has a result", p.Call.ID)
			}
			if _, ok := rc.Resolved[p.Call.ID]; ok {
				t.Fatalf("pending %s is among the resolved %v", p.Call.ID, rc.Resolved)
			}
		}
		for _, c := range rc.Deferred {
			if _, ok := rc.Resolved[c.ID]; ok {
				t.Fatalf("deferred %s is among the resolved %v", c.ID, rc.Resolved)
			}
		}
	})
}
