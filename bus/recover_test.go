package bus

import (
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
)

// recEnv builds envelopes for Recover tests.
type recEnv struct {
	t   *testing.T
	out []*Envelope
}

func (b *recEnv) add(attempt int, seq uint64, ev any, opts ...func(*Envelope)) {
	e := env(b.t, "r", attempt, seq, 0, ev)
	for _, o := range opts {
		o(e)
	}
	b.out = append(b.out, e)
}

func ctlSeq(s uint64) func(*Envelope)   { return func(e *Envelope) { e.ControlSeq = s } }
func interrupted() func(*Envelope)      { return func(e *Envelope) { e.Interrupted = true } }
func msgEnd(m agent.Message) AgentEvent { return AgentEvent{Type: "message_end", Message: &m} }

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
	started := func(a int) RunStarted { return RunStarted{Type: EventRunStarted, Attempt: a} }
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
			b.add(1, 3, AgentEvent{Type: "message_start", Message: &agent.Message{Role: agent.RoleAssistant}})
			b.add(1, 4, AgentEvent{Type: "message_update", AssistantMessageEvent: &agent.StreamEvent{Type: agent.StreamTextStart}})
		},
		want:    "user:q",
		partial: true,
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
			b.add(2, 2, RunResumed{Type: EventRunResumed, Attempt: 2, MessagesRestored: 2})
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
			b.add(1, 3, RunFinished{Type: EventRunFinished, Status: StatusSucceeded})
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

// Nothing belongs to a run after its run_finished (a rejected request that
// reused the id adds events after it).
func TestTranscriptStopsAtRunFinished(t *testing.T) {
	tr := &Transcript{}
	for _, e := range []*Envelope{
		env(t, "r", 1, 1, 0, RunStarted{Type: EventRunStarted, Attempt: 1}),
		env(t, "r", 1, 2, 0, msgEnd(agent.UserText("q"))),
		env(t, "r", 1, 3, 0, RunFinished{Type: EventRunFinished, Status: StatusSucceeded}),
		env(t, "r", 1, 1, 0, RunStarted{Type: EventRunStarted, Attempt: 1}),
		env(t, "r", 1, 2, 0, RunFinished{Type: EventRunFinished, Status: StatusFailed, Reason: ReasonBadRequest}),
	} {
		if err := tr.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	if tr.Finished.Status != StatusSucceeded || len(tr.Messages) != 1 {
		t.Fatalf("%+v %d", tr.Finished, len(tr.Messages))
	}
}
