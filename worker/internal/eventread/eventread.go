// Package eventread bounds a worker's reads of runs' stored events
// (resumes, give-ups, continueFrom, finishing a crashed run): a few at a
// time, each within its own time once it has its slot, tried again while
// what refuses it passes.
package eventread

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

// Max is how many reads of stored events (resumes, give-ups,
// continueFrom, finishing a crashed run) one worker makes at a time. Each
// read is a consumer on the events stream, and the server allows 1,000 of
// them per stream by default for the whole fleet and every follower: a
// worker taking over thousands of runs at once must not use them all up
// (the reads past the limit fail, and their runs are handed back again and
// again).
const Max = 32

// Timeout bounds one read once it has its slot: the wait for the
// slot is not the read's, so a worker taking over thousands of runs does
// not fail those at the back of the queue.
const Timeout = 30 * time.Second

// Read is Reads.Events within the worker's bound: it waits for a slot as
// long as ctx lets it, then reads for up to Reads.Timeout.
// Within that time a read refused for a reason that passes (NATS away, the
// stream's consumers all taken by other readers) is tried again: failing it
// would hand its run back and use up one of its deliveries.
func (rs *Reads) Read(ctx context.Context, id string, before uint64) ([]*bus.Envelope, error) {
	select {
	case rs.Slots <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-rs.Slots }()
	rctx, cancel := context.WithTimeout(ctx, rs.Timeout)
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
		envs, err := rs.Events(rctx, id, before)
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

// Reads bounds a worker's reads of stored events: at most Max at a time
// (Slots), each within Timeout once it has its slot.
type Reads struct {
	Slots   chan struct{}
	Timeout time.Duration
	// Events reads a run's stored events after before (bus.Client.ReadEvents).
	Events func(ctx context.Context, id string, before uint64) ([]*bus.Envelope, error)
}

// New is a worker's bound on reads of events.
func New(events func(ctx context.Context, id string, before uint64) ([]*bus.Envelope, error)) *Reads {
	return &Reads{Slots: make(chan struct{}, Max), Timeout: Timeout, Events: events}
}
