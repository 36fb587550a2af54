package memtrim

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A burst of parks frees once, Quiet after the last; a later one frees
// again; nothing frees without a park.
func TestFreeOncePerBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var frees atomic.Int32
		var busy atomic.Bool
		tr := New(10*time.Second, func() { frees.Add(1) }, func() bool { return !busy.Load() })
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { tr.Run(ctx); close(done) }()

		time.Sleep(time.Minute)
		synctest.Wait()
		if n := frees.Load(); n != 0 {
			t.Fatalf("%d frees without a park", n)
		}
		for range 1000 { // a burst, 5 ms apart: 5 s in all
			tr.Left()
			time.Sleep(5 * time.Millisecond)
		}
		synctest.Wait()
		if n := frees.Load(); n != 0 {
			t.Fatalf("%d frees during the burst", n)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n := frees.Load(); n != 1 {
			t.Fatalf("%d frees after the burst, want 1", n)
		}
		tr.Left()
		time.Sleep(11 * time.Second)
		synctest.Wait()
		if n := frees.Load(); n != 2 {
			t.Fatalf("%d frees after a second burst, want 2", n)
		}
		// A burst that ends while runs are running frees once idle.
		busy.Store(true)
		tr.Left()
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := frees.Load(); n != 2 {
			t.Fatalf("%d frees while busy, want 2", n)
		}
		busy.Store(false)
		time.Sleep(11 * time.Second)
		synctest.Wait()
		if n := frees.Load(); n != 3 {
			t.Fatalf("%d frees once idle, want 3", n)
		}
		cancel()
		<-done
	})
}
