package worker

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/worker/internal/lease"
	"github.com/agentfleet/agentfleet/worker/internal/waitsweep"
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

// startWaitingSweep sweeps the waiting-run index every
// Config.WaitingSweep (worker/internal/waitsweep): an entry whose run no
// longer waits (a final record's drop that failed past its retries, a
// worker that died between a record and its drop) is removed within a few
// passes of some worker. With no index, nothing.
func (w *Worker) startWaitingSweep(context.Context) (func(), error) {
	if w.cfg.WaitingSweep < 0 || w.leases.Index == nil {
		return func() {}, nil
	}
	return waitsweep.Start(w.hardCtx, w.c, w.cfg.WaitingSweep, w.log), nil
}
