package bus

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/natsembed"
	"github.com/nats-io/nats.go/jetstream"
)

// stuckIter passes through its first message, then never delivers again:
// nats.go's ordered consumer after some NATS restarts.
type stuckIter struct {
	jetstream.MessagesContext
	n       int
	stopped chan struct{}
	once    sync.Once
}

func (s *stuckIter) Next(opts ...jetstream.NextOpt) (jetstream.Msg, error) {
	if s.n < 1 {
		s.n++
		return s.MessagesContext.Next(opts...)
	}
	<-s.stopped
	return nil, jetstream.ErrMsgIteratorClosed
}

func (s *stuckIter) Stop() {
	s.once.Do(func() { close(s.stopped) })
	s.MessagesContext.Stop()
}

func stallClient(t *testing.T) (context.Context, *Client, func(seq uint64, ev any)) {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	c, err := Connect(ctx, ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.EnsureStreams(ctx, StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	c.SetFollowStall(50 * time.Millisecond)
	pub := func(seq uint64, ev any) {
		b, _ := json.Marshal(ev)
		if _, err := c.JetStream().Publish(ctx, c.names.Events("r"), (&Envelope{Run: "r", Seq: seq, Attempt: 1, Worker: "w", TS: 1, Event: b}).AppendJSON(nil)); err != nil {
			t.Error(err)
		}
	}
	return ctx, c, pub
}

// A consumer that goes silent while the run's events are stored is
// replaced by one starting after the last delivered event: every event
// arrives once, in order.
func TestFollowReplacesAStalledConsumer(t *testing.T) {
	ctx, c, pub := stallClient(t)
	var wraps atomic.Int32
	c.wrapFollow = func(it jetstream.MessagesContext) jetstream.MessagesContext {
		if wraps.Add(1) > 1 {
			return it
		}
		return &stuckIter{MessagesContext: it, stopped: make(chan struct{})}
	}
	pub(1, RunStarted{Type: EventRunStarted, Attempt: 1})
	pub(2, AgentEvent{Type: "agent_start"})
	pub(3, AgentEvent{Type: "agent_end"})
	pub(4, RunFinished{Type: EventRunFinished, Status: StatusSucceeded})
	var got []uint64
	for e, err := range c.Follow(ctx, "r") {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Seq)
	}
	if len(got) != 4 || got[0] != 1 || got[1] != 2 || got[2] != 3 || got[3] != 4 {
		t.Fatalf("got seqs %v, want [1 2 3 4]", got)
	}
	if n := wraps.Load(); n != 2 {
		t.Fatalf("%d consumers opened, want 2", n)
	}
}

// A follower of an idle run, and one whose loop body is slow, keep their
// consumer: only a consumer that missed stored events is replaced.
func TestFollowKeepsAHealthyConsumer(t *testing.T) {
	ctx, c, pub := stallClient(t)
	var wraps atomic.Int32
	c.wrapFollow = func(it jetstream.MessagesContext) jetstream.MessagesContext {
		wraps.Add(1)
		return it
	}
	pub(1, RunStarted{Type: EventRunStarted, Attempt: 1})
	pub(2, AgentEvent{Type: "agent_start"})
	var got []uint64
	for e, err := range c.Follow(ctx, "r") {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Seq)
		switch e.Seq {
		case 1:
			// A slow body: many stall intervals outside Next.
			time.Sleep(10 * c.followStall)
		case 2:
			// An idle run: the watch looks (and finds nothing missed)
			// while the follower waits, before the next event is stored.
			go func() {
				waitLooks(t, c, 3)
				pub(3, RunFinished{Type: EventRunFinished, Status: StatusSucceeded})
			}()
		}
	}
	if len(got) != 3 {
		t.Fatalf("got seqs %v, want [1 2 3]", got)
	}
	if n := wraps.Load(); n != 1 {
		t.Fatalf("%d consumers opened, want 1", n)
	}
}

// waitLooks waits until the stall watch has asked the stream n more times.
func waitLooks(t *testing.T, c *Client, n int64) {
	start := c.stallLooks.Load()
	deadline := time.Now().Add(30 * time.Second)
	for c.stallLooks.Load() < start+n {
		if time.Now().After(deadline) {
			t.Errorf("the stall watch looked %d times, want %d", c.stallLooks.Load()-start, n)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
