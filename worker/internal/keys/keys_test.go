package keys

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testEnv is a keys env on a bucket of an embedded server; alive says
// which runs live (all, when nil).
func testEnv(t *testing.T, alive func(run string) bool) (*Env, *time.Time) {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	kv, err := c.JetStream().CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "keys", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	e := &Env{KV: kv, Grace: time.Minute,
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		Alive: func(_ context.Context, run string) (bool, error) {
			return alive == nil || alive(run), nil
		}}
	return e, &now
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func take(t *testing.T, e *Env, key string, limit int, run string) (Result, []string) {
	t.Helper()
	r, wake, err := e.Take(ctx(t), key, limit, run, true)
	if err != nil {
		t.Fatal(err)
	}
	return r, wake
}

// Places up to the limit, then a line; a release hands the place to the
// first in line, who finds it held; a redelivered run keeps its own.
func TestTakeWaitRelease(t *testing.T) {
	e, _ := testEnv(t, nil)
	for _, run := range []string{"a", "b"} {
		if r, _ := take(t, e, "customer-42", 2, run); r != Took {
			t.Fatalf("%s: %v, want Took", run, r)
		}
	}
	if r, _ := take(t, e, "customer-42", 2, "a"); r != Took {
		t.Fatalf("a again (a redelivery): %v", r)
	}
	for _, run := range []string{"c", "d"} {
		if r, _ := take(t, e, "customer-42", 2, run); r != Waits {
			t.Fatalf("%s: %v, want Waits", run, r)
		}
	}
	next, err := e.Release(ctx(t), "customer-42", "a")
	if err != nil || len(next) != 1 || next[0] != "c" {
		t.Fatalf("release: next %q, %v; want c", next, err)
	}
	if r, _ := take(t, e, "customer-42", 2, "c"); r != Took {
		t.Fatalf("c woken: %v", r)
	}
	if r, _ := take(t, e, "customer-42", 2, "x"); r != Waits {
		t.Fatalf("x behind d: %v", r)
	}
	ent, err := e.Read(ctx(t), "customer-42")
	if err != nil || len(ent.Holds) != 2 || len(ent.Waiting) != 2 || ent.Waiting[0].Run != "d" {
		t.Fatalf("entry %+v, %v", ent, err)
	}
}

// A dead run's place (its lease ran out: a killed worker) is taken back by
// the next taker that finds the key full; one within its grace is not.
func TestDeadPlacesAreSwept(t *testing.T) {
	dead := map[string]bool{"a": true}
	e, now := testEnv(t, func(run string) bool { return !dead[run] })
	take(t, e, "k", 1, "a")
	if r, _ := take(t, e, "k", 1, "b"); r != Waits {
		t.Fatalf("within grace: %v, want Waits", r)
	}
	*now = now.Add(2 * time.Minute)
	// b waits first: the freed place is granted to it, and c waits.
	r, wake := take(t, e, "k", 1, "c")
	if r != Waits || len(wake) != 1 || wake[0] != "b" {
		t.Fatalf("c: %v, wake %v; want Waits, wake [b]", r, wake)
	}
	if r, _ := take(t, e, "k", 1, "b"); r != Took {
		t.Fatalf("b woken: %v", r)
	}
}

// A granted place whose run never came (a lost wake) puts it first in
// line again once its grace is over, so it is woken again.
func TestLostWakeIsGrantedAgain(t *testing.T) {
	e, now := testEnv(t, nil)
	take(t, e, "k", 1, "a")
	take(t, e, "k", 1, "b")
	if next, _ := e.Release(ctx(t), "k", "a"); len(next) != 1 || next[0] != "b" {
		t.Fatalf("next %q", next)
	}
	*now = now.Add(2 * time.Minute)
	r, wake := take(t, e, "k", 1, "c")
	if r != Waits || len(wake) != 1 || wake[0] != "b" {
		t.Fatalf("c: %v, wake %v; want Waits, wake [b]", r, wake)
	}
}

// However many workers take at once, never more than the limit hold.
func TestConcurrentTakersNeverExceedTheLimit(t *testing.T) {
	e, _ := testEnv(t, nil)
	var took atomic.Int32
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			r, _, err := e.Take(ctx(t), "k", 3, fmt.Sprintf("r%d", i), true)
			if err != nil {
				t.Error(err)
			}
			if r == Took {
				took.Add(1)
			}
		})
	}
	wg.Wait()
	if took.Load() != 3 {
		t.Fatalf("%d took a place, limit 3", took.Load())
	}
	ent, _ := e.Read(ctx(t), "k")
	if len(ent.Holds) != 3 || len(ent.Waiting) != 21 {
		t.Fatalf("holds %d, waiting %d", len(ent.Holds), len(ent.Waiting))
	}
}

// A line behind a dead place moves with no later taker: the sweep drops
// the place and grants it to the first in line (review55b #1).
func TestSweepGrantsTheLineWithoutATaker(t *testing.T) {
	dead := map[string]bool{"a": true}
	e, now := testEnv(t, func(run string) bool { return !dead[run] })
	take(t, e, "k", 1, "a")
	take(t, e, "k", 1, "b")
	take(t, e, "k", 1, "c")
	if wake, err := e.Sweep(ctx(t), Name("k")); err != nil || len(wake) != 0 {
		t.Fatalf("within grace: wake %v, %v", wake, err)
	}
	*now = now.Add(2 * time.Minute)
	if _, err := e.KV.Put(ctx(t), "childkey", []byte("not a key's entry")); err != nil {
		t.Fatal(err)
	}
	names, err := e.Names(ctx(t))
	if err != nil || len(names) != 1 || names[0] != Name("k") {
		t.Fatalf("names %v, %v", names, err)
	}
	wake, err := e.Sweep(ctx(t), names[0])
	if err != nil || len(wake) != 1 || wake[0] != "b" {
		t.Fatalf("sweep: wake %v, %v; want [b]", wake, err)
	}
	if r, _ := take(t, e, "k", 1, "b"); r != Took {
		t.Fatalf("b woken: %v", r)
	}
}

// Mixed limits on one key: the smallest asked by a holder, a waiter or
// the taker is in force, and places free under it go to the line at once
// (review55b #9).
func TestSmallestLimitIsInForce(t *testing.T) {
	e, _ := testEnv(t, nil)
	take(t, e, "k", 1, "a")
	if r, _ := take(t, e, "k", 5, "b"); r != Waits {
		t.Fatalf("b (limit 5) beside a (limit 1): %v, want Waits", r)
	}
	take(t, e, "k", 5, "c")
	// a leaves: the limit is 5 now, and both waiters are granted.
	next, err := e.Release(ctx(t), "k", "a")
	if err != nil || len(next) != 2 {
		t.Fatalf("release: %v, %v; want [b c]", next, err)
	}
	// A newcomer with limit 1 finds two holders: it waits.
	if r, _ := take(t, e, "k", 1, "d"); r != Waits {
		t.Fatalf("d (limit 1): %v, want Waits", r)
	}
	// A limit-3 taker does not pass d's limit 1 nor jump the line.
	if r, _ := take(t, e, "k", 3, "x"); r != Waits {
		t.Fatalf("x (limit 3) behind d: %v, want Waits", r)
	}
	ent, _ := e.Read(ctx(t), "k")
	if ent.Limit != 1 || len(ent.Holds) != 2 || len(ent.Waiting) != 2 {
		t.Fatalf("entry %+v", ent)
	}
	// b and c leave: d alone may run (limit 1), then x.
	if next, _ := e.Release(ctx(t), "k", "b"); len(next) != 0 {
		t.Fatalf("b released: granted %v with c still holding, limit 1", next)
	}
	if next, _ := e.Release(ctx(t), "k", "c"); len(next) != 1 || next[0] != "d" {
		t.Fatalf("c released: granted %v, want [d]", next)
	}
}

// A line at MaxPlaces refuses a new run (before it parks) rather than
// growing its one KV value past the payload limit (review55b #4).
func TestALongLineIsRefusedNotOutgrown(t *testing.T) {
	e, _ := testEnv(t, nil)
	take(t, e, "k", 1, "a")
	ent, err := e.Read(ctx(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	for i := range MaxPlaces - 1 {
		ent.Waiting = append(ent.Waiting, Place{Run: fmt.Sprintf("r%026d", i), At: time.Now(), Limit: 1})
	}
	kve, err := e.KV.Get(ctx(t), Name("k"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.put(ctx(t), Name("k"), ent, kve.Revision()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.Take(ctx(t), "k", 1, "late", false); !errors.Is(err, ErrLineFull) {
		t.Fatalf("take past the bound: %v, want ErrLineFull", err)
	}
	// One in line already keeps its place (a wake, a redelivery).
	if r, _, err := e.Take(ctx(t), "k", 1, fmt.Sprintf("r%026d", 5), true); err != nil || r != Waits {
		t.Fatalf("a run in line: %v, %v", r, err)
	}
}
