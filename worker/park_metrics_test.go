package worker

import (
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// parkObserver records what the worker tells of parks and wakes.
type parkObserver struct {
	NopObserver
	mu      sync.Mutex
	parked  []string
	wakes   []string
	latency []time.Duration
	started []time.Duration
	woke    chan struct{} // a value per woken attempt started
}

func (o *parkObserver) RunParked(_ RunInfo, what string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.parked = append(o.parked, what)
}

func (o *parkObserver) WakePublished(by string, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.wakes = append(o.wakes, by)
	o.latency = append(o.latency, d)
}

func (o *parkObserver) WokenStarted(_ RunInfo, d time.Duration) {
	o.mu.Lock()
	o.started = append(o.started, d)
	o.mu.Unlock()
	o.woke <- struct{}{}
}

// A park, its wake by the answer and the woken attempt's start are each
// told once, with the wake's latencies.
func TestParkAndWakeAreObserved(t *testing.T) {
	t.Parallel()
	o := &parkObserver{woke: make(chan struct{}, 4)}
	w, c, d := approvalWorker(t, Config{ParkAfter: 200 * time.Millisecond, HeartbeatInterval: time.Second, Observer: o})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventRunParked, 1)
	waitRecord(t, c, run, "parked", func(r *bus.RunRecord) bool { return r.Parked != nil })
	waitGone(t, w, run)
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "alice"})
	select {
	case <-o.woke:
	case <-time.After(30 * time.Second):
		t.Fatal("no woken attempt started")
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded || d.targets() != "prod" {
		t.Fatalf("finished %+v, deployed %q", fin, d.targets())
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.parked) != 1 || o.parked[0] != bus.WaitingApproval {
		t.Errorf("parks told %q, want one for approval", o.parked)
	}
	if len(o.wakes) != 1 || o.wakes[0] != "answer" || o.latency[0] < 0 || o.latency[0] > 30*time.Second {
		t.Errorf("wakes told %q, latencies %v: want one by answer, its latency known", o.wakes, o.latency)
	}
	if len(o.started) != 1 || o.started[0] < 0 || o.started[0] > 30*time.Second {
		t.Errorf("woken starts told %v, want one", o.started)
	}
}
