package worker

import (
	"context"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/worker/internal/eventpub"
)

// A service is one of the worker's parts that run beside its runs. Run
// starts them in order once it has its streams and consumers, before it
// pulls, and stops them in reverse once the runs are done (or drained):
// a part may use those started before it, and every part outlives the
// runs that use it.
type service struct {
	name  string
	start func(setup context.Context) (stop func(), err error)
}

// services are the worker's, in start order.
func (w *Worker) services(consumers []jetstream.Consumer) []service {
	return []service{
		{"pickup reads", func(context.Context) (func(), error) { // worker/pickupread.go
			return w.learnPickupReads(w.cfg.Queues, consumers), nil
		}},
		{"control subscription", w.subscribeControl},
		{"child notices", w.subscribeChildDone}, // worker/childwait.go
		{"events", w.startEvents},
		{"control coverage", func(setup context.Context) (func(), error) { // worker/coverage.go
			// The subscription is known to the server (a flush) before
			// the coverage's first renew reads the streams.
			if err := w.c.Conn().FlushWithContext(setup); err != nil {
				return nil, fmt.Errorf("control subscription: %w", err)
			}
			return w.startCoverage(setup), nil
		}},
		{"shared rate limits", w.startRateLimits}, // worker/ratelimit.go
		{"tenant budgets", w.startBudgets},        // worker/tenant.go
		{"tree budgets", w.startTreeBudgets},      // worker/treebudget.go
		{"give-up", func(setup context.Context) (func(), error) { return w.startGiveUp(setup), nil }}, // worker/giveup.go
		{"waiting-index sweep", w.startWaitingSweep},                                                  // worker/waitindex.go
		{"wake", w.startWake},                       // worker/park.go
		{"key sweep", w.startKeySweep},              // worker/keys.go
		{"schedules", w.startSchedules},             // worker/schedule.go
		{"schedule operations", w.startScheduleOps}, // worker/schedule.go
		{"memory trim", func(context.Context) (func(), error) { return w.startTrim(), nil }},                    // worker/park.go
		{"tool sources", func(setup context.Context) (func(), error) { return w.startToolSources(setup), nil }}, // worker/toolsources.go
		{"presence", func(context.Context) (func(), error) { return w.startPresence(), nil }},                   // worker/presence.go
	}
}

// startServices starts services in order. It returns what stops them in
// reverse; if one fails to start, those started are stopped and the
// error is returned.
func startServices(setup context.Context, services []service) (stop func(), err error) {
	var stops []func()
	stopAll := func() {
		for _, stop := range slices.Backward(stops) {
			stop()
		}
	}
	for _, s := range services {
		stop, err := s.start(setup)
		if err != nil {
			stopAll()
			return nil, fmt.Errorf("worker: %s: %w", s.name, err)
		}
		stops = append(stops, stop)
	}
	return stopAll, nil
}

// subscribeControl subscribes to the control messages republished to the
// workers (onControl).
func (w *Worker) subscribeControl(context.Context) (func(), error) {
	sub, err := w.c.Conn().Subscribe(w.names.Republished(), w.onControl)
	if err != nil {
		return nil, err
	}
	sub.SetPendingLimits(-1, 64<<20)
	w.ctlSub = sub
	return func() { _ = sub.Unsubscribe() }, nil
}

// startEvents starts what the runs' event publishers share: the acks,
// and the batches where the events stream takes them.
func (w *Worker) startEvents(setup context.Context) (func(), error) {
	stream, err := w.c.JetStream().Stream(setup, w.names.EventsStream())
	if err != nil {
		return nil, fmt.Errorf("events stream: %w", err)
	}
	acks, err := eventpub.StartAcks(w.c.Conn(), w.cfg.PublishAckTimeout)
	if err != nil {
		return nil, err
	}
	var batch *eventpub.Batch
	if !w.cfg.NoEventBatches && eventpub.BatchesAllowed(stream.CachedInfo().Config, w.names) {
		if batch, err = eventpub.StartBatch(w.c.Conn(), w.wire, acks, w.names.EventBatches()); err != nil {
			acks.Close()
			return nil, err
		}
		batch.ProbeOrOff(setup, w.log, eventpub.ReprobeEvery)
	}
	w.events = &eventpub.Env{Conn: w.c.Conn(), Out: w.wire, Names: w.names, Stream: stream, Acks: acks, Batch: batch,
		Window: w.cfg.PublishWindow, AckTimeout: w.cfg.PublishAckTimeout, Budget: w.cfg.AckWait, Worker: w.id,
		StoredReads: eventpub.NewSlots(eventpub.MaxStoredReads), Stop: w.hardCtx,
		Log: w.log, Metrics: w.obs}
	return func() {
		if batch != nil {
			batch.Close()
		}
		acks.Close()
	}, nil
}
