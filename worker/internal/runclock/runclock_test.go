package runclock

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A clock created paused (a resumed attempt whose earlier attempt was
// waiting) whose deadline is long past does not fire before its pause ends.
func TestRunClockCreatedPausedDoesNotFireEarly(t *testing.T) {
	const n = 5000
	var early atomic.Int64
	var fired sync.WaitGroup
	clocks := make([]*Clock, n)
	resumed := make([]atomic.Bool, n)
	for i := range n {
		fired.Add(1)
		clocks[i] = New(time.Now().Add(-time.Hour), 0, time.Now().Add(-30*time.Minute), func() {
			if !resumed[i].Load() {
				early.Add(1)
			}
			fired.Done()
		})
	}
	for i, c := range clocks {
		resumed[i].Store(true)
		c.Resume() // the pause ends: the deadline is past, so it fires
	}
	fired.Wait()
	if e := early.Load(); e > 0 {
		t.Fatalf("%d of %d clocks fired before their pause ended", e, n)
	}
}
