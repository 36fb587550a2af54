package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker"
)

// A parent's attempt dies after its child's request is stored and before
// the call's tool_execution_update names the child: the resumed call's
// update and result name it (details.childRunId), so follow --tree and
// the console list the child.
func TestChildNamedAfterAttemptDiesBeforeUpdate(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	stored := make(chan string, 1)
	cfg := worker.WithChildStored(worker.Config{Concurrency: 1, AckWait: time.Second, HeartbeatInterval: 250 * time.Millisecond},
		func(ctx context.Context, child string) {
			select {
			case stored <- child:
			default:
			}
			<-ctx.Done() // the attempt dies here
		})
	kill := killable(f, cfg)
	parent := f.Submit("", fanOut(1, 0, nil))
	child := childID(t, f.Client, parent, "k0")
	select {
	case got := <-stored:
		if got != child {
			t.Fatalf("stored child %s, want %s", got, child)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the child was not stored")
	}
	kill()
	f.StartWorker(worker.Config{Concurrency: 4, AckWait: time.Second, HeartbeatInterval: 250 * time.Millisecond})
	if fin := f.WaitFinished(parent); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	var update, end, result bool
	attempts := map[int]bool{}
	for _, env := range f.Follow(parent) {
		attempts[env.Attempt] = true
		var ev bus.AgentEvent
		if err := json.Unmarshal(env.Event, &ev); err != nil {
			t.Fatal(err)
		}
		switch env.Type {
		case string(agent.EventToolExecutionUpdate):
			if id, _ := bus.ChildRunIDOf(&ev); id == child {
				update = true
			}
		case string(agent.EventToolExecutionEnd):
			if id, _ := bus.ChildRunIDOf(&ev); id == child {
				end = true
			} else {
				t.Errorf("attempt %d: tool_execution_end names child %q, want %s", env.Attempt, id, child)
			}
		case string(agent.EventMessageEnd):
			if m := ev.Message; m != nil && m.Role == agent.RoleToolResult {
				var d map[string]string
				_ = json.Unmarshal(m.Details, &d)
				result = d[bus.ChildRunIDDetail] == child
			}
		}
	}
	if len(attempts) < 2 {
		t.Fatalf("attempts %v: the first did not die", attempts)
	}
	if !update || !end || !result {
		t.Fatalf("child %s named in: update %v, tool_execution_end %v, toolResult %v", child, update, end, result)
	}
}
