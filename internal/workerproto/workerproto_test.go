package workerproto

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// recEnv builds envelopes for Recover tests.
type recEnv struct {
	t   *testing.T
	out []*bus.Envelope
}

func (b *recEnv) add(attempt int, seq uint64, ev any, opts ...func(*bus.Envelope)) {
	e := env(b.t, "r", attempt, seq, 0, ev)
	for _, o := range opts {
		o(e)
	}
	b.out = append(b.out, e)
}

func ctlSeq(s uint64) func(*bus.Envelope)   { return func(e *bus.Envelope) { e.ControlSeq = s } }
func interrupted() func(*bus.Envelope)      { return func(e *bus.Envelope) { e.Interrupted = true } }
func msgEnd(m agent.Message) bus.AgentEvent { return bus.AgentEvent{Type: "message_end", Message: &m} }

func assistantCalls(ids ...string) agent.Message {
	m := agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonToolUse}
	for _, id := range ids {
		m.Content = append(m.Content, agent.ToolCall(id, "calc", map[string]any{}))
	}
	return m
}

func assistantText(s string, stop agent.StopReason) agent.Message {
	return agent.Message{Role: agent.RoleAssistant, Content: []agent.Content{agent.Text(s)}, StopReason: stop}
}

func toolResult(id, text string, isErr bool) agent.Message {
	return agent.Message{Role: agent.RoleToolResult, ToolCallID: id, ToolName: "calc", Content: []agent.Content{agent.Text(text)}, IsError: isErr}
}

func summary(msgs []agent.Message) string {
	var s []string
	for _, m := range msgs {
		switch m.Role {
		case agent.RoleToolResult:
			s = append(s, "result:"+m.ToolCallID+"="+m.TextOf())
		case agent.RoleAssistant:
			if c := m.ToolCalls(); len(c) > 0 {
				ids := []string{}
				for _, x := range c {
					ids = append(ids, x.ID)
				}
				s = append(s, "calls:"+strings.Join(ids, ","))
			} else {
				s = append(s, "assistant:"+m.TextOf()+"/"+string(m.StopReason))
			}
		default:
			s = append(s, m.Role+":"+m.TextOf())
		}
	}
	return strings.Join(s, " | ")
}

func TestRecover(t *testing.T) {
	started := func(a int) bus.RunStarted { return bus.RunStarted{Type: bus.EventRunStarted, Attempt: a} }
	cases := []struct {
		name      string
		build     func(b *recEnv)
		want      string // restored messages
		synthetic string
		dropped   int
		partial   bool
		ctl       []uint64
		finished  bool
	}{{
		name:  "nothing stored",
		build: func(b *recEnv) {},
	}, {
		name: "crash while streaming: the partial answer never ended",
		build: func(b *recEnv) {
			b.add(1, 1, started(1))
			b.add(1, 2, msgEnd(agent.UserText("q")))
			b.add(1, 3, bus.AgentEvent{Type: "message_start", Message: &agent.Message{Role: agent.RoleAssistant}})
			b.add(1, 4, bus.AgentEvent{Type: "message_update", AssistantMessageEvent: &agent.StreamEvent{Type: agent.StreamTextStart}})
		},
		want:    "user:q",
		partial: true,
	}, {
		// A cluster node died with the prompt's events; later ones were
		// stored, the prompt's re-sends not yet: nothing before the gap
		// but run_started, so nothing is restored (never a transcript
		// without its prompt).
		name: "a gap in an attempt: only its gapless prefix counts",
		build: func(b *recEnv) {
			b.add(1, 1, started(1))
			b.add(1, 4, msgEnd(assistantCalls("a")))
			b.add(1, 5, msgEnd(toolResult("a", "1", false)))
		},
	}, {
		name: "a gap after the prompt: the prompt is restored",
		build: func(b *recEnv) {
			b.add(1, 1, started(1))
			b.add(1, 2, msgEnd(agent.UserText("q")))
			b.add(1, 4, msgEnd(toolResult("a", "1", false)))
		},
		want: "user:q",
	}, {
		name: "drain: the cut-off answer is interrupted and dropped",
		build: func(b *recEnv) {
			b.add(1, 1, started(1))
			b.add(1, 2, msgEnd(agent.UserText("q")))
			b.add(1, 3, msgEnd(assistantText("half", agent.StopReasonAborted)), interrupted())
		},
		want:    "user:q",
		dropped: 1,
	}, {
		name: "crash mid-tools: one result recorded, the other synthesized",
		build: func(b *recEnv) {
			b.add(1, 1, started(1))
			b.add(1, 2, msgEnd(agent.UserText("q")))
			b.add(1, 3, msgEnd(assistantCalls("a", "b")))
			b.add(1, 4, msgEnd(toolResult("a", "1", false)))
		},
		want:      "user:q | calls:a,b | result:a=1",
		synthetic: "result:b=" + InterruptedToolResult,
	}, {
		name: "drain mid-tool: the cancelled result is interrupted, dropped and synthesized",
		build: func(b *recEnv) {
			b.add(1, 1, started(1))
			b.add(1, 2, msgEnd(agent.UserText("q")))
			b.add(1, 3, msgEnd(assistantCalls("a")))
			b.add(1, 4, msgEnd(toolResult("a", "context canceled", true)), interrupted())
			b.add(1, 5, msgEnd(assistantText("", agent.StopReasonAborted)), interrupted())
		},
		want:      "user:q | calls:a",
		dropped:   2,
		synthetic: "result:a=" + InterruptedToolResult,
	}, {
		name: "steering in the transcript is delivered",
		build: func(b *recEnv) {
			b.add(1, 1, started(1))
			b.add(1, 2, msgEnd(agent.UserText("q")))
			b.add(1, 3, msgEnd(assistantCalls("a")))
			b.add(1, 4, msgEnd(toolResult("a", "1", false)))
			b.add(1, 5, msgEnd(agent.UserText("steer")), ctlSeq(7))
		},
		want: "user:q | calls:a | result:a=1 | user:steer",
		ctl:  []uint64{7},
	}, {
		name: "a stale attempt's late events are left out, the resumed view is kept",
		build: func(b *recEnv) {
			b.add(1, 1, started(1))
			b.add(1, 2, msgEnd(agent.UserText("q")))
			b.add(1, 3, msgEnd(assistantCalls("a")))
			b.add(2, 1, started(2))
			b.add(2, 2, bus.RunResumed{Type: bus.EventRunResumed, Attempt: 2, MessagesRestored: 2})
			b.add(2, 3, msgEnd(toolResult("a", InterruptedToolResult, true)))
			b.add(1, 4, msgEnd(toolResult("a", "late", false))) // stored after attempt 2 started
			b.add(2, 4, msgEnd(assistantText("answer", agent.StopReasonStop)))
		},
		want: "user:q | calls:a | result:a=" + InterruptedToolResult + " | assistant:answer/stop",
	}, {
		name: "an attempt that died before run_resumed does not wipe what earlier attempts did",
		build: func(b *recEnv) {
			b.add(1, 1, started(1))
			b.add(1, 2, msgEnd(agent.UserText("q")))
			b.add(1, 3, msgEnd(assistantCalls("a")))
			b.add(1, 4, msgEnd(toolResult("a", "1", false)))
			b.add(2, 1, started(2)) // killed while reading the events
			b.add(3, 1, started(3)) // and again
		},
		want: "user:q | calls:a | result:a=1",
	}, {
		name: "events re-sent out of order within an attempt are taken in seq order, duplicates once",
		build: func(b *recEnv) {
			b.add(1, 1, started(1))
			b.add(1, 3, msgEnd(assistantText("a", agent.StopReasonStop)))
			b.add(1, 2, msgEnd(agent.UserText("q")))
			b.add(1, 2, msgEnd(agent.UserText("q")))
		},
		want: "user:q | assistant:a/stop",
	}, {
		name: "a finished run",
		build: func(b *recEnv) {
			b.add(1, 1, started(1))
			b.add(1, 2, msgEnd(agent.UserText("q")))
			b.add(1, 3, bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded})
		},
		want:     "user:q",
		finished: true,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := &recEnv{t: t}
			c.build(b)
			rc := Recover(b.out, 5)
			if got := summary(rc.Messages); got != c.want {
				t.Errorf("restored\n got %s\nwant %s", got, c.want)
			}
			if got := summary(rc.Synthetic); got != c.synthetic {
				t.Errorf("synthetic\n got %s\nwant %s", got, c.synthetic)
			}
			for _, m := range rc.Synthetic {
				if !m.IsError || m.Timestamp != 5 {
					t.Errorf("synthetic result %+v", m)
				}
			}
			if rc.Dropped != c.dropped || rc.Partial != c.partial || (rc.Finished != nil) != c.finished {
				t.Errorf("dropped %d partial %v finished %v", rc.Dropped, rc.Partial, rc.Finished != nil)
			}
			if len(rc.ControlSeqs) != len(c.ctl) || (len(c.ctl) > 0 && rc.ControlSeqs[0] != c.ctl[0]) {
				t.Errorf("control seqs %v, want %v", rc.ControlSeqs, c.ctl)
			}
		})
	}
}

func TestEndsWithAnswer(t *testing.T) {
	for _, c := range []struct {
		msgs []agent.Message
		want bool
	}{
		{nil, false},
		{[]agent.Message{agent.UserText("q")}, false},
		{[]agent.Message{agent.UserText("q"), assistantText("a", agent.StopReasonStop)}, true},
		{[]agent.Message{agent.UserText("q"), assistantText("", agent.StopReasonError)}, true},
		{[]agent.Message{agent.UserText("q"), assistantCalls("a")}, false},
		{[]agent.Message{agent.UserText("q"), assistantCalls("a"), toolResult("a", "1", false)}, false},
	} {
		if got := EndsWithAnswer(c.msgs); got != c.want {
			t.Errorf("%s: %v", summary(c.msgs), got)
		}
	}
}

func env(t *testing.T, run string, attempt int, seq uint64, ctl uint64, ev any) *bus.Envelope {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	data := (&bus.Envelope{Run: run, Seq: seq, Attempt: attempt, Worker: "w", TS: 99, ControlSeq: ctl, Event: b}).AppendJSON(nil)
	e, err := bus.DecodeEnvelope(data)
	if err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	return e
}

func TestControlDecode(t *testing.T) {
	at := time.UnixMilli(1234)
	m, err := DecodeUserControl([]byte(`{"text":"go left"}`), at)
	if err != nil || m.Role != agent.RoleUser || m.TextOf() != "go left" || m.Timestamp != 1234 {
		t.Fatalf("%+v %v", m, err)
	}
	m, err = DecodeUserControl([]byte(`{"message":{"role":"user","content":"hi","timestamp":5}}`), at)
	if err != nil || m.TextOf() != "hi" || m.Timestamp != 5 {
		t.Fatalf("%+v %v", m, err)
	}
	for _, bad := range []string{``, `{}`, `{"text":"a","message":{"role":"user","content":"x"}}`,
		`{"message":{"role":"assistant","content":"x"}}`, `{"message":{"role":"user","content":[]}}`, `[1]`, `{"txt":"a"}`} {
		if _, err := DecodeUserControl([]byte(bad), at); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if r := DecodeAbort([]byte(`{"reason":"stop it"}`)); r != "stop it" {
		t.Errorf("abort reason %q", r)
	}
	if r := DecodeAbort(nil); r != "" {
		t.Errorf("empty abort reason %q", r)
	}
	if r := DecodeAbort([]byte("plain words")); r != "plain words" {
		t.Errorf("text abort reason %q", r)
	}
}

func TestNewAgentEventWireForm(t *testing.T) {
	se := agent.StreamEvent{Type: agent.StreamToolCallDelta, ContentIndex: 1, Delta: `{"a":`, Arguments: map[string]any{"a": 1}}
	w := NewAgentEvent(&agent.Event{Type: agent.EventMessageUpdate, StreamEvent: &se, Message: &agent.Message{Role: agent.RoleAssistant}})
	b, _ := json.Marshal(w)
	if string(b) != `{"type":"message_update","assistantMessageEvent":{"type":"toolcall_delta","contentIndex":1,"delta":"{\"a\":"}}` {
		t.Fatalf("%s", b)
	}
	w = NewAgentEvent(&agent.Event{Type: agent.EventToolExecutionEnd, ToolCallID: "c", ToolName: "t", Result: &agent.ToolResult{Content: []agent.Content{agent.Text("r")}}})
	b, _ = json.Marshal(w)
	if string(b) != `{"type":"tool_execution_end","toolCallId":"c","toolName":"t","result":{"content":[{"type":"text","text":"r"}]},"isError":false}` {
		t.Fatalf("%s", b)
	}
}

func TestMsgID(t *testing.T) {
	if MsgID("r", 2, 7) != "r:2:7" {
		t.Fatal(MsgID("r", 2, 7))
	}
}

// The cut-off usage travels: a resume returns the messages it drops (their
// usage is what the calls were charged) and the cutOffUsage of the
// run_resumed its view rests on, also when the newest attempt died before
// it published one.
func TestRecoverCutOffUsage(t *testing.T) {
	started := func(a int) bus.RunStarted { return bus.RunStarted{Type: bus.EventRunStarted, Attempt: a} }
	cutOff := func(in, out int) agent.Message {
		m := assistantText("partial", agent.StopReasonAborted)
		m.Usage = agent.Usage{Input: in, Output: out, TotalTokens: in + out, Cost: agent.Cost{Total: float64(in+out) / 1000}}
		return m
	}
	carried := &agent.Usage{Input: 100, Output: 10, TotalTokens: 110, Cost: agent.Cost{Total: 0.11}}
	b := &recEnv{t: t}
	b.add(1, 1, started(1))
	b.add(1, 2, msgEnd(agent.UserText("q")))
	b.add(1, 3, msgEnd(cutOff(100, 10)), interrupted())
	b.add(2, 1, started(2))
	b.add(2, 2, bus.RunResumed{Type: bus.EventRunResumed, Attempt: 2, MessagesRestored: 1, CutOffUsage: carried})
	b.add(2, 3, msgEnd(cutOff(100, 20)), interrupted())

	rc := Recover(b.out, 5)
	if got := summary(rc.Messages); got != "user:q" {
		t.Fatalf("restored %s", got)
	}
	if rc.CutOffUsage != *carried {
		t.Fatalf("carried %+v, want attempt 2's run_resumed's %+v", rc.CutOffUsage, *carried)
	}
	if len(rc.DroppedMessages) != 1 || rc.DroppedMessages[0].Usage.Output != 20 {
		t.Fatalf("dropped %+v, want attempt 2's cut-off message", rc.DroppedMessages)
	}

	b.add(3, 1, started(3)) // killed before its run_resumed
	rc = Recover(b.out, 5)
	if rc.CutOffUsage != *carried || len(rc.DroppedMessages) != 1 || rc.DroppedMessages[0].Usage.Output != 20 {
		t.Fatalf("after a dead attempt: carried %+v, dropped %+v; want attempt 2's view", rc.CutOffUsage, rc.DroppedMessages)
	}
}

// The compactions a resume goes on from are the view's: a compaction_end
// an attempt stored after a newer attempt's run_started (it lost its
// lease) is not, nor a duplicate; failed ones are there (their usage was
// charged).
func TestRecoverCompactions(t *testing.T) {
	started := func(a int) bus.RunStarted { return bus.RunStarted{Type: bus.EventRunStarted, Attempt: a} }
	end := func(first int, errText string) bus.CompactionEnd {
		return bus.CompactionEnd{Type: bus.EventCompactionEnd, Reason: bus.CompactionThreshold, Summary: "s", FirstKeptIndex: first,
			Error: errText, Usage: &agent.Usage{Input: 10, TotalTokens: 10}}
	}
	b := &recEnv{t: t}
	b.add(1, 1, started(1))
	b.add(1, 2, msgEnd(agent.UserText("q")))
	b.add(1, 3, end(0, "cancelled"))
	b.add(2, 1, started(2))
	b.add(1, 4, end(7, "")) // attempt 1, after attempt 2 started
	b.add(2, 2, bus.RunResumed{Type: bus.EventRunResumed, Attempt: 2, MessagesRestored: 1})
	b.add(2, 3, end(1, ""))
	b.add(2, 3, end(1, "")) // a duplicate
	rc := Recover(b.out, 5)
	if len(rc.Compactions) != 2 || rc.Compactions[0].Error == "" || rc.Compactions[1].FirstKeptIndex != 1 {
		t.Fatalf("compactions %+v, want attempt 1's failed one and attempt 2's", rc.Compactions)
	}
}
