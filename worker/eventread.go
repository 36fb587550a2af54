package worker

import (
	"context"

	"github.com/agentfleet/agentfleet/bus"
)

// maxEventReads is how many reads of stored events (resumes, give-ups,
// continueFrom) one worker makes at a time. Each read is a consumer on the
// events stream, and the server allows 1,000 of them per stream by default
// for the whole fleet and every follower: a worker taking over thousands
// of runs at once must not use them all up (the reads past the limit
// fail, and their runs are handed back again and again).
const maxEventReads = 32

// readEvents is bus.Client.ReadEvents within this worker's bound.
func (w *Worker) readEvents(ctx context.Context, id string, before uint64) ([]*bus.Envelope, error) {
	if err := w.takeEventRead(ctx); err != nil {
		return nil, err
	}
	defer func() { <-w.eventReads }()
	return w.c.ReadEvents(ctx, id, before)
}

// loadTranscript is bus.Client.LoadTranscript within this worker's bound.
func (w *Worker) loadTranscript(ctx context.Context, id string) (*bus.Transcript, error) {
	if err := w.takeEventRead(ctx); err != nil {
		return nil, err
	}
	defer func() { <-w.eventReads }()
	return w.c.LoadTranscript(ctx, id)
}

func (w *Worker) takeEventRead(ctx context.Context) error {
	select {
	case w.eventReads <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
