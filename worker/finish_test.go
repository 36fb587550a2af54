package worker_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// startCounter counts the attempts a worker started.
type startCounter struct {
	worker.NopObserver
	started atomic.Int64
}

func (o *startCounter) RunStarted(worker.RunInfo) { o.started.Add(1) }

// A finished run's request is acknowledged (docs/reliability.md: an
// explicit ack once run_finished is stored): the queue's consumer holds
// nothing pending for it, and it is not delivered again once AckWait has
// passed. Without the ack the run looks just as finished (run_finished
// and the record are written before it), but the request comes back after
// AckWait and is acked only by the redelivery's pickup.
func TestAFinishedRunsRequestIsAcknowledgedAndNotDeliveredAgain(t *testing.T) {
	t.Parallel()
	const ackWait = time.Second
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{AckWait: ackWait}})
	obs := &startCounter{}
	f.StartWorker(worker.Config{AckWait: ackWait, Observer: obs})
	id := f.Submit("", fleettest.FauxRun("hi", fleettest.Text("hello")))
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("run_finished %+v", fin)
	}
	finished := time.Now()
	ctx := fleettest.Context(t)
	names := f.Client.Names()
	cons, err := f.Client.JetStream().Consumer(ctx, names.RunsStream(), names.Consumer(bus.DefaultQueue))
	if err != nil {
		t.Fatal(err)
	}
	if got := cons.CachedInfo().Config.AckWait; got != ackWait {
		t.Fatalf("the queue consumer's AckWait is %s, want %s", got, ackWait)
	}
	// The ack follows run_finished at once; the redelivery of a request
	// left unacknowledged comes an AckWait after its last heartbeat. Past
	// twice AckWait it would have come.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	acked := false
	for polls := 0; ; polls++ {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Delivered.Consumer != 1 || info.NumRedelivered != 0 {
			t.Fatalf("%s after run_finished: the request was delivered again (deliveries %d, redelivered pending %d, ack pending %d)",
				time.Since(finished).Round(time.Millisecond), info.Delivered.Consumer, info.NumRedelivered, info.NumAckPending)
		}
		past := time.Since(finished) > 2*ackWait
		if info.NumAckPending == 0 && info.AckFloor.Consumer == 1 {
			acked = true
		} else if acked || past {
			t.Fatalf("%s after run_finished the request is not acknowledged: ack pending %d, ack floor %d",
				time.Since(finished).Round(time.Millisecond), info.NumAckPending, info.AckFloor.Consumer)
		}
		if past {
			t.Logf("acknowledged and not delivered again over %s (%d consumer reads)", time.Since(finished).Round(time.Millisecond), polls+1)
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	if n := obs.started.Load(); n != 1 {
		t.Fatalf("%d attempts started, want 1", n)
	}
	started := 0
	for _, e := range allEvents(t, f, id) {
		if e.Type == bus.EventRunStarted {
			started++
		}
	}
	if started != 1 {
		t.Fatalf("%d run_started events, want 1", started)
	}
}
