package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// A finished run gives its slot back once run_finished is stored, before
// its request's ack round trip: with one slot, the next run starts while
// the first one's ack is held.
func TestSlotFreedBeforeTheRequestAck(t *testing.T) {
	g := newTestGate()
	held, unhold := make(chan string, 1), make(chan struct{})
	var once sync.Once
	_, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, Concurrency: 1}, func(w *Worker) {
		w.beforeRequestAck = func(run string) {
			once.Do(func() {
				held <- run
				<-unhold
			})
		}
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
	if got := within(t, held, 20*time.Second, "the first run's request ack"); got != first.ID {
		t.Fatalf("ack of %s held, want %s", got, first.ID)
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
