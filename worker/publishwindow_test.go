package worker_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

type waitObs struct {
	worker.NopObserver
	mu       sync.Mutex
	waits    int
	pubs     int
	finished chan struct{}
}

// RunFinished comes after every event's ack was counted.
func (o *waitObs) RunFinished(worker.RunInfo, bus.RunFinished) { close(o.finished) }

func (o *waitObs) PublishWait(time.Duration) { o.mu.Lock(); o.waits++; o.mu.Unlock() }

func (o *waitObs) EventPublished() { o.mu.Lock(); o.pubs++; o.mu.Unlock() }

func TestPublishWindowBackPressure(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	o := &waitObs{finished: make(chan struct{})}
	f.StartWorker(worker.Config{PublishWindow: 1, Observer: o})
	text := strings.Repeat("0123456789abcdef", 100) // 100 deltas
	id := f.Submit("", &bus.RunRequest{Prompt: "go", Model: fleettest.FauxModel(), Faux: fleettest.Texts(text)})
	envs := f.Follow(id)
	if fin := checkEnvelopes(t, id, envs); fin.Status != bus.StatusSucceeded {
		t.Fatalf("%+v", fin)
	}
	if got := transcriptOf(t, envs).FinalText(); got != text {
		t.Fatalf("text differs: %d bytes", len(got))
	}
	waitFor(t, o.finished, "the run to leave the worker")
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pubs < len(envs) {
		t.Fatalf("%d acks for %d events", o.pubs, len(envs))
	}
	t.Logf("window 1: %d events, the listener waited %d times", len(envs), o.waits)
}
