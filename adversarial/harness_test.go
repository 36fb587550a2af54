//go:build adversarial

package adversarial

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/internal/rolefleet"
	"github.com/agentfleet/agentfleet/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// accountsConf is the file under attack: the one deploy/ ships.
const accountsConf = "../deploy/nats/accounts.conf"

// fleet is a nats-server with accounts.conf and a worker connected as the
// worker role; the attack connects as whatever role it needs.
type fleet struct {
	*rolefleet.Server
	// Worker is the worker's connection (its role's permissions).
	Worker *rolefleet.Client
	// WorkerLog is the worker's own log.
	WorkerLog *logbuf.Buffer
	// StopWorker stops the worker (nil without one); the test's end does
	// too.
	StopWorker func()
}

// startFleet starts the server and, unless cfg is nil, one in-process
// worker on it with cfg (Client, Logger and WorkerID filled in).
func startFleet(t *testing.T, cfg *worker.Config) *fleet {
	t.Helper()
	return startFleetConf(t, accountsConf, cfg)
}

// startFleetConf is startFleet with another accounts file.
func startFleetConf(t *testing.T, conf string, cfg *worker.Config) *fleet {
	t.Helper()
	f := &fleet{Server: rolefleet.Start(t, conf), WorkerLog: &logbuf.Buffer{}}
	f.Worker = f.Connect(t, "worker")
	if cfg != nil {
		c := *cfg
		c.Client = f.Worker.Client
		if c.Logger == nil {
			c.Logger = slog.New(slog.NewTextHandler(f.WorkerLog, nil))
		}
		if c.WorkerID == "" {
			c.WorkerID = "adversarial-worker"
		}
		if c.DrainTimeout == 0 {
			c.DrainTimeout = 2 * time.Second
		}
		f.StopWorker = fleettest.RunWorker(t, c).Stop
	}
	return f
}

// ctx is a test's bound on one step.
func ctx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

// fauxRun is a scripted run with the calculator tool.
func fauxRun(id, prompt string, resps ...agent.ScriptedResponse) *bus.RunRequest {
	req := fleettest.FauxRun(prompt, resps...)
	req.ID = id
	req.Tools = []string{"calculator"}
	return req
}

// TestTheHarnessRunsARunAsTheRoles is the suite's own check: a submitter's
// run is run by the worker role, and the submitter cannot write a record.
func TestTheHarnessRunsARunAsTheRoles(t *testing.T) {
	f := startFleet(t, &worker.Config{})
	sub := f.Connect(t, "submitter")
	c := ctx(t, 30*time.Second)
	req := fauxRun("harness-run", "hi", fleettest.Text("hello"))
	if _, err := sub.Submit(c, "", req); err != nil {
		t.Fatal(err)
	}
	tr, err := sub.LoadTranscript(c, req.ID)
	if err != nil || !tr.Done() || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("run: %v", err)
	}
	nc, log := f.NATS(t, "submitter")
	if err := nc.Publish("$KV.agents_runs.harness-run", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	if !f.Log.Violation("submitter", "$KV.agents_runs.harness-run") {
		t.Errorf("a submitter wrote a record without a permissions violation; client log: %s", log.String())
	}
}
