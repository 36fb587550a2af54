package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/natserr"
)

// maxEventReads is how many reads of stored events (resumes, give-ups,
// continueFrom, finishing a crashed run) one worker makes at a time. Each
// read is a consumer on the events stream, and the server allows 1,000 of
// them per stream by default for the whole fleet and every follower: a
// worker taking over thousands of runs at once must not use them all up
// (the reads past the limit fail, and their runs are handed back again and
// again).
const maxEventReads = 32

// eventReadTimeout bounds one read once it has its slot: the wait for the
// slot is not the read's, so a worker taking over thousands of runs does
// not fail those at the back of the queue.
const eventReadTimeout = 30 * time.Second

// readEvents is bus.Client.ReadEvents within this worker's bound: it waits
// for a slot as long as ctx lets it, then reads for up to eventReadTimeout.
// Within that time a read refused for a reason that passes (NATS away, the
// stream's consumers all taken by other readers) is tried again: failing it
// would hand its run back and use up one of its deliveries.
func (w *Worker) readEvents(ctx context.Context, id string, before uint64) ([]*bus.Envelope, error) {
	select {
	case w.reads.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-w.reads.slots }()
	rctx, cancel := context.WithTimeout(ctx, w.reads.timeout)
	defer cancel()
	// ended says why the read ended with err: the stop, or the bound.
	ended := func(err error) error {
		if errors.Is(err, context.Cause(rctx)) {
			return err
		}
		return fmt.Errorf("%w: %w", context.Cause(rctx), err)
	}
	pause := 50 * time.Millisecond
	for {
		envs, err := w.c.ReadEvents(rctx, id, before)
		if err != nil && rctx.Err() != nil {
			return envs, ended(err)
		}
		if err == nil || !(natserr.Transient(err) || errors.Is(err, jetstream.ErrMaximumConsumersLimit)) {
			return envs, err
		}
		select {
		case <-time.After(pause + rand.N(pause)):
		case <-rctx.Done():
			return nil, ended(err)
		}
		pause = min(2*pause, time.Second)
	}
}

// eventReads bounds a worker's reads of stored events: at most
// maxEventReads at a time (slots), each within timeout once it has its
// slot.
type eventReads struct {
	slots   chan struct{}
	timeout time.Duration
}
