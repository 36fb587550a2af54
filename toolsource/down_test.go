package toolsource_test

import (
	"bytes"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/metrics"
	"github.com/agentfleet/agentfleet/toolsource"
	"github.com/agentfleet/agentfleet/worker"
)

// A configured server that is down never makes a request bad: the run
// starts, its calls fail saying why, and no secret of the config shows.
func TestMCPServerDownRun(t *testing.T) {
	t.Parallel()
	const secret = "sekrit-token-123"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	cfg, err := toolsource.ParseConfig([]byte(`{"mcpServers":{"gone":{"url":"http://`+addr+`/mcp?key=${TOKEN}"}}}`),
		func(k string) (string, bool) { return secret, k == "TOKEN" })
	if err != nil {
		t.Fatal(err)
	}
	var logs logbuf.Buffer
	srcs := toolsource.NewMCPServers(cfg, toolsource.MCPOptions{Logger: newLogger(&logs), MinBackoff: time.Hour})
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, metrics.Config{})
	f := fleettest.Start(t, fleettest.Options{})
	f.StartWorker(worker.Config{ToolSources: []toolsource.Source{srcs[0]}, Observer: worker.MetricsObserver(m)})

	req := fleettest.FauxRun("x", fleettest.ToolCall("c1", "gone__search", map[string]any{"q": 1}), fleettest.Text("done"))
	req.Tools = []string{"gone__*", "gone__search"}
	id := f.Submit("", req)
	envs := f.Follow(id)
	if fin := fleettest.Decode(t, envs[len(envs)-1]).RunFinished; fin == nil || fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	tr := f.Transcript(id)
	if !slices.Equal(tr.Started.Tools, []string{"gone__search"}) {
		t.Errorf("run_started.tools %v", tr.Started.Tools)
	}
	if m := toolResults(tr)["c1"]; !m.IsError || !strings.HasPrefix(text(m), "MCP server gone is unavailable: ") {
		t.Errorf("the call: %+v", m)
	}
	if dump := fleettest.Dump(envs); strings.Contains(dump, secret) {
		t.Errorf("the secret is in the events:\n%s", dump)
	}
	if strings.Contains(logs.String(), secret) || !strings.Contains(logs.String(), "MCP server did not start") {
		t.Errorf("logs:\n%s", logs.String())
	}
	// The metrics learn the source is down.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := testutil.GatherAndCount(reg, "agentfleet_tool_source_up")
		if err == nil && n == 1 {
			out, _ := reg.Gather()
			var b bytes.Buffer
			for _, f := range out {
				if f.GetName() == "agentfleet_tool_source_up" {
					b.WriteString(f.String())
				}
			}
			if !strings.Contains(b.String(), `value:"mcp:gone"`) || !strings.Contains(b.String(), "value:0") {
				t.Errorf("tool_source_up: %s", b.String())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no tool_source_up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
