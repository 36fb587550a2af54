package worker

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// serve picks slot by slot as fetchLanes does, every lane always full.
func serve(ls *laneSet, g *laneGroup, slots int, now time.Time) map[string]int {
	got := map[string]int{}
	for range slots {
		l := ls.pick(g, now)
		k := ls.quota(g, l, 1, now)
		g.vtime = max(g.vtime, l.share.pass)
		l.share.pass += float64(k) / l.share.weight
		got[l.lane.Tenant] += k
	}
	return got
}

// Within a priority, tenants with work get slots in proportion to their
// weights, and a tenant back from empty gets its share from then on, not
// a burst for the time it had nothing (lanes.go, invariant 4).
func TestFairOrderFollowsWeights(t *testing.T) {
	w := &Worker{cfg: Config{TenantWeights: map[string]float64{"a": 2}}, lanes: newLaneBook([]string{"q"})}
	ls := w.newLaneSet("q")
	for _, tenant := range []string{"a", "b"} {
		ls.addLane(bus.Lane{Queue: "q", Priority: bus.PriorityNormal, Tenant: tenant}, nil, &laneEntry{})
	}
	g, now := ls.groups[1], time.Now()
	ls.walk = 1 // as fetchLanes does: no lane drained in this walk
	if got := serve(ls, g, 300, now); got["a"] != 200 || got["b"] != 100 {
		t.Fatalf("a (weight 2) and b (1) got %v of 300 slots; want 200 and 100", got)
	}
	// c was empty all along: once it has work it gets its share (a third
	// of the next 30 with weights 2, 1, 1: 7 or 8), not all of them.
	ls.addLane(bus.Lane{Queue: "q", Priority: bus.PriorityNormal, Tenant: "c"}, nil, &laneEntry{})
	if got := serve(ls, g, 40, now); got["c"] < 9 || got["c"] > 11 || got["a"] < 19 || got["a"] > 21 {
		t.Fatalf("after c came: %v of 40; want a 20, b 10, c 10", got)
	}
	// A lane found empty is not asked until its recheck, unless a request
	// is seen in it (tenants.go, invariant 2).
	b := g.lanes[slicesIndexTenant(g, "b")]
	b.emptyUntil, b.seen = now.Add(time.Hour), b.entry.seen.Load()
	if ls.ready(b, now) {
		t.Fatal("a lane found empty is ready before its recheck")
	}
	b.entry.seen.Add(1)
	if !ls.ready(b, now) {
		t.Fatal("a lane found empty is not ready once a request was seen in it")
	}
}

func slicesIndexTenant(g *laneGroup, tenant string) int {
	for i, l := range g.lanes {
		if l.lane.Tenant == tenant {
			return i
		}
	}
	return -1
}
