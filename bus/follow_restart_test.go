package bus_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/freeport"
	"github.com/agentfleet/agentfleet/natsembed"
)

// A follower keeps following across a NATS restart: events stored after
// the server came back reach it.
func TestFollowSurvivesNATSRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	port := freeport.Pick(t) // restarted on: see freeport
	srv, err := natsembed.Start(natsembed.Options{Port: port, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	pub := func(seq uint64, ev any) {
		b, _ := json.Marshal(ev)
		for {
			_, err := c.JetStream().Publish(ctx, c.Names().Events("r"), (&bus.Envelope{Run: "r", Seq: seq, Attempt: 1, Worker: "w", TS: 1, Event: b}).AppendJSON(nil))
			if err == nil {
				return
			}
			select { // retry pause while the server is away, not a spin
			case <-ctx.Done():
				t.Fatal(err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	pub(1, bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1})
	got := make(chan uint64, 10)
	go func() {
		defer close(got)
		for e, err := range c.Follow(ctx, "r") {
			if err != nil {
				t.Log(err)
				continue
			}
			got <- e.Seq
		}
	}()
	if s := <-got; s != 1 {
		t.Fatal(s)
	}
	srv.Shutdown()
	time.Sleep(6 * time.Second) // the outage
	srv, err = natsembed.Start(natsembed.Options{Port: port, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	pub(2, bus.AgentEvent{Type: "agent_start"})
	pub(3, bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded})
	for want := uint64(2); want <= 3; want++ {
		if s, ok := <-got; !ok || s != want {
			t.Fatalf("after the restart: got %d (open %v), want %d", s, ok, want)
		}
	}
}
