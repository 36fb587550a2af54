package worker_test

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/worker"
)

// Workers of one queue with different tools: the one starting warns, and
// a run naming a tool it lacks fails bad_request naming the workers of the
// run's queue that have it.
func TestMixedToolsOnOneQueue(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	// A live worker of queue default with an MCP server's tools, as its
	// presence says.
	kv, err := f.Client.Workers(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	peer := bus.WorkerPresence{Worker: "mcp-worker-1", Protocol: bus.ProtocolVersion, StartedAt: time.Now().UTC(), Queues: []string{"default"}, Slots: 8,
		Tools: []bus.PresenceTool{{Name: "calculator", Source: "builtin", Available: true}, {Name: "everything__add", Source: "mcp:everything", Available: true}}}
	b, err := json.Marshal(peer)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(fleettest.Context(t), peer.Worker, b); err != nil {
		t.Fatal(err)
	}
	logs := &logbuf.Buffer{}
	f.StartWorker(worker.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	for _, want := range []string{"worker mcp-worker-1 on queue default serves different tools", "peerOnly=everything__add", "thisOnly=current_time,run_agent,sleep"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the start log lacks %q:\n%s", want, logs)
		}
	}

	fin := f.WaitFinished(f.Submit("", &bus.RunRequest{Prompt: "add", Model: fleettest.FauxModel(), Tools: []string{"everything__*"}, Faux: fleettest.Texts("no")}))
	if fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, `unknown tool "everything__*"`) ||
		!strings.Contains(fin.Error, `workers of queue "default" that have it: mcp-worker-1`) {
		t.Errorf("a run naming the peer's tools: %s/%s: %s", fin.Status, fin.Reason, fin.Error)
	}
	// On a queue the peer does not serve, no worker is named.
	fin = f.WaitFinished(f.Submit("other", &bus.RunRequest{Prompt: "add", Model: fleettest.FauxModel(), Tools: []string{"everything__add"}, Faux: fleettest.Texts("no")}))
	if fin.Reason != bus.ReasonBadRequest || strings.Contains(fin.Error, "mcp-worker-1") {
		t.Errorf("a run on another queue: %s/%s: %s", fin.Status, fin.Reason, fin.Error)
	}
}
