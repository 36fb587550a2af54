package waitsweep

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fake answers passes: the first fails, then each goes on 1000 further
// until 3000, the index's end (next 0).
type fake struct {
	mu     sync.Mutex
	afters []uint64
	minAge time.Duration
	passes chan struct{}
}

func (f *fake) SweepWaiting(_ context.Context, after uint64, n int, minAge time.Duration) (uint64, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.afters = append(f.afters, after)
	f.minAge = minAge
	defer func() { f.passes <- struct{}{} }()
	if len(f.afters) == 1 {
		return 0, 0, errors.New("NATS away")
	}
	next := after + uint64(n)
	if next >= 3000 {
		next = 0
	}
	return next, 1, nil
}

// Each pass goes on from where the last stopped (a failed one changes
// nothing), starts again at the end, keeps entries younger than the
// interval, and stop ends the sweeping.
func TestPassesGoOnFromTheCursor(t *testing.T) {
	f := &fake{passes: make(chan struct{}, 16)}
	stop := Start(context.Background(), f, 5*time.Millisecond, slog.New(slog.DiscardHandler))
	for range 6 {
		<-f.passes
	}
	stop()
	f.mu.Lock()
	defer f.mu.Unlock()
	want := []uint64{0, 0, 1000, 2000, 0, 1000}
	for i, w := range want {
		if f.afters[i] != w {
			t.Fatalf("passes began after %v, want %v", f.afters[:len(want)], want)
		}
	}
	if f.minAge != 5*time.Millisecond {
		t.Fatalf("min age %s, want the interval", f.minAge)
	}
}
