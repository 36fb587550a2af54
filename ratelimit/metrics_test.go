package ratelimit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/agentfleet/agentfleet/ratelimit"
)

func TestCollector(t *testing.T) {
	f := newFleet(t)
	l := f.limiter("a", ratelimit.Config{Groups: map[string]ratelimit.Limits{"g": {Concurrency: 1}}, Jitter: time.Millisecond})
	seam := ratelimit.NewSeam(map[string]string{"model-a": "g"})
	c := seam.Collector("agentfleet")
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Fatalf("%d metrics before the limiter is attached", n)
	}
	seam.Attach(l.Limiter)
	ctx := t.Context()
	first, err := l.Acquire(ctx, "g", 100)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		g, err := l.Acquire(ctx, "g", 50)
		if err != nil {
			t.Error(err)
			return
		}
		_ = g.Settle(ctx, 20)
	}()
	waitQueued(t, l.kv, 1)
	_ = first.Settle(ctx, 80)
	<-done
	seam.OnRetryAfter("model-a", time.Now().Add(time.Millisecond))
	seam.OnRetryAfter("unlimited-model", time.Now().Add(time.Millisecond))
	want := `
# HELP agentfleet_model_limit_grants_total Model calls admitted.
# TYPE agentfleet_model_limit_grants_total counter
agentfleet_model_limit_grants_total{group="g"} 2
# HELP agentfleet_model_limit_retry_after_total 429s (and 503s with a retry time) a provider answered.
# TYPE agentfleet_model_limit_retry_after_total counter
agentfleet_model_limit_retry_after_total{group="g"} 1
# HELP agentfleet_model_limit_tokens_reserved_total Tokens reserved before model calls (estimated input plus output reserve).
# TYPE agentfleet_model_limit_tokens_reserved_total counter
agentfleet_model_limit_tokens_reserved_total{group="g"} 150
# HELP agentfleet_model_limit_tokens_used_total Tokens model calls used, as settled.
# TYPE agentfleet_model_limit_tokens_used_total counter
agentfleet_model_limit_tokens_used_total{group="g"} 100
# HELP agentfleet_model_limit_waits_total Model calls that waited for the fleet's shared rate limits.
# TYPE agentfleet_model_limit_waits_total counter
agentfleet_model_limit_waits_total{group="g"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"agentfleet_model_limit_grants_total", "agentfleet_model_limit_retry_after_total", "agentfleet_model_limit_tokens_reserved_total",
		"agentfleet_model_limit_tokens_used_total", "agentfleet_model_limit_waits_total"); err != nil {
		t.Fatal(err)
	}
}
