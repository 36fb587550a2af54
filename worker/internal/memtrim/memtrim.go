// Package memtrim gives the memory of runs that left a worker (parked)
// back to the operating system once they stop leaving.
//
// A parked run leaves nothing on its worker, but what it held is garbage
// until the next collection, and a worker with nothing running allocates
// too little to start one: Go's forced collection comes only every two
// minutes, and the scavenger returns freed pages slowly after it. With a
// GOMEMLIMIT (the worker's default GOGC is then 400) the heap may sit near
// the limit. So after a burst of parks the worker collects and returns the
// freed memory at once (debug.FreeOSMemory), once the burst is over.
//
// Invariants:
//   - Left never blocks (it runs on a run's goroutine as the run ends);
//   - a burst is over once Quiet passes with no Left; Free runs once per
//     burst, and never more often than once per Quiet;
//   - a Left that comes while Free runs starts a new burst (not lost);
//   - Free runs only while the worker is idle (no run holds a slot): a
//     forced collection on a busy worker would mark every live run's heap
//     and give back pages those runs allocate again; a burst that ends
//     while busy frees once the worker is idle (looked at every Quiet).
package memtrim

import (
	"context"
	"time"
)

// Trimmer runs Free after each burst of Left calls.
type Trimmer struct {
	quiet time.Duration
	free  func()
	idle  func() bool
	kick  chan struct{}
}

// New returns a Trimmer that calls free (debug.FreeOSMemory in the
// worker) once quiet has passed after the last Left and idle says no run
// is running.
func New(quiet time.Duration, free func(), idle func() bool) *Trimmer {
	return &Trimmer{quiet: quiet, free: free, idle: idle, kick: make(chan struct{}, 1)}
}

// Left says a run left the worker without finishing (it parked).
func (t *Trimmer) Left() {
	select {
	case t.kick <- struct{}{}:
	default: // a burst is already pending
	}
}

// Run calls Free after each burst until ctx ends.
func (t *Trimmer) Run(ctx context.Context) {
	timer := time.NewTimer(t.quiet)
	timer.Stop()
	pending := false
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-t.kick:
			pending = true
			timer.Reset(t.quiet)
		case <-timer.C:
			switch {
			case !pending:
			case t.idle():
				pending = false
				t.free()
			default:
				timer.Reset(t.quiet) // busy: look again
			}
		}
	}
}
