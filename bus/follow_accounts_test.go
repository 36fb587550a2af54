package bus_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/rolefleet"
)

// A submitter of deploy/nats/accounts.conf whose follow consumer goes
// silent while the run's events are stored gets them all: its stall watch
// may read the run's last stored event (STREAM.MSG.GET of AGENTS_EVENTS),
// finds the consumer behind and replaces it. Without that permission each
// look was a permissions violation waiting out its timeout, and the
// follower waited for ever.
func TestFollowReplacesAStalledConsumerAsSubmitter(t *testing.T) {
	t.Parallel()
	s := rolefleet.Start(t, "../deploy/nats/accounts.conf")
	wc := s.Connect(t, "worker")
	sub := s.Connect(t, "submitter")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := wc.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	names := wc.Names()
	for seq, ev := range []any{
		bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1},
		bus.AgentEvent{Type: "agent_start"},
		bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded},
	} {
		b, _ := json.Marshal(ev)
		env := &bus.Envelope{Run: "r", Seq: uint64(seq + 1), Attempt: 1, Worker: "w", TS: 1, Event: b}
		if _, err := wc.JetStream().Publish(ctx, names.Events("r"), env.AppendJSON(nil)); err != nil {
			t.Fatal(err)
		}
	}
	sub.SetFollowStall(50 * time.Millisecond)
	wraps := bus.StallFirstConsumer(sub.Client)
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	defer fcancel()
	var got []uint64
	for e, err := range sub.Follow(fctx, "r") {
		if err != nil {
			t.Fatalf("submitter: follow: %v (after %v)", err, got)
		}
		got = append(got, e.Seq)
	}
	if len(got) != 3 || wraps.Load() != 2 {
		t.Fatalf("submitter: got seqs %v from %d consumers, want [1 2 3] from 2", got, wraps.Load())
	}
	for _, line := range s.Log.Lines("Violation") {
		t.Errorf("server: %s", line)
	}
}
