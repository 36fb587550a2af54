package worker

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/worker/internal/lease"
)

// waitingIndex is what the leases write the waiting-run index with
// (bus/waiting_index.go), checked once at the start: with no
// AGENTS_WAITING (a fleet whose streams predate 1.9 and a worker that
// skips EnsureStreams) it is nil, said once in the log, and the listings
// of waiting runs walk the records; the leases then write nothing, where
// each waiting run's heartbeat sent a request that failed, unlogged. Any
// other error (NATS slow at the start) keeps the index: a failed write is
// retried at the next record write.
func (w *Worker) waitingIndex(setup context.Context) lease.Index {
	_, err := w.js.Stream(setup, w.names.WaitingStream())
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		w.log.Warn("waiting-run index off: no "+w.names.WaitingStream()+" stream (create the streams with EnsureStreams); listings of waiting runs walk the records", "err", err)
		return nil
	case err != nil:
		w.log.Warn("cannot check the waiting-run index stream; writing it anyway", "stream", w.names.WaitingStream(), "err", err)
	}
	return w.c
}
