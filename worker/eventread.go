package worker

import (
	"context"
	"time"

	"github.com/agentfleet/agentfleet/bus"
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
func (w *Worker) readEvents(ctx context.Context, id string, before uint64) ([]*bus.Envelope, error) {
	select {
	case w.eventReads <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-w.eventReads }()
	rctx, cancel := context.WithTimeout(ctx, w.eventReadTimeout)
	defer cancel()
	return w.c.ReadEvents(rctx, id, before)
}
