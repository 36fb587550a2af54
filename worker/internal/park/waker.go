package park

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/handoff"
)

// The wake consumer. Every approve and abort AGENTS_CONTROL stores passes
// the durable consumer "wake" (bus.EnsureStreams), which every worker
// pulls from: one worker gone, the others go on (no single point of
// failure), and a message a worker took and did not ack (it died) comes
// again after the consumer's AckWait. Each message: the run's record is
// read; if it is parked, the wake is published (Wake: idempotent, see
// invariant 3); then the message is acked. A run that is not parked is
// left to its running attempt, which has the message by its own
// subscription. The handling reads and writes NATS, so it runs on its
// own goroutine, never in the NATS callback; the consumer's MaxAckPending
// bounds how many run at once.

// A pull of the wake and timers consumers lasts pullExpiry, with a
// heartbeat each pullHeartbeat: a pull the server no longer serves is
// replaced within two heartbeats. With nats.go's defaults (30 s, 15 s),
// bulk wakes sometimes waited 30 s for their first delivery, every answer
// of the bench at once (docs/benchmarks/2026-12.md, 2026-12-07).
const (
	pullExpiry    = 2 * time.Second
	pullHeartbeat = 500 * time.Millisecond
)

// Start pulls from cons until the returned stop is called; stop waits for
// the wakes in progress.
func (e *Env) Start(ctx context.Context, cons jetstream.Consumer) (stop func(), err error) {
	return e.consume(ctx, cons, "wake consumer", e.handle)
}

// consume is handoff.Consume with the wake's log and short pulls.
func (e *Env) consume(ctx context.Context, cons jetstream.Consumer, what string, handle func(context.Context, jetstream.Msg)) (stop func(), err error) {
	return handoff.Consume(ctx, cons, 64, what, e.Log, handle, jetstream.PullExpiry(pullExpiry), jetstream.PullHeartbeat(pullHeartbeat))
}

func (e *Env) handle(ctx context.Context, m jetstream.Msg) {
	id, kind, err := e.Names.ParseControl(m.Subject())
	if err != nil {
		_ = m.Term()
		return
	}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rec, err := e.Read(hctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		_ = m.Ack()
		return
	}
	if err == nil && kind != bus.KindAbort && rec.Waiting != nil && rec.Waiting.For == bus.WaitingKey {
		// In line for its key, a run has no call to answer: only an
		// abort ends its wait (worker/keys.go); a wake would park it again.
		_ = m.Ack()
		return
	}
	if err == nil {
		var stored time.Time
		if md, mdErr := m.Metadata(); mdErr == nil {
			stored = md.Timestamp
		}
		err = e.WakeBy(hctx, rec, ByAnswer, stored)
	}
	if err != nil {
		e.Log.Warn("wake failed; retrying", "run", id, "err", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	if rec.Parked != nil {
		e.Log.Info("parked run woken", "run", id, "parkedSeq", rec.Parked.Seq, "by", m.Subject())
	}
	_ = m.Ack()
}
