package agent_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/llm/faux"
)

// A message's Tag is the embedder's: a follow-up carries it into the
// events the agent emits and its state, and no JSON of it says it.
func TestATagStaysOnItsMessageAndIsNeverSerialised(t *testing.T) {
	model := faux.New(faux.Options{}, text("one", agent.StopReasonStop), text("two", agent.StopReasonStop))
	a := agent.New(agent.Options{Model: testModel, StreamFn: model.Stream})
	var mu sync.Mutex
	tags := map[string]uint64{} // event type: the follow-up's tag seen
	a.Subscribe(func(_ context.Context, ev agent.Event) error {
		if ev.Message != nil && ev.Message.Role == agent.RoleUser && ev.Message.TextOf() == "later" {
			mu.Lock()
			tags[string(ev.Type)] = ev.Message.Tag
			mu.Unlock()
		}
		return nil
	})
	m := agent.UserText("later")
	m.Tag = 42
	a.FollowUp(m)
	if err := a.Prompt(context.Background(), "go"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if tags[string(agent.EventMessageStart)] != 42 || tags[string(agent.EventMessageEnd)] != 42 {
		t.Fatalf("tags seen on the follow-up's events: %v, want 42 on its start and end", tags)
	}
	var inState bool
	for _, sm := range a.State().Messages {
		if sm.TextOf() == "later" {
			inState = sm.Tag == 42
		}
	}
	if !inState {
		t.Error("the follow-up in the agent's state lost its tag")
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	untagged := m
	untagged.Tag = 0
	plain, err := json.Marshal(untagged)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != string(plain) {
		t.Errorf("the tag was serialised: %s, untagged %s", b, plain)
	}
	var back agent.Message
	if err := json.Unmarshal(b, &back); err != nil || back.Tag != 0 {
		t.Errorf("decoded %+v, %v: a tag from nowhere", back, err)
	}
}
