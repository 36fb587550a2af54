// Package waitsweep runs a worker's share of the waiting-index sweep
// (bus.Client.SweepWaiting): every worker sweeps, so none is a single
// point of failure, and two sweeping the same entries at once is safe.
package waitsweep

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Sweeper sweeps one pass; *bus.Client is one.
type Sweeper interface {
	SweepWaiting(ctx context.Context, after uint64, n int, minAge time.Duration) (next uint64, removed int, err error)
}

// PerPass bounds the index sequences one pass reads.
const PerPass = 1000

// Start sweeps every interval (spread by up to a quarter of it, so the
// fleet's workers do not sweep together) until stop is called; each pass
// goes on from where the one before stopped, and entries younger than an
// interval are left to a later pass. A failed pass is logged (at debug:
// the next one tries again) and costs nothing more. It stops with ctx too.
func Start(ctx context.Context, s Sweeper, every time.Duration, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		var after uint64
		t := time.NewTimer(spread(every))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pctx, pcancel := context.WithTimeout(ctx, max(every, 10*time.Second))
			next, removed, err := s.SweepWaiting(pctx, after, PerPass, every)
			pcancel()
			switch {
			case err != nil:
				log.Debug("waiting-index sweep", "err", err)
			default:
				after = next
				if removed > 0 {
					log.Info("waiting-index sweep removed stale entries", "removed", removed)
				}
			}
			t.Reset(spread(every))
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

// spread is every, plus up to a quarter of it.
func spread(every time.Duration) time.Duration {
	return every + rand.N(every/4+1)
}
