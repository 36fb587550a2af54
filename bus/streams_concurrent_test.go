package bus_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// Workers that start together declaring different queues all keep their
// queues' subjects in AGENTS_RUNS (review55b #6: a stream update has no
// compare-and-set, and the later of two updates dropped the other's).
func TestConcurrentEnsureStreamsKeepsEveryQueue(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default"}}})
	ctx := fleettest.Context(t)
	const workers = 4
	clients := make([]*bus.Client, workers)
	for i := range clients {
		clients[i] = fleettest.Connect(t, f.URL())
	}
	var all []string
	for round := range 8 {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, c := range clients {
			q := fmt.Sprintf("q%dw%d", round, i)
			all = append(all, q)
			wg.Go(func() {
				<-start
				if err := c.EnsureStreams(ctx, bus.StreamsConfig{Queues: []string{q}}); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
		s, err := f.Client.JetStream().Stream(ctx, f.Client.Names().RunsStream())
		if err != nil {
			t.Fatal(err)
		}
		subs := s.CachedInfo().Config.Subjects
		for _, q := range append([]string{"default"}, all...) {
			if !slices.Contains(subs, "agents.submit."+q+".*") || !slices.Contains(subs, "agents.lane."+q+".high.*.*") {
				t.Fatalf("round %d: queue %s lost; AGENTS_RUNS takes %v", round, q, subs)
			}
		}
	}
}
