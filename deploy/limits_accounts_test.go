package deploy

import (
	"context"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/ratelimit"
	"github.com/agentfleet/agentfleet/worker"
)

// TestAccountsRateLimits proves the grants of KV agents_limits: a worker
// with the worker credentials creates and watches it (EnsureStreams, its
// limiter) and takes, settles and pauses capacity in it; no other role can
// read or write it.
func TestAccountsRateLimits(t *testing.T) {
	url, pw := accountsServer(t)
	wc := connectAs(t, url, "worker", pw["worker"])
	other := connectAs(t, url, "worker", pw["worker"])
	sub := connectAs(t, url, "submitter", pw["submitter"])
	obs := connectAs(t, url, "observer", pw["observer"])
	ts := connectAs(t, url, "toolservice", pw["toolservice"])

	lim := ratelimit.Limits{RPM: 100, TPM: 100000, Concurrency: 4}
	fleettest.RunWorker(t, worker.Config{Client: wc, DrainTimeout: 2 * time.Second, WorkerID: "acl-limits-worker",
		RateLimits: &worker.RateLimits{Models: map[string]worker.ModelLimit{"openai/m": {Group: "main", Limits: lim}}}})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := other.Limits(ctx)
	if err != nil {
		t.Fatalf("worker: limits bucket: %v", err)
	}
	l, err := ratelimit.New(kv, ratelimit.Config{Groups: map[string]ratelimit.Limits{"main": lim}, Worker: "acl-limiter"})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Run(rctx) }()
	g, err := l.Acquire(ctx, "main", 100)
	if err != nil {
		t.Fatalf("worker: acquire: %v", err)
	}
	if err := g.Settle(ctx, 50); err != nil {
		t.Fatalf("worker: settle: %v", err)
	}
	if err := l.Pause(ctx, "main", time.Now().Add(10*time.Millisecond)); err != nil {
		t.Fatalf("worker: pause: %v", err)
	}
	if err := l.Gate(ctx, "main"); err != nil {
		t.Fatalf("worker: gate: %v", err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("worker: watch: %v", err)
	}

	for role, c := range map[string]*bus.Client{"submitter": sub, "observer": obs, "toolservice": ts} {
		{
			dctx, cancel := deny()
			_, err := c.Limits(dctx)
			cancel()
			denied(t, c, role+" opens the limits bucket", "$JS.API.STREAM.INFO.KV_agents_limits", err)
		}
		{
			dctx, cancel := deny()
			_, err := c.JetStream().Publish(dctx, "$KV.agents_limits.main", []byte(`{}`))
			cancel()
			denied(t, c, role+" overwrites a group's limits", "$KV.agents_limits.main", err)
		}
		{
			dctx, cancel := deny()
			_, err := c.JetStream().Stream(dctx, "KV_agents_limits")
			cancel()
			denied(t, c, role+" reads the limits stream", "$JS.API.STREAM.INFO.KV_agents_limits", err)
		}
	}
}
