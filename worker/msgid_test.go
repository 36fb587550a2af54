package worker_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/workerproto"
	"github.com/agentfleet/agentfleet/worker"
)

// An attempt's first event and the run's lifecycle events carry the
// message id "<run>:<attempt>:<seq>" that the stream's duplicate window
// drops a second copy by; the agent's events carry none (protocol 1.4: a
// re-send stores one only right after its predecessor).
func TestLifecycleEventsCarryTheirMessageID(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	id := f.Submit("", &bus.RunRequest{Prompt: "hi", Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.Text("hello <there> & \"you\"")}}})
	envs := f.Follow(id)
	ctx := fleettest.Context(t)
	js, err := jetstream.New(f.Client.Conn())
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, f.Client.Names().EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range envs {
		m, err := s.GetMsg(ctx, e.StreamSeq)
		if err != nil {
			t.Fatal(err)
		}
		want := ""
		switch e.Type {
		case bus.EventRunStarted, bus.EventRunResumed, bus.EventRunFinished:
			want = workerproto.MsgID(id, e.Attempt, e.Seq)
		}
		if got := m.Header.Get(jetstream.MsgIDHeader); got != want {
			t.Fatalf("event %d (%s): Nats-Msg-Id %q, want %q", e.Seq, e.Type, got, want)
		}
		env, err := bus.DecodeEnvelope(m.Data)
		if err != nil || env.Seq != e.Seq || env.Run != id || env.Worker != e.Worker {
			t.Fatalf("stored envelope %s: %+v %v", m.Data, env, err)
		}
	}
}
