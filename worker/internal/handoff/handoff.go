// Package handoff consumes a JetStream consumer's messages, each handled
// on its own goroutine: the handling reads and writes NATS, which a NATS
// callback must never do.
package handoff

import (
	"context"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Consume runs handle on its own goroutine for each message of cons
// (pulled up to batch at a time; the consumer's MaxAckPending bounds how
// many run at once) until the returned stop is called. stop waits for
// the handlings in progress; a message that comes while stopping is
// handed back (Nak). Consumer errors are logged at debug as what, unless
// ctx ended; pull adds pull options (a short expiry, a heartbeat).
// Invariant: once stopping, no handling starts, so wg.Add never
// races wg.Wait.
func Consume(ctx context.Context, cons jetstream.Consumer, batch int, what string, log *slog.Logger, handle func(context.Context, jetstream.Msg), pull ...jetstream.PullConsumeOpt) (stop func(), err error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	stopping := false
	cc, err := cons.Consume(func(m jetstream.Msg) {
		mu.Lock()
		if stopping {
			mu.Unlock()
			_ = m.Nak()
			return
		}
		wg.Add(1)
		mu.Unlock()
		go func() {
			defer wg.Done()
			handle(ctx, m)
		}()
	}, append([]jetstream.PullConsumeOpt{jetstream.PullMaxMessages(batch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if ctx.Err() == nil {
			log.Debug(what, "err", err)
		}
	})}, pull...)...)
	if err != nil {
		return nil, err
	}
	return func() {
		mu.Lock()
		stopping = true
		mu.Unlock()
		cc.Stop()
		<-cc.Closed()
		wg.Wait()
	}, nil
}
