package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// The queue depth counts every lane, tenant lanes too (they are made by
// the workers that see their requests, so only a listing finds them), and
// the depth by tenant names each.
func TestQueueDepthCountsTenantLanes(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	c, n := f.Client, f.Client.Names()
	ctx := fleettest.Context(t)
	acme := bus.Lane{Queue: "default", Priority: bus.PriorityNormal, Tenant: "acme"}
	if _, err := c.JetStream().CreateOrUpdateConsumer(ctx, n.RunsStream(), n.LaneConsumerConfig(acme, time.Minute, 5, 100, 1)); err != nil {
		t.Fatal(err)
	}
	for i, l := range []bus.Lane{{Queue: "default"}, {Queue: "default", Priority: bus.PriorityHigh, Tenant: bus.NoTenant}, acme, acme} {
		if _, err := c.SubmitLane(ctx, l, "d"+string(rune('a'+i)), []byte(`{"prompt":"x"}`)); err != nil {
			t.Fatal(err)
		}
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	total, byPrio, byTenant := map[string]int{}, map[string]int{}, map[[2]string]int{}
	worker.PollQueueDepth(pctx, c, []string{"default"}, time.Minute,
		func(q string, d int) { total[q] = d },
		func(q, p string, d int) { byPrio[p] = d },
		func(q string, d map[[2]string]int) { byTenant = d; cancel() })
	if total["default"] != 4 || byPrio["normal"] != 3 || byPrio["high"] != 1 || byTenant[[2]string{"normal", "acme"}] != 2 || len(byTenant) != 1 {
		t.Fatalf("depth %v, by priority %v, by tenant %v; want 4, normal 3 high 1, acme 2", total, byPrio, byTenant)
	}
}
