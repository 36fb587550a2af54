package worker

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/worker/internal/eventpub"
	"github.com/agentfleet/agentfleet/worker/internal/lease"
)

// A run's first beat comes in the interval's second half, at a point of
// its own: never later than a whole interval (the request's AckWait counts
// on it), and not in step with runs started at the same moment.
func TestFirstBeatsAreSpreadOverTheSecondHalf(t *testing.T) {
	t.Parallel()
	const interval = 15 * time.Second
	seen := map[time.Duration]bool{}
	lo, hi := interval, time.Duration(0)
	for range 1000 {
		d := firstBeat(interval)
		if d < interval/2 || d > interval {
			t.Fatalf("first beat after %v, outside [%v, %v]", d, interval/2, interval)
		}
		seen[d] = true
		lo, hi = min(lo, d), max(hi, d)
	}
	if len(seen) < 900 || hi-lo < interval/3 {
		t.Fatalf("1,000 first beats took %d values within %v: not spread", len(seen), hi-lo)
	}
}

// Both ways another attempt can own the run read as a lost lease: the
// lease's failed compare-and-set, and a publisher fenced for it, wrapped
// (as the give-up's "run_started not stored: %w" wraps it).
func TestLeaseGoneKnowsBothErrors(t *testing.T) {
	t.Parallel()
	for _, err := range []error{lease.ErrLost, eventpub.ErrFenced, fmt.Errorf("give-up: run_started not stored: %w", eventpub.ErrFenced)} {
		if !leaseGone(err) {
			t.Errorf("%v: not a lost lease", err)
		}
	}
	if leaseGone(errors.New("timeout")) || leaseGone(nil) {
		t.Error("another error read as a lost lease")
	}
}
