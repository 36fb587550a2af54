package bus_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

func TestEmbeddedServerAndClient(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	// Idempotent.
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	res, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "hi"})
	if err != nil || res.Duplicate || res.Queue != bus.DefaultQueue {
		t.Fatalf("%+v %v", res, err)
	}
	again, err := c.Submit(ctx, "", &bus.RunRequest{ID: res.ID, Prompt: "hi"})
	if err != nil || !again.Duplicate || again.Seq != res.Seq {
		t.Fatalf("dedupe: %+v %v", again, err)
	}
	if _, err := c.Submit(ctx, "", &bus.RunRequest{}); !bus.IsBadRequest(err) {
		t.Fatalf("invalid request submitted: %v", err)
	}
	if _, err := c.SubmitRaw(ctx, "a.b", "x", nil); err == nil {
		t.Fatal("bad queue accepted")
	}
	rec, err := c.Status(ctx, res.ID)
	if err != nil || rec.State != bus.StateQueued {
		t.Fatalf("%+v %v", rec, err)
	}
	if _, err := c.Status(ctx, "nope"); !errors.Is(err, bus.ErrRunNotFound) {
		t.Fatalf("unknown run: %v", err)
	}
	list, err := c.List(ctx, bus.ListOptions{})
	if err != nil || len(list) != 1 || list[0].ID != res.ID || list[0].State != bus.StateQueued {
		t.Fatalf("%+v %v", list, err)
	}
	// The control stream republishes with the stream sequence.
	sub, err := c.Conn().SubscribeSync(c.Names().Republished())
	if err != nil {
		t.Fatal(err)
	}
	seq, err := c.Steer(ctx, res.ID, "left")
	if err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil || m.Subject != "agents.ctl."+res.ID+".steer" || m.Header.Get("Nats-Sequence") == "" || m.Header.Get("Nats-Last-Sequence") != "0" {
		t.Fatalf("republished %v %+v", err, m)
	}
	if seq == 0 {
		t.Fatal("no control seq")
	}
	if bus.RedactURL("nats://u:secret@h:4222,nats://tok@h2") != "nats://u:REDACTED@h:4222,nats://REDACTED@h2" {
		t.Fatal(bus.RedactURL("nats://u:secret@h:4222,nats://tok@h2"))
	}
}

func TestFollowGapsAndStaleAttempts(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	pub := func(attempt int, seq uint64, ev any) {
		b, _ := json.Marshal(ev)
		if _, err := c.JetStream().Publish(ctx, c.Names().Events("r"), (&bus.Envelope{Run: "r", Seq: seq, Attempt: attempt, Worker: "w", TS: 1, Event: b}).AppendJSON(nil)); err != nil {
			t.Fatal(err)
		}
	}
	pub(1, 1, bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1})
	pub(1, 2, bus.AgentEvent{Type: "agent_start"})
	pub(1, 4, bus.AgentEvent{Type: "turn_start"}) // seq 3 is missing
	pub(2, 1, bus.RunStarted{Type: bus.EventRunStarted, Attempt: 2})
	pub(1, 5, bus.AgentEvent{Type: "turn_end"}) // a stale attempt's late event
	pub(2, 2, bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded})
	pub(2, 3, bus.AgentEvent{Type: "agent_start"}) // after the end: not read
	var got []string
	gaps := 0
	for e, err := range c.Follow(ctx, "r") {
		if err != nil {
			var gap *bus.GapError
			if !errors.As(err, &gap) || gap.Want != 3 || gap.Got != 4 {
				t.Fatalf("error %v", err)
			}
			gaps++
			continue
		}
		got = append(got, fmt.Sprintf("%d:%d:%s", e.Attempt, e.Seq, e.Type))
	}
	want := "1:1:run_started 1:2:agent_start 1:4:turn_start 2:1:run_started 2:2:run_finished"
	if strings.Join(got, " ") != want || gaps != 1 {
		t.Fatalf("got %v (%d gaps), want %s", got, gaps, want)
	}
}
