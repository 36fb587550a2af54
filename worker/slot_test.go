package worker

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// A finished run gives its slot back once run_finished is stored, before
// its request's ack round trip: with one slot, the next run starts while
// the first one's ack is held.
func TestSlotFreedBeforeTheRequestAck(t *testing.T) {
	t.Parallel()
	g := newTestGate()
	held, unhold := make(chan uint64, 1), make(chan struct{})
	var once sync.Once
	_, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, Concurrency: 1}, func(w *Worker) {
		wrapSends(w, sends{beforeAck: func(requestSeq uint64) {
			once.Do(func() {
				held <- requestSeq
				<-unhold
			})
		}})
	})
	released := sync.OnceFunc(func() { close(unhold) })
	defer released()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	model := &bus.ModelRef{Provider: "faux", ID: "s"}
	first, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "a", Model: model, Faux: fauxTexts("a done")})
	if err != nil {
		t.Fatal(err)
	}
	if got := within(t, held, 20*time.Second, "the first run's request ack"); got != first.Seq {
		t.Fatalf("ack of request %d held, want %d", got, first.Seq)
	}
	if _, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "b", Tools: []string{"gate"}, Model: model, Faux: gateScript("b", "b done")}); err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "the second run's tool while the first run's ack is held")
	released()
	g.release <- struct{}{}
	rec, err := c.Status(ctx, first.ID)
	if err != nil || rec.State != bus.StatusSucceeded {
		t.Fatalf("first run: %+v %v", rec, err)
	}
}

// A pull the server refuses at once (the consumer's MaxWaiting long pulls
// are parked already) is not asked again at once: three idle pull loops
// on a consumer that parks two make a few requests a second, not
// thousands; and the queue's lanes do not turn the long pull into short
// ones.
func TestRefusedPullBacksOff(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	names := c.Names()
	cons, err := c.JetStream().Consumer(ctx, names.RunsStream(), names.Consumer("default"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := cons.CachedInfo().Config
	cfg.MaxWaiting = 2 // fixed at creation: make it again
	if err := c.JetStream().DeleteConsumer(ctx, names.RunsStream(), cfg.Durable); err != nil {
		t.Fatal(err)
	}
	if _, err := c.JetStream().CreateConsumer(ctx, names.RunsStream(), cfg); err != nil {
		t.Fatal(err)
	}
	var pulls, all atomic.Int64 // the queue's consumer's; every consumer's, its lanes' too
	next := "$JS.API.CONSUMER.MSG.NEXT." + names.RunsStream() + "."
	sub, err := c.Conn().Subscribe(next+"*", func(m *nats.Msg) {
		all.Add(1)
		if m.Subject == next+cfg.Durable {
			pulls.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	w, _ := startInternalOn(t, c, Config{Concurrency: 24, SkipEnsureStreams: true, PollWait: 5 * time.Second}, nil)
	if n := w.pullLoops("default"); n != 3 {
		t.Fatalf("%d pull loops, want 3", n)
	}
	<-w.Ready()
	start, startAll := pulls.Load(), all.Load()
	time.Sleep(2 * time.Second) // the span the requests are counted over
	if n := pulls.Load() - start; n > 20 {
		t.Fatalf("%d pull requests in 2 s from idle loops", n)
	}
	// Lanes do not shorten the idle long pull (lanes.go, invariant 4):
	// each loop walks its 4 consumers once and parks a long pull for 5 s
	// (3 x 5), the refused loop walks again once a second (2 x 5): 25.
	// Polling every 250 ms was over 100.
	if n := all.Load() - startAll; n > 40 {
		t.Fatalf("%d pull requests on the queue's consumers, lanes included, in 2 s from idle loops", n)
	}
}

// A run's slot is given back twice, by construction: once its
// run_finished is stored (endings.go) and again when the pull loop's
// goroutine sees the run return. It goes back once: another run's slot is
// not freed by the second. The same holds for a slot taken again after a
// wait without it (waiting.go).
func TestASlotGivenBackTwiceIsGivenBackOnce(t *testing.T) {
	t.Parallel()
	w, err := New(Config{Client: connectTestServer(t), Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	// Two runs in flight, each with the slot the pull loop took for it.
	w.slots <- struct{}{}
	first := w.newSlotHold("default")
	w.slots <- struct{}{}
	second := w.newSlotHold("default")
	first.release()
	first.release()
	if n := len(w.slots); n != 1 {
		t.Fatalf("%d slots taken after a run gave its slot back twice, want 1 (the other run's)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !first.take(ctx) {
		t.Fatal("a free slot was not taken again")
	}
	first.release()
	first.release()
	if n := len(w.slots); n != 1 {
		t.Fatalf("%d slots taken after a slot taken again was given back twice, want 1", n)
	}
	second.release()
	if n := len(w.slots); n != 0 {
		t.Fatalf("%d slots taken once every run gave its slot back, want 0", n)
	}
}

// A slot given back that nobody took (a slot given back twice) panics at
// once, for the shared slots and a queue's own: it does not wait for
// someone to take a slot to give back, which hung the worker until go
// test's timeout.
func TestASlotGivenBackThatWasNotTakenPanicsAtOnce(t *testing.T) {
	t.Parallel()
	w, err := New(Config{Client: connectTestServer(t), Concurrency: 2, Queues: []string{"default", "small"},
		QueueConcurrency: map[string]int{"small": 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		queue, want string
		taken       int // shared slots taken before the release
	}{
		{"default", "worker: a slot given back that was not taken", 0},
		// The shared slot goes back, the queue's own was never taken.
		{"small", "worker: a slot of queue small given back that was not taken", 1},
	} {
		for range c.taken {
			w.slots <- struct{}{}
		}
		panicked := make(chan any, 1)
		go func() {
			defer func() { panicked <- recover() }()
			w.releaseSlots(c.queue, 1)
		}()
		select {
		case p := <-panicked:
			if msg, _ := p.(string); !strings.Contains(msg, c.want) {
				t.Errorf("queue %s: releasing a slot not taken: panic %v, want one saying %q", c.queue, p, c.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("queue %s: releasing a slot not taken still blocks after 5s instead of failing at once", c.queue)
		}
	}
}
