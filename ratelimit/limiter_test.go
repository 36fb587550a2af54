package ratelimit_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/ratelimit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fleet is one NATS server with the limits bucket.
type fleet struct {
	t   testing.TB
	url string
}

func newFleet(t testing.TB) *fleet {
	srv := fleettest.StartServer(t, 0, t.TempDir())
	c := fleettest.Connect(t, srv.URL())
	if err := c.EnsureStreams(fleettest.Context(t), bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	return &fleet{t: t, url: srv.URL()}
}

// worker is one limiter on its own connection, as one worker process has.
// stop ends it without settling anything, as a kill -9 does.
type limiterProc struct {
	*ratelimit.Limiter
	kv   jetstream.KeyValue
	stop func()
}

func (f *fleet) limiter(name string, cfg ratelimit.Config) *limiterProc {
	t := f.t
	c, err := bus.Connect(context.Background(), bus.ConnectOptions{URL: f.url})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := c.Limits(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Worker = name
	l, err := ratelimit.New(kv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			c.Close()
		})
	}
	t.Cleanup(stop)
	return &limiterProc{Limiter: l, kv: kv, stop: stop}
}

// maxInWindow is the most grants (and their tokens) in any interval of
// length win.
func maxInWindow(ats []time.Time, tokens []int, win time.Duration) (reqs, toks int) {
	for i := range ats {
		r, k := 0, 0
		for j := range ats {
			if !ats[j].Before(ats[i]) && ats[j].Sub(ats[i]) < win {
				r++
				k += tokens[j]
			}
		}
		reqs, toks = max(reqs, r), max(toks, k)
	}
	return reqs, toks
}

// Many calls from three workers never exceed RPM or TPM in any sliding
// window, and the limits are reached (the test measures something).
func TestSlidingWindowAcrossWorkers(t *testing.T) {
	f := newFleet(t)
	const win = 600 * time.Millisecond
	lim := ratelimit.Limits{RPM: 4, TPM: 1000}
	cfg := ratelimit.Config{Groups: map[string]ratelimit.Limits{"g": lim}, Window: win, Liveness: win, Jitter: time.Millisecond}
	ls := []*limiterProc{f.limiter("a", cfg), f.limiter("b", cfg), f.limiter("c", cfg)}
	var mu sync.Mutex
	var ats []time.Time
	var toks []int
	var wg sync.WaitGroup
	ctx := fleettest.Context(t)
	for i := range 24 {
		wg.Go(func() {
			reserve := 300 // three fit by TPM, four by RPM
			if i%2 == 0 {
				reserve = 100
			}
			g, err := ls[i%3].Acquire(ctx, "g", reserve)
			if err != nil {
				t.Error(err)
				return
			}
			used := reserve / 2
			if err := g.Settle(ctx, used); err != nil {
				t.Error(err)
			}
			mu.Lock()
			ats, toks = append(ats, g.At), append(toks, used)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(ats) != 24 {
		t.Fatalf("%d grants, want 24", len(ats))
	}
	reqs, tok := maxInWindow(ats, toks, win)
	if reqs > lim.RPM || tok > lim.TPM {
		t.Fatalf("a window had %d requests and %d tokens; limits %d and %d", reqs, tok, lim.RPM, lim.TPM)
	}
	if reqs < lim.RPM {
		t.Fatalf("the busiest window had %d requests, the limit %d was never reached", reqs, lim.RPM)
	}
}

// waitQueued waits until the group's shared queue holds n calls.
func waitQueued(t *testing.T, kv jetstream.KeyValue, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if e, err := kv.Get(context.Background(), "g"); err == nil {
			var s struct {
				Queue []json.RawMessage `json:"queue"`
			}
			if json.Unmarshal(e.Value(), &s) == nil && len(s.Queue) >= n {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("the queue never held %d calls", n)
}

// With the group saturated, calls are granted in the order they asked,
// whichever worker asked.
func TestGrantsFollowRequestOrder(t *testing.T) {
	f := newFleet(t)
	cfg := ratelimit.Config{Groups: map[string]ratelimit.Limits{"g": {Concurrency: 1}}, Window: time.Second, Jitter: time.Millisecond}
	ls := []*limiterProc{f.limiter("a", cfg), f.limiter("b", cfg), f.limiter("c", cfg)}
	ctx := fleettest.Context(t)
	first, err := ls[0].Acquire(ctx, "g", 10)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	const calls = 9
	for i := range calls {
		// Worker c asks first, then b, then a, round and round.
		wg.Go(func() {
			g, err := ls[2-i%3].Acquire(ctx, "g", 10)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			_ = g.Settle(ctx, 10)
		})
		waitQueued(t, ls[0].kv, i+1)
		time.Sleep(2 * time.Millisecond) // distinct asking times
	}
	if err := first.Settle(ctx, 10); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if !slices.IsSorted(order) || len(order) != calls {
		t.Fatalf("grant order %v, want 0..%d", order, calls-1)
	}
}

// A worker that dies holding the only slot frees it within one window.
func TestDeadWorkerFreesWithinWindow(t *testing.T) {
	f := newFleet(t)
	const win = 2 * time.Second
	cfg := ratelimit.Config{Groups: map[string]ratelimit.Limits{"g": {Concurrency: 1, TPM: 1000}}, Window: win,
		Liveness: 500 * time.Millisecond, Jitter: time.Millisecond}
	dying, alive := f.limiter("dying", cfg), f.limiter("alive", cfg)
	ctx := fleettest.Context(t)
	held, err := dying.Acquire(ctx, "g", 600)
	if err != nil {
		t.Fatal(err)
	}
	dying.stop() // no settle, no refresh: as kill -9
	// The slot comes back when the dead worker's liveness lapses; its
	// tokens, which the provider may have counted, when they leave the
	// window (bins of window/60 count up to one bin longer).
	g, err := alive.Acquire(ctx, "g", 600)
	if err != nil {
		t.Fatal(err)
	}
	d := g.At.Sub(held.At)
	if d < win {
		t.Fatalf("granted %v after the dead reservation, inside its window %v", d, win)
	}
	if slack := win/60 + 300*time.Millisecond; d > win+slack {
		t.Fatalf("capacity came back %v after the dead reservation, more than the window %v", d, win)
	}
	_ = g.Settle(ctx, 1)

	// Concurrency alone comes back with the liveness, well within a window.
	concurrency := ratelimit.Config{Groups: map[string]ratelimit.Limits{"c": {Concurrency: 1}}, Window: win,
		Liveness: 500 * time.Millisecond, Jitter: time.Millisecond}
	dying2, alive2 := f.limiter("dying2", concurrency), f.limiter("alive2", concurrency)
	if held, err = dying2.Acquire(ctx, "c", 1); err != nil {
		t.Fatal(err)
	}
	dying2.stop()
	if g, err = alive2.Acquire(ctx, "c", 1); err != nil {
		t.Fatal(err)
	}
	if d := g.At.Sub(held.At); d >= win {
		t.Fatalf("the slot came back %v after the dead worker took it, not within the window %v", d, win)
	}
	_ = g.Settle(ctx, 1)
}

// A provider's pause reported by one worker holds every worker's calls.
func TestPauseIsShared(t *testing.T) {
	f := newFleet(t)
	cfg := ratelimit.Config{Groups: map[string]ratelimit.Limits{"g": {RPM: 100}}, Jitter: 50 * time.Millisecond}
	a, b := f.limiter("a", cfg), f.limiter("b", cfg)
	ctx := fleettest.Context(t)
	until := time.Now().Add(300 * time.Millisecond)
	if err := a.Pause(ctx, "g", until); err != nil {
		t.Fatal(err)
	}
	if err := b.Gate(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	if now := time.Now(); now.Before(until) {
		t.Fatalf("gate opened %v before the pause ended", until.Sub(now))
	}
	g, err := b.Acquire(ctx, "g", 1)
	if err != nil {
		t.Fatal(err)
	}
	if g.At.Before(until.Truncate(time.Millisecond)) {
		t.Fatalf("granted at %v during the pause (until %v)", g.At, until)
	}
	_ = g.Settle(ctx, 1)
}

// A waiter that gives up leaves the queue, so the calls behind it go on.
func TestCancelledWaiterLeavesQueue(t *testing.T) {
	f := newFleet(t)
	cfg := ratelimit.Config{Groups: map[string]ratelimit.Limits{"g": {Concurrency: 1}}, Jitter: time.Millisecond}
	a, b := f.limiter("a", cfg), f.limiter("b", cfg)
	ctx := fleettest.Context(t)
	held, err := a.Acquire(ctx, "g", 1)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { _, err := b.Acquire(cctx, "g", 1); errc <- err }()
	waitQueued(t, a.kv, 1)
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("a cancelled Acquire succeeded")
	}
	next := make(chan error, 1)
	go func() {
		g, err := a.Acquire(ctx, "g", 1)
		if err == nil {
			err = g.Settle(ctx, 1)
		}
		next <- err
	}()
	waitQueued(t, a.kv, 1)
	if err := held.Settle(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := <-next; err != nil {
		t.Fatal(err)
	}
}

// A grant whose Settle failed (NATS slow, the call's ctx gone) leaves a
// hold no one will settle. While its worker lives and keeps asking, that
// hold must not take the group's concurrency forever: it counts at most
// MaxHold.
func TestUnsettledHoldFreesAfterMaxHold(t *testing.T) {
	f := newFleet(t)
	const maxHold = 1500 * time.Millisecond
	cfg := ratelimit.Config{Groups: map[string]ratelimit.Limits{"c": {Concurrency: 1}}, Window: 2 * time.Second,
		Liveness: 400 * time.Millisecond, MaxHold: maxHold, Jitter: time.Millisecond}
	a, b := f.limiter("a", cfg), f.limiter("b", cfg)
	ctx := fleettest.Context(t)
	held, err := a.Acquire(ctx, "c", 1)
	if err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := held.Settle(gone, 1); err == nil {
		t.Fatal("a settle with a cancelled context succeeded")
	}
	// a stays alive: one of its calls waits behind the orphaned hold.
	waiting := make(chan error, 1)
	go func() {
		g, err := a.Acquire(ctx, "c", 1)
		if err == nil {
			err = g.Settle(ctx, 1)
		}
		waiting <- err
	}()
	g, err := b.Acquire(ctx, "c", 1)
	if err != nil {
		t.Fatal(err)
	}
	if d := g.At.Sub(held.At); d > maxHold+time.Second {
		t.Fatalf("the orphaned hold kept the slot for %v (MaxHold %v)", d, maxHold)
	}
	if err := g.Settle(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}
}

// A watch that outlived its bucket (NATS restarted, a worker created the
// bucket again) waits for sequences the new bucket has not reached:
// after Rewatch, a change in the new bucket wakes a waiter at once, not
// when its timer fires (a minute here, past the test's bound).
func TestRewatchSeesTheRecreatedBucket(t *testing.T) {
	f := newFleet(t)
	cfg := ratelimit.Config{Groups: map[string]ratelimit.Limits{"c": {Concurrency: 1}}, Window: 2 * time.Minute,
		Liveness: 2 * time.Minute, Jitter: time.Millisecond}
	holder, waiter := f.limiter("holder", cfg), f.limiter("waiter", cfg)
	ctx := fleettest.Context(t)
	if _, err := holder.Acquire(ctx, "c", 1); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	granted := make(chan error, 1)
	go func() {
		g, err := waiter.Acquire(wctx, "c", 1)
		if err == nil {
			err = g.Settle(ctx, 1)
		}
		granted <- err
	}()
	key := ratelimit.Key("c")
	queued := func() bool {
		e, err := holder.kv.Get(ctx, key)
		var s struct{ Queue []json.RawMessage }
		return err == nil && json.Unmarshal(e.Value(), &s) == nil && len(s.Queue) == 1
	}
	for !queued() {
		if wctx.Err() != nil {
			t.Fatal("the waiter never queued")
		}
		time.Sleep(10 * time.Millisecond)
	}

	c := fleettest.Connect(t, f.url)
	bucket := c.Names().LimitsBucket()
	if err := c.JetStream().DeleteKeyValue(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	created, err := c.EnsureMemoryBuckets(ctx, bus.StreamsConfig{})
	if err != nil || !slices.Equal(created, []string{bucket}) {
		t.Fatalf("created %v, %v; want only %s", created, err, bucket)
	}
	waiter.Rewatch()
	// The holder's hold went with the old bucket: an empty state is the
	// change the waiter must see.
	if _, err := holder.kv.Put(ctx, key, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatalf("the waiter did not see the new bucket: %v", err)
	}
}

// A call that asks while the limits bucket is gone (being made again by
// an ensure) waits for it, within its context, instead of failing.
func TestAcquireWaitsOutAMissingBucket(t *testing.T) {
	f := newFleet(t)
	cfg := ratelimit.Config{Groups: map[string]ratelimit.Limits{"c": {Concurrency: 1}}, Window: 2 * time.Minute,
		Liveness: 2 * time.Minute, Jitter: time.Millisecond}
	l := f.limiter("w", cfg)
	ctx := fleettest.Context(t)
	c := fleettest.Connect(t, f.url)
	bucket := c.Names().LimitsBucket()
	if err := c.JetStream().DeleteKeyValue(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	granted := make(chan error, 1)
	go func() {
		g, err := l.Acquire(wctx, "c", 1)
		if err == nil {
			err = g.Settle(ctx, 1)
		}
		granted <- err
	}()
	// Its first read has failed (no bucket) and it has not given up.
	select {
	case err := <-granted:
		t.Fatalf("the call ended while the bucket was gone: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := c.EnsureMemoryBuckets(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatalf("after the bucket came back: %v", err)
	}
}
