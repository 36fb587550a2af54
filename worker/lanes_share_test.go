package worker

import (
	"context"
	"log/slog"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
)

// A promoted lower lane takes its share of slots that free together, not
// all of them (review55b #8: with 8 slots it took 1 start in 3 instead of
// 1 in 10). Endless high and normal backlogs, n slots free at every walk.
func TestPromotedLaneTakesItsShareNotABatch(t *testing.T) {
	for _, n := range []int{1, 2, 4, 8} {
		ls := (&Worker{}).newLaneSet("default")
		for _, p := range []string{bus.PriorityHigh, bus.PriorityNormal} {
			ls.addLane(bus.Lane{Queue: "default", Priority: p, Tenant: bus.NoTenant}, nil, nil)
		}
		starts := map[string]int{}
		ls.fetch = func(_ context.Context, _ *slog.Logger, l *lane, k, _ int) int {
			starts[l.lane.Priority] += k // a backlog: every slot asked for starts a run
			return k
		}
		for range 1000 {
			if got := ls.fetchLanes(t.Context(), slog.Default(), n, 1<<20); got != n {
				t.Fatalf("n=%d: a walk started %d runs", n, got)
			}
		}
		total := starts[bus.PriorityHigh] + starts[bus.PriorityNormal]
		share := float64(starts[bus.PriorityNormal]) / float64(total)
		t.Logf("n=%d: normal took %d of %d starts", n, starts[bus.PriorityNormal], total)
		// One in laneShare, give or take the rounding of one walk.
		if share < 0.09 || share > 0.11 {
			t.Errorf("n=%d slots a walk: normal took %.3f of the starts while high had work; its minimum share is 1 in %d", n, share, laneShare)
		}
	}
}

// With high, normal and low backlogs, low gets one start in ten and normal
// one in ten of the rest (each counts the starts above it), whatever the
// slots freed at once.
func TestEveryLowerLaneGetsItsShare(t *testing.T) {
	for _, n := range []int{1, 8} {
		ls := (&Worker{}).newLaneSet("default")
		for _, p := range []string{bus.PriorityHigh, bus.PriorityNormal, bus.PriorityLow} {
			ls.addLane(bus.Lane{Queue: "default", Priority: p, Tenant: bus.NoTenant}, nil, nil)
		}
		starts := map[string]int{}
		ls.fetch = func(_ context.Context, _ *slog.Logger, l *lane, k, _ int) int {
			starts[l.lane.Priority] += k
			return k
		}
		for range 1000 {
			ls.fetchLanes(t.Context(), slog.Default(), n, 1<<20)
		}
		total := float64(n * 1000)
		low, normal := float64(starts[bus.PriorityLow])/total, float64(starts[bus.PriorityNormal])/total
		t.Logf("n=%d: %v", n, starts)
		if low < 0.09 || low > 0.11 || normal < 0.08 || normal > 0.11 {
			t.Errorf("n=%d: low took %.3f and normal %.3f of the starts; want about 0.1 and 0.09", n, low, normal)
		}
	}
}
