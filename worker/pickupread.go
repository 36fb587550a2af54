package worker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/worker/internal/intake"
)

// A first delivery may skip the record read at pickup only when its
// queue's consumer allows the hand-back that follows if a record was
// there after all (worker/internal/lease): MaxDeliver unlimited or at least 3.
// The consumer's setting, not this worker's: an operator or another
// worker may set it, and may change it while this worker runs (MaxDeliver
// is editable), so it is read at the start and again every
// consumerCheck. Until a lowered setting is read, a first delivery that
// finds a record spends one more delivery than the consumer allows for.

// learnPickupReads reads the rule from the consumers' cached info (read
// when they were looked up) and keeps it current until the returned stop
// is called. With each read it sweeps the queue's passed-over requests
// (orphans.go), the first time at once.
func (w *Worker) learnPickupReads(queues []string, consumers []jetstream.Consumer) (stop func()) {
	w.pickupReads.skip = intake.RecordReadSkips{}
	floors := make([]uint64, len(queues))
	for i, q := range queues {
		s := &atomic.Bool{}
		ci := consumers[i].CachedInfo()
		s.Store(intake.AllowsHandBack(ci.Config.MaxDeliver))
		w.pickupReads.skip[q] = s
		floors[i] = ci.AckFloor.Stream
	}
	ctx, cancel := context.WithCancel(w.hardCtx)
	var wg sync.WaitGroup
	wg.Go(func() {
		swept := make([]uint64, len(queues)) // per queue: read up to here
		for i, q := range queues {
			w.sweepOrphans(ctx, q, floors[i], &swept[i])
		}
		t := time.NewTicker(w.pickupReads.every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for i, q := range queues {
				if info := w.recheckPickupRead(ctx, q, consumers[i]); info != nil {
					w.sweepOrphans(ctx, q, info.AckFloor.Stream, &swept[i])
				}
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// recheckPickupRead reads a queue's consumer again; it returns the info
// read, or nil.
func (w *Worker) recheckPickupRead(ctx context.Context, queue string, cons jetstream.Consumer) *jetstream.ConsumerInfo {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := cons.Info(ctx)
	s := w.pickupReads.skip[queue]
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		s.Store(false) // recreated with a setting not yet known: read
	case err != nil:
		// Unknown for now (NATS trouble): the last setting read stands.
	default:
		skip := intake.AllowsHandBack(info.Config.MaxDeliver)
		if s.Swap(skip) != skip {
			w.log.Info("queue consumer's MaxDeliver changed", "queue", queue,
				"maxDeliver", info.Config.MaxDeliver, "firstDeliveriesReadRecord", !skip)
		}
		return info
	}
	return nil
}

// pickupReads tells which queues' first deliveries skip the record read
// (skip), read again from the consumers every every.
type pickupReads struct {
	skip  intake.RecordReadSkips
	every time.Duration
}
