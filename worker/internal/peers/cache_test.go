package peers

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
)

// One read at a time serves every caller; the caller that made it leaving
// does not end it for the others; a failed read is not kept.
func TestCacheReadsOnceAndKeepsNoFailure(t *testing.T) {
	var reads atomic.Int32
	release := make(chan struct{})
	fail := atomic.Bool{}
	list := func(ctx context.Context) ([]bus.WorkerPresence, error) {
		reads.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if fail.Load() {
			return nil, errors.New("no presence")
		}
		return []bus.WorkerPresence{{Worker: "w2"}}, nil
	}
	c := New("w1", list, slog.New(slog.NewTextHandler(io.Discard, nil)))

	// A failed read: the next call reads again.
	fail.Store(true)
	go func() { release <- struct{}{} }()
	if got := c.peers(context.Background()); got != nil {
		t.Fatalf("a failed read gave %v", got)
	}
	fail.Store(false)

	// The first caller leaves at once; ten others wait on its read.
	first, leave := context.WithCancel(context.Background())
	started := make(chan struct{})
	go func() {
		close(started)
		c.peers(first)
	}()
	<-started
	var wg sync.WaitGroup
	results := make(chan int, 10)
	for range 10 {
		wg.Go(func() { results <- len(c.peers(context.Background())) })
	}
	leave()
	release <- struct{}{}
	wg.Wait()
	close(results)
	for n := range results {
		if n != 1 {
			t.Errorf("a caller got %d workers, want 1", n)
		}
	}
	if n := reads.Load(); n != 2 {
		t.Errorf("%d reads, want 2 (the failed one kept nothing; then one for all)", n)
	}
}
