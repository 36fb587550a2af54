package worker

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
)

// recordReads counts the worker's reads of each run's record.
type recordReads struct {
	mu sync.Mutex
	n  map[string]int
}

func countRecordReads(w *Worker) *recordReads {
	rr := &recordReads{n: map[string]int{}}
	beforeRecordRead(w, func(id string) {
		rr.mu.Lock()
		defer rr.mu.Unlock()
		rr.n[id]++
	})
	return rr
}

func (rr *recordReads) of(id string) int {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return rr.n[id]
}

// A first delivery of a plain request takes its lease with Create and
// reads no record: the read is a round trip on every run's path
// (worker/internal/lease).
func TestFirstDeliveryReadsNoRecord(t *testing.T) {
	t.Parallel()
	var rr *recordReads
	_, c := startInternal(t, Config{}, func(w *Worker) { rr = countRecordReads(w) })
	id := submitRun(t, c, &bus.RunRequest{Prompt: "hi", Model: fauxModel, Faux: fauxTexts("hello")})
	rec := waitRecord(t, c, id, "finished", (*bus.RunRecord).Finished)
	if rec.State != bus.StatusSucceeded || rec.Attempt != 1 {
		t.Fatalf("record: %+v", rec)
	}
	if n := rr.of(id); n != 0 {
		t.Fatalf("the worker read the record %d times", n)
	}
}

// A first delivery that finds a record it may take (here one an earlier
// consumer's attempt 1 left, delivery counts having begun again) does not
// take it unread: it hands the request back, and the redelivery reads it,
// so the run keeps its first start (its timeout counts from it).
func TestFirstDeliveryFindingARecordHandsItBack(t *testing.T) {
	t.Parallel()
	var rr *recordReads
	_, c := startInternal(t, Config{}, func(w *Worker) { rr = countRecordReads(w) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := "left-by-attempt-1"
	began := submitOverALeftRecord(ctx, t, c, id)
	rec := waitRecord(t, c, id, "finished", (*bus.RunRecord).Finished)
	if rec.State != bus.StatusSucceeded || rec.Attempt != 2 || !rec.StartedAt.Equal(began) {
		t.Fatalf("record: %+v (want attempt 2, started %v)", rec, began)
	}
	if n := rr.of(id); n < 2 {
		t.Fatalf("%d record reads: want the first take's and the redelivery's pickup", n)
	}
}

// A queue whose consumer allows only 2 deliveries reads the record at
// every pickup: a hand-back would cost the run half its attempts.
func TestFirstDeliveryReadsWhenDeliveriesAreFew(t *testing.T) {
	t.Parallel()
	var rr *recordReads
	_, c := startInternal(t, Config{MaxDeliver: 2}, func(w *Worker) { rr = countRecordReads(w) })
	id := submitRun(t, c, &bus.RunRequest{Prompt: "hi", Model: fauxModel, Faux: fauxTexts("hello")})
	if rec := waitRecord(t, c, id, "finished", (*bus.RunRecord).Finished); rec.State != bus.StatusSucceeded {
		t.Fatalf("record: %+v", rec)
	}
	if n := rr.of(id); n != 1 {
		t.Fatalf("the worker read the record %d times, want 1 (at pickup)", n)
	}
}

// The rule follows the consumer while the worker runs: once an operator
// lowers MaxDeliver to 1, a first delivery reads the record at pickup.
// Here a record an earlier consumer's attempt 1 left is there: read, it is
// taken and the run succeeds; taken unread, the request would be handed
// back with no delivery left and the run given up. The worker used to
// learn the rule only at its start.
func TestFirstDeliveryReadsOnceDeliveriesAreLowered(t *testing.T) {
	t.Parallel()
	var rr *recordReads
	w, c := startInternal(t, Config{}, func(w *Worker) {
		rr = countRecordReads(w)
		w.pickupReads.every = 20 * time.Millisecond
	})
	<-w.ready
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := c.JetStream().Consumer(ctx, c.Names().RunsStream(), c.Names().Consumer("default"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := cons.CachedInfo().Config
	if !w.pickupReads.skip.Skip("default") {
		t.Fatalf("MaxDeliver %d at the start: first deliveries should skip the read", cfg.MaxDeliver)
	}
	cfg.MaxDeliver = 1
	if _, err := c.JetStream().UpdateConsumer(ctx, c.Names().RunsStream(), cfg); err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for w.pickupReads.skip.Skip("default") {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("the worker did not see MaxDeliver lowered to 1")
		}
	}
	id := "left-by-an-earlier-consumer"
	began := submitOverALeftRecord(ctx, t, c, id)
	rec := waitRecord(t, c, id, "finished", (*bus.RunRecord).Finished)
	if rec.State != bus.StatusSucceeded || rec.Attempt != 1 || !rec.StartedAt.Equal(began) {
		t.Fatalf("record %s/%s attempt %d started %v: want succeeded at attempt 1, started %v", rec.State, rec.Reason, rec.Attempt, rec.StartedAt, began)
	}
	if n := rr.of(id); n != 1 {
		t.Fatalf("%d record reads: want 1, at pickup", n)
	}
}

// submitOverALeftRecord stores the running record an earlier consumer's
// attempt 1 left for run id (started a minute ago, when it returns), then
// submits a request with that id.
func submitOverALeftRecord(ctx context.Context, t *testing.T, c *bus.Client, id string) time.Time {
	t.Helper()
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	b, _ := json.Marshal(bus.RunRecord{ID: id, Queue: "default", State: bus.StateRunning, Attempt: 1, Worker: "gone",
		StartedAt: began, HeartbeatAt: began})
	if _, err := kv.Put(ctx, id, b); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "hi", Model: fauxModel, Faux: fauxTexts("hello")}); err != nil {
		t.Fatal(err)
	}
	return began
}

// A pickup slower than AckWait (its record read held here; in life a
// requeued copy's wait for its binding, slow reads, a lease take of up to
// AckWait) keeps its request owned with InProgress until its run's
// heartbeat starts: the request is not delivered again, and the run is
// attempt 1. Before, nothing kept it until the heartbeat's first beat.
func TestASlowPickupKeepsItsRequest(t *testing.T) {
	t.Parallel()
	const ackWait = 3 * time.Second
	var (
		mu    sync.Mutex
		reads int
	)
	kept := make(chan struct{}, 64) // a +WPI on the queue's acks
	again := make(chan struct{}, 1) // a second pickup read: a redelivery
	hold := make(chan struct{})     // closed: the first read may go on
	w, c := startInternal(t, Config{MaxDeliver: 2, AckWait: ackWait}, func(w *Worker) {
		beforeRecordRead(w, func(string) {
			mu.Lock()
			reads++
			first := reads == 1
			mu.Unlock()
			if first {
				<-hold
				return
			}
			select {
			case again <- struct{}{}:
			default:
			}
		})
	})
	<-w.ready
	onInProgress(t, c, func() {
		select { // a NATS callback does not block
		case kept <- struct{}{}:
		default:
		}
	})
	id := submitRun(t, c, &bus.RunRequest{Prompt: "hi", Model: fauxModel, Faux: fauxTexts("hello")})
	// Held past AckWait: InProgress every HeartbeatInterval (AckWait/4),
	// five of them.
	timeout := time.NewTimer(10 * ackWait)
	defer timeout.Stop()
	for n := 0; n < 5; {
		select {
		case <-kept:
			n++
		case <-again:
			close(hold)
			t.Fatalf("the request was delivered again while its pickup read the record (%d InProgress before)", n)
		case <-timeout.C:
			close(hold)
			t.Fatalf("%d InProgress while the pickup was held", n)
		}
	}
	close(hold)
	rec := waitRecord(t, c, id, "finished", (*bus.RunRecord).Finished)
	if rec.State != bus.StatusSucceeded || rec.Attempt != 1 {
		t.Fatalf("record: %+v", rec)
	}
}

// onInProgress calls on for each +WPI sent on the runs stream's requests,
// from the moment it returns until the test ends; on runs in a NATS
// callback and must not block.
func onInProgress(t *testing.T, c *bus.Client, on func()) {
	t.Helper()
	sub, err := c.Conn().Subscribe("$JS.ACK."+c.Names().RunsStream()+".>", func(m *nats.Msg) {
		if string(m.Data) == "+WPI" {
			on()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
}
