package bus_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// Reading a run's events (ReadEvents, Follow, LoadTranscript) leaves no
// consumer on the events stream: nats-server allows 1,000 per stream by
// default, and a worker resuming thousands of runs reads each one's events.
// More reads than that limit, one after another, all succeed.
func TestEventReadersLeaveNoConsumers(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	for seq, ev := range []any{
		bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1},
		bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded},
	} {
		b, _ := json.Marshal(ev)
		env := &bus.Envelope{Run: "r", Seq: uint64(seq + 1), Attempt: 1, Worker: "w", TS: 1, Event: b}
		if _, err := c.JetStream().Publish(ctx, c.Names().Events("r"), env.AppendJSON(nil)); err != nil {
			t.Fatal(err)
		}
	}
	consumers := func() int {
		s, err := c.JetStream().Stream(ctx, c.Names().EventsStream())
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	envs, err := c.ReadEvents(ctx, "r", 0)
	if err != nil || len(envs) != 2 {
		t.Fatalf("ReadEvents: %d envelopes, %v", len(envs), err)
	}
	if n := consumers(); n != 0 {
		t.Fatalf("after ReadEvents: %d consumers on the events stream, want 0", n)
	}
	tr, err := c.LoadTranscript(ctx, "r")
	if err != nil || !tr.Done() {
		t.Fatalf("LoadTranscript: done %v, %v", tr.Done(), err)
	}
	if n := consumers(); n != 0 {
		t.Fatalf("after LoadTranscript (a Follow): %d consumers on the events stream, want 0", n)
	}
	// 1,100 reads, one after another: on a loaded machine they took over
	// the 30 s of the test's context (27 ms each beside a CI run), and
	// their time is not what is tested; each read still has its own bound.
	for i := range 1100 {
		rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := c.ReadEvents(rctx, "r", 0)
		cancel()
		if err != nil {
			t.Fatalf("read %d: %v", i+1, err)
		}
	}
}

// ReadEvents below a stored event of the run (a resume's run_started) is
// one batched direct get per 512 events (1.10: AGENTS_EVENTS allows
// direct gets), no consumer: 1,200 events, other runs' between them, read
// in order without a consumer create. Below a sequence no event of the
// run reaches (the direct read cannot tell it whole) it falls back to the
// ordered consumer, with the same result.
func TestReadEventsBelowAnEventIsDirect(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	var seqs []uint64
	for i := range 1200 {
		for _, run := range []string{"d", "other"} {
			b, _ := json.Marshal(bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1})
			env := &bus.Envelope{Run: run, Seq: uint64(i + 1), Attempt: 1, Worker: "w", TS: 1, Event: b}
			ack, err := c.JetStream().Publish(ctx, c.Names().Events(run), env.AppendJSON(nil))
			if err != nil {
				t.Fatal(err)
			}
			if run == "d" {
				seqs = append(seqs, ack.Sequence)
			}
		}
	}
	var mu sync.Mutex
	creates := 0
	sub, err := c.Conn().Subscribe("$JS.API.CONSUMER.CREATE."+c.Names().EventsStream()+".>", func(*nats.Msg) {
		mu.Lock()
		creates++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	check := func(envs []*bus.Envelope, err error, want int) {
		t.Helper()
		if err != nil || len(envs) != want {
			t.Fatalf("%d envelopes, want %d: %v", len(envs), want, err)
		}
		for i, e := range envs {
			if e.Run != "d" || e.Seq != uint64(i+1) || e.StreamSeq != seqs[i] {
				t.Fatalf("envelope %d: run %s seq %d at %d, want d %d at %d", i, e.Run, e.Seq, e.StreamSeq, i+1, seqs[i])
			}
		}
	}
	envs, err := c.ReadEvents(ctx, "d", seqs[1100])
	check(envs, err, 1100)
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	n := creates
	mu.Unlock()
	if n != 0 {
		t.Fatalf("%d consumers created for a read below an event of the run", n)
	}
	envs, err = c.ReadEvents(ctx, "d", seqs[len(seqs)-1]+10)
	check(envs, err, 1200)
}
