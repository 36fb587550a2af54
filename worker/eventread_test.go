package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/eventread"
)

// A read that waits for its slot longer than a read may take still reads:
// its time limit starts with the slot (a worker taking over thousands of
// runs queues most of their resumes). The limit is 2 s, not less: a
// loaded CI took longer than 300 ms for the read itself.
func TestEventReadTimeLimitStartsWithItsSlot(t *testing.T) {
	t.Parallel()
	const limit = 2 * time.Second
	w, c := startInternal(t, Config{}, func(w *Worker) { w.reads.Timeout = limit })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	storeRunStarted(t, ctx, c, "r")
	for range eventread.Max {
		w.reads.Slots <- struct{}{}
	}
	type result struct {
		envs []*bus.Envelope
		err  error
	}
	done := make(chan result, 1)
	go func() {
		envs, err := w.reads.Read(ctx, "r", 0)
		done <- result{envs, err}
	}()
	// Every slot stays taken past the read's limit; the read must still
	// be waiting for one, not failed.
	select {
	case r := <-done:
		t.Fatalf("the read ended while every slot was taken: %d envelopes, %v", len(r.envs), r.err)
	case <-time.After(limit + limit/4):
	}
	<-w.reads.Slots
	r := <-done
	if r.err != nil || len(r.envs) != 1 {
		t.Fatalf("after a slot was freed: %d envelopes, %v; want the run_started", len(r.envs), r.err)
	}
	for range eventread.Max - 1 {
		<-w.reads.Slots
	}
}

// A read refused because the events stream has as many consumers as the
// server allows waits for one to go, within its time limit, instead of
// failing its run (a resume that failed so was handed back, and a burst
// of reads used up the run's deliveries in seconds).
func TestEventReadWaitsForAFreeConsumer(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	storeRunStarted(t, ctx, c, "r")
	s, names := fillEventConsumers(t, ctx, c)
	done := make(chan error, 1)
	go func() {
		envs, err := w.reads.Read(ctx, "r", 0)
		if err == nil && len(envs) != 1 {
			err = fmt.Errorf("%d envelopes, want the run_started", len(envs))
		}
		done <- err
	}()
	// The read must still be waiting while no consumer can be made.
	select {
	case err := <-done:
		t.Fatalf("the read ended while the stream had no room for its consumer: %v", err)
	case <-time.After(time.Second):
	}
	if err := s.DeleteConsumer(ctx, names[0]); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("after a consumer was deleted: %v", err)
	}
}

// fillEventConsumers makes consumers on the events stream up to the
// server's default limit, 16 creations at a time, and returns their names.
func fillEventConsumers(t *testing.T, ctx context.Context, c *bus.Client) (jetstream.Stream, []string) {
	t.Helper()
	s, err := c.Stream(ctx, c.Names().EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		names []string
		full  atomic.Bool
		wg    sync.WaitGroup
	)
	next := atomic.Int64{}
	for range 16 {
		wg.Go(func() {
			for !full.Load() {
				name := fmt.Sprintf("filler%d", next.Add(1))
				_, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: name, FilterSubject: c.Names().Events("filler"), MemoryStorage: true})
				switch {
				case errors.Is(err, jetstream.ErrMaximumConsumersLimit):
					full.Store(true)
				case err != nil:
					t.Error(err)
					full.Store(true)
				default:
					mu.Lock()
					names = append(names, name)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() || len(names) == 0 {
		t.Fatal("the stream's consumers could not be filled")
	}
	return s, names
}

// A read waiting for a free consumer when its context ends (the worker's
// hard stop) says so: its error is the context's, wrapping the refusal,
// so its run is handed back as one at a hard stop.
func TestAnEventReadEndedByItsContextSaysSo(t *testing.T) {
	t.Parallel()
	// Each refusal of the read's consumer, told to the test.
	refused := make(chan struct{}, 64)
	w, c := startInternal(t, Config{}, func(w *Worker) {
		events := w.reads.Events
		w.reads.Events = func(ctx context.Context, id string, before uint64) ([]*bus.Envelope, error) {
			envs, err := events(ctx, id, before)
			if errors.Is(err, jetstream.ErrMaximumConsumersLimit) {
				select {
				case refused <- struct{}{}:
				default:
				}
			}
			return envs, err
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	storeRunStarted(t, ctx, c, "r")
	fillEventConsumers(t, ctx, c)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := w.reads.Read(rctx, "r", 0)
		done <- err
	}()
	// Refused twice: it waited and tried again instead of ending.
	for n := range 2 {
		select {
		case err := <-done:
			t.Fatalf("the read ended while the stream had no room for its consumer (after %d refusals): %v", n, err)
		case <-refused:
		case <-ctx.Done():
			t.Fatalf("the read was refused %d times in a minute, want 2", n)
		}
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) || !errors.Is(err, jetstream.ErrMaximumConsumersLimit) {
		t.Fatalf("the read ended by its context: %v, want context canceled and the refusal", err)
	}
}

// storeRunStarted stores a run_started of attempt 1 for run: a read has
// something to read.
func storeRunStarted(t *testing.T, ctx context.Context, c *bus.Client, run string) {
	t.Helper()
	b, _ := json.Marshal(bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1})
	env := &bus.Envelope{Run: run, Seq: 1, Attempt: 1, Worker: "w", TS: 1, Event: b}
	if _, err := c.JetStream().Publish(ctx, c.Names().Events(run), env.AppendJSON(nil)); err != nil {
		t.Fatal(err)
	}
}
