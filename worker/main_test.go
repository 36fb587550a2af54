package worker_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/testpar"
	"github.com/agentfleet/agentfleet/worker"
)

func TestMain(m *testing.M) {
	// The tests wait far more than they compute; each has its own
	// server (fleettest, startInternal).
	testpar.Default(4)
	goleak.VerifyTestMain(m)
}

// newFleet is a fleet with queues "default" and "other"; its workers take
// both.
func newFleet(t *testing.T) *fleettest.Fleet {
	t.Helper()
	return fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default", "other"}, AckWait: 5 * time.Second}})
}

func TestSmoke(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	id := f.Submit("", fleettest.FauxRun("hi", fleettest.Text("hello there")))
	envs := f.Follow(id)
	t.Log(fleettest.Dump(envs))
}
