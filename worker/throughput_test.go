package worker_test

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestThroughput measures faux runs per second through one worker. It runs
// only with AGENTFLEET_THROUGHPUT=<runs>; it asserts nothing on speed.
func TestThroughput(t *testing.T) {
	// Not parallel: it measures throughput.
	n := 0
	fmt.Sscan(os.Getenv("AGENTFLEET_THROUGHPUT"), &n)
	if n == 0 {
		t.Skip("set AGENTFLEET_THROUGHPUT=<runs> to measure")
	}
	f := newFleet(t)
	f.StartWorker(worker.Config{Concurrency: 64, Queues: []string{"default"}})
	var mu sync.Mutex
	submitted := map[string]time.Time{}
	var startLat []time.Duration
	finished := make(chan struct{}, n)
	events := 0
	sub, err := f.Client.Conn().Subscribe("agents.run.*.events", func(m *nats.Msg) {
		var e struct {
			Run   string `json:"run"`
			Event struct {
				Type string `json:"type"`
			} `json:"event"`
		}
		_ = json.Unmarshal(m.Data, &e)
		mu.Lock()
		events++
		if e.Event.Type == bus.EventRunStarted {
			startLat = append(startLat, time.Since(submitted[e.Run]))
		}
		mu.Unlock()
		if e.Event.Type == bus.EventRunFinished {
			finished <- struct{}{}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	text := strings.Repeat("abcd", 20*4) // 20 deltas of 16 characters
	rate := 0.0
	fmt.Sscan(os.Getenv("AGENTFLEET_RATE"), &rate)
	start := time.Now()
	for i := range n {
		if rate > 0 {
			if d := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > 0 {
				time.Sleep(d) // pacing the offered load, not waiting for a result
			}
		}
		id := fmt.Sprintf("bench-%d", i)
		mu.Lock()
		submitted[id] = time.Now()
		mu.Unlock()
		if _, err := f.Client.Submit(fleettest.Context(t), "", &bus.RunRequest{ID: id, Prompt: "go", Model: fleettest.FauxModel(), Faux: fleettest.Texts(text)}); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		select {
		case <-finished:
		case <-time.After(60 * time.Second):
			t.Fatal("runs did not finish")
		}
	}
	d := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(startLat, func(i, j int) bool { return startLat[i] < startLat[j] })
	p := func(q float64) time.Duration { return startLat[int(q*float64(len(startLat)-1))] }
	t.Logf("%d runs in %s: %.0f runs/s, %.0f events/s; submit->run_started p50 %s p99 %s max %s",
		n, d, float64(n)/d.Seconds(), float64(events)/d.Seconds(), p(0.5), p(0.99), p(1))
}
