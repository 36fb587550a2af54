package main

import (
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// A compacted run's page shows where the context was compacted, with the
// summary folded (a closed <details>) under the line.
func TestBrowserCompactionSummaryFolded(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	fl := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default"}, AckWait: 5 * time.Second}})
	fl.StartWorker(worker.Config{DrainTimeout: 2 * time.Second,
		ModelWindows: map[string]worker.ModelWindow{"faux/small": {ContextWindow: 400}}})
	f := &testFleet{Fleet: fl, t: t, srv: fl.Server, c: fl.Client}
	long := agent.ScriptedResponse{Content: []agent.Content{agent.Text(strings.Repeat("word ", 180)),
		agent.ToolCall("c1", "calculator", map[string]any{"expression": "1+1"})}, StopReason: agent.StopReasonToolUse}
	id := f.submit(&bus.RunRequest{ID: "compacted-page", Model: &bus.ModelRef{Provider: "faux", ID: "small"}, Prompt: strings.Repeat("read ", 120),
		Tools: []string{"calculator"}, Compaction: &bus.Compaction{},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{long, fleettest.Text("## Goal\nadd one and one"), fleettest.Text("2")}}})
	if fin := fl.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("run %+v", fin)
	}
	c := newConsole(t, f, serverConfig{})
	b := newBrowser(t, c.URL)
	page := b.tab()
	b.open(page, "/runs/"+id)
	b.do(page, "the transcript ends", wait(`document.getElementById("transcript")?.dataset.ended === "true"`))
	line := eval[string](b, page, `document.querySelector("#transcript .fleet-event.compaction")?.textContent || ""`)
	// The kept messages are above the line (it comes when the summary
	// call ended, before the next call): it names where the kept ones start.
	if !strings.Contains(line, "context compacted (threshold)") || !strings.Contains(line, "messages summarised") ||
		!strings.Contains(line, "transcript from message 1 on (the kept messages are above") {
		t.Fatalf("compaction line %q", line)
	}
	if open := eval[bool](b, page, `document.querySelector("#transcript .fleet-event.compaction details").open`); open {
		t.Error("the summary is not folded")
	}
	if s := eval[string](b, page, `document.querySelector("#transcript .fleet-event.compaction details pre").textContent`); s != "## Goal\nadd one and one" {
		t.Errorf("summary %q", s)
	}
	b.checkConsole()
}
