package worker_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/ratelimit"
	"github.com/agentfleet/agentfleet/worker"
)

// A run whose model call queues for the shared limits shows it in its
// record while it waits, and a model_wait event once the call proceeds.
func TestWaitingModelRecord(t *testing.T) {
	t.Parallel()
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	f := newFleet(t)
	lim := ratelimit.Limits{Concurrency: 1}
	prov := modelAt(t, srv.URL)
	f.StartWorker(worker.Config{DefaultModel: "openai/m", HeartbeatInterval: 100 * time.Millisecond,
		Providers:  map[string]worker.Provider{"openai": prov},
		RateLimits: &worker.RateLimits{Models: map[string]worker.ModelLimit{"openai/m": {Group: "main", Limits: lim}}}})

	// Another worker holds the group's only slot.
	ctx := fleettest.Context(t)
	kv, err := f.Client.Limits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ratelimit.New(kv, ratelimit.Config{Groups: map[string]ratelimit.Limits{"main": lim}, Worker: "other"})
	if err != nil {
		t.Fatal(err)
	}
	held, err := other.Acquire(ctx, "main", 10)
	if err != nil {
		t.Fatal(err)
	}
	id := f.Submit("", &bus.RunRequest{Prompt: "hi"})
	for {
		rec, err := f.Client.Status(ctx, id)
		if err == nil && rec.Waiting != nil && rec.Waiting.For == bus.WaitingModel {
			if rec.State != bus.StateRunning {
				t.Fatalf("waiting record in state %s", rec.State)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the record never showed the wait")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, calls, _ := p.stats(); calls != 0 {
		t.Fatalf("%d calls while the slot was held", calls)
	}
	if err := held.Settle(ctx, 10); err != nil {
		t.Fatal(err)
	}
	fin := f.WaitFinished(id)
	if fin.Status != bus.StatusSucceeded {
		t.Fatalf("run %s/%s: %s", fin.Status, fin.Reason, fin.Error)
	}
	rec, err := f.Client.Status(ctx, id)
	if err != nil || rec.Waiting != nil {
		t.Fatalf("final record waiting %+v (%v)", rec.Waiting, err)
	}
	waits := 0
	for _, e := range f.Follow(id) {
		if ev := fleettest.Decode(t, e); ev.ModelWait != nil {
			waits++
		}
	}
	if waits != 1 {
		t.Fatalf("%d model_wait events, want 1", waits)
	}
}
