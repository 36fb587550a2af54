package worker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// attemptEnds reports how each attempt of a worker ended.
type attemptEnds struct {
	NopObserver
	ends chan string
}

func (o attemptEnds) RunFinished(r RunInfo, f bus.RunFinished) {
	o.ends <- fmt.Sprintf("attempt %d finished %s", r.Attempt, f.Status)
}

func (o attemptEnds) RunHandedBack(r RunInfo) {
	o.ends <- fmt.Sprintf("attempt %d handed back", r.Attempt)
}

// Two attempts of one run: the first stalls past AckWait without a
// heartbeat, the request is delivered again, and the second attempt, on
// another worker, takes the lease and finishes the run. Then the first
// comes to its finish, with nothing having told it of the newer attempt
// (no renewal in between): its final record is a compare-and-set on the
// revision it wrote last, refused, and the record keeps the second
// attempt's end.
func TestAStaleAttemptsFinalWriteIsRefusedAndTheRecordKeepsTheNewerEnd(t *testing.T) {
	t.Parallel()
	c, srv := startTestServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c2, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c2.Close)

	const id = "stale-final"
	idle, proceed := make(chan struct{}), make(chan struct{})
	var stalled atomic.Bool
	ends := attemptEnds{ends: make(chan string, 4)}
	// Its one slot held by the stalled attempt, the stale worker takes
	// nothing else; its heartbeat comes after AckWait.
	startInternalOn(t, c, Config{WorkerID: "stale", Concurrency: 1, AckWait: time.Second, HeartbeatInterval: time.Hour,
		Observer: ends}, func(w *Worker) {
		// The agent's last event went out: the run goes idle next.
		wrapSends(w, sends{afterEvent: func(e *bus.Envelope) {
			if e.Type == string(agent.EventAgentEnd) && e.Run == id && stalled.CompareAndSwap(false, true) {
				close(idle)
				<-proceed
			}
		}})
	})
	released := sync.OnceFunc(func() { close(proceed) })
	t.Cleanup(released) // before the stale worker stops
	if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "hi",
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: fauxTexts("hello")}); err != nil {
		t.Fatal(err)
	}
	within(t, idle, 20*time.Second, "the first attempt at its end")
	startInternalOn(t, c2, Config{WorkerID: "newer", AckWait: time.Second}, nil)
	for env, err := range c.Follow(ctx, id) { // up to the second attempt's run_finished
		if err != nil {
			t.Fatal(err)
		}
		if env.Type == bus.EventRunFinished && env.Attempt != 2 {
			t.Fatalf("run_finished of attempt %d, want the second attempt's", env.Attempt)
		}
	}
	newer, err := c.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if newer.State != bus.StatusSucceeded || newer.Attempt != 2 || newer.Worker != "newer" {
		t.Fatalf("record after the second attempt: %+v", newer)
	}

	released()
	if got := within(t, ends.ends, 20*time.Second, "the first attempt's end"); got != "attempt 1 handed back" {
		t.Errorf("the stale attempt ended: %s, want handed back (its final write refused)", got)
	}
	after, err := c.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if after.Revision != newer.Revision || after.Attempt != 2 || after.Worker != "newer" || after.State != bus.StatusSucceeded {
		t.Fatalf("the stale attempt's final write was stored: record %s attempt %d worker %s revision %d, want the second attempt's end %s attempt 2 worker newer revision %d",
			after.State, after.Attempt, after.Worker, after.Revision, newer.State, newer.Revision)
	}
}
