package toolsource_test

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/toolsource"
	"github.com/agentfleet/agentfleet/worker"
)

// everythingFleet is a fleet whose worker serves the npm test server
// "everything" over stdio.
func everythingFleet(t *testing.T, env map[string]string, o toolsource.MCPOptions) (*fleettest.Fleet, *toolsource.MCPServer) {
	t.Helper()
	cfg := everythingConfig(t, env)
	f := fleettest.Start(t, fleettest.Options{})
	if o.MinBackoff == 0 {
		o.MinBackoff, o.MaxBackoff = 50*time.Millisecond, 200*time.Millisecond
	}
	src := toolsource.NewMCPServer("everything", cfg, o)
	f.StartWorker(worker.Config{ToolSources: []toolsource.Source{src}})
	waitUp(t, src)
	return f, src
}

func batch(calls ...agent.Content) agent.ScriptedResponse {
	return agent.ScriptedResponse{Content: calls, StopReason: agent.StopReasonToolUse}
}

// toolResults maps tool call ids to their result messages.
func toolResults(tr *bus.Transcript) map[string]agent.Message {
	out := map[string]agent.Message{}
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult {
			out[m.ToolCallID] = m
		}
	}
	return out
}

func text(m agent.Message) string {
	var b strings.Builder
	for _, c := range m.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

func TestEverythingTools(t *testing.T) {
	t.Parallel()
	f, _ := everythingFleet(t, nil, toolsource.MCPOptions{})
	req := fleettest.FauxRun("use the tools",
		batch(agent.ToolCall("sum", "everything__get-sum", map[string]any{"a": 2, "b": 40}),
			agent.ToolCall("img", "everything__get-tiny-image", map[string]any{}),
			agent.ToolCall("sampling", "everything__trigger-sampling-request", map[string]any{"prompt": "hi"}),
			agent.ToolCall("calc", "calculator", map[string]any{"expression": "1+1"}),
			agent.ToolCall("long", "everything__trigger-long-running-operation", map[string]any{"duration": 1, "steps": 2})),
		fleettest.Text("done"))
	req.Tools = []string{"everything__*", "everything__get-sum", "calculator", "everything__trigger-sampling-request"}
	id := f.Submit("", req)
	envs := f.Follow(id)
	if fin := fleettest.Decode(t, envs[len(envs)-1]).RunFinished; fin == nil || fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	// Progress notifications become tool_execution_update events.
	if !slices.ContainsFunc(envs, func(e *bus.Envelope) bool {
		return e.Type == "tool_execution_update" && strings.Contains(string(e.Event), `"long"`) && strings.Contains(string(e.Event), "progress 1/2")
	}) {
		t.Errorf("no progress update of the long operation:\n%s", fleettest.Dump(envs))
	}
	tr := f.Transcript(id)
	got := tr.Started.Tools
	if !slices.IsSorted(got) || !slices.Contains(got, "everything__get-sum") || !slices.Contains(got, "everything__echo") ||
		!slices.Contains(got, "calculator") || !slices.Contains(got, "everything__trigger-sampling-request") {
		t.Errorf("run_started.tools %v: want the namespace expanded, deduped and sorted", got)
	}
	if len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Errorf("duplicates in %v", got)
	}
	res := toolResults(tr)
	if m := res["sum"]; m.IsError || !strings.Contains(text(m), "42") {
		t.Errorf("get-sum: %+v", m)
	}
	if m := res["img"]; m.IsError || !slices.ContainsFunc(m.Content, func(c agent.Content) bool {
		return c.Type == agent.ContentImage && c.MimeType == "image/png" && len(c.Data) > 100
	}) {
		t.Errorf("get-tiny-image: %+v", m)
	}
	// The server offers sampling tools only to clients with sampling,
	// which the worker is not: the server answers with an error result.
	if m := res["sampling"]; !m.IsError || !strings.Contains(text(m), "trigger-sampling-request") {
		t.Errorf("trigger-sampling-request: %+v", m)
	}
	if m := res["calc"]; m.IsError || text(m) != "2" {
		t.Errorf("calculator: %+v", m)
	}
}

func TestEverythingAbortCancelsTheCall(t *testing.T) {
	// Not parallel: it bounds the abort's latency (1 s).
	w := newWatcher()
	f, _ := everythingFleet(t, nil, toolsource.MCPOptions{WrapTransport: w.wrap})
	req := fleettest.FauxRun("wait",
		fleettest.ToolCall("long", "everything__trigger-long-running-operation", map[string]any{"duration": 60, "steps": 60}),
		fleettest.Text("never"))
	req.Tools = []string{"everything__trigger-long-running-operation"}
	id := f.Submit("", req)
	w.waitSent(t, "tools/call", 1)
	aborted := time.Now()
	if _, err := f.Client.Abort(fleettest.Context(t), id, "stop"); err != nil {
		t.Fatal(err)
	}
	fin := f.WaitFinished(id)
	took := time.Since(aborted)
	if fin.Status != bus.StatusAborted {
		t.Fatalf("finished %+v", fin)
	}
	if took > time.Second {
		t.Errorf("the run ended %s after the abort, want within 1s", took)
	}
	w.waitSent(t, "notifications/cancelled", 1)
}

func TestEverythingKilledServerRestarts(t *testing.T) {
	t.Parallel()
	w := newWatcher()
	f, src := everythingFleet(t, nil, toolsource.MCPOptions{WrapTransport: w.wrap})
	first := w.process()
	req := fleettest.FauxRun("wait",
		fleettest.ToolCall("long", "everything__trigger-long-running-operation", map[string]any{"duration": 60, "steps": 60}),
		fleettest.Text("the server died"))
	req.Tools = []string{"everything__*"}
	id := f.Submit("", req)
	w.waitSent(t, "tools/call", 1)
	if err := first.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	m := toolResults(f.Transcript(id))["long"]
	if !m.IsError || !strings.HasPrefix(text(m), "MCP server everything is unavailable: ") {
		t.Fatalf("the call in flight: %+v", m)
	}

	// A new process; the next run works.
	deadline := time.Now().Add(20 * time.Second)
	for w.process() == first || !up(src) {
		if time.Now().After(deadline) {
			t.Fatal("the server was not restarted within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	req = fleettest.FauxRun("sum",
		fleettest.ToolCall("sum", "everything__get-sum", map[string]any{"a": 1, "b": 2}), fleettest.Text("3"))
	req.Tools = []string{"everything__get-sum"}
	id = f.Submit("", req)
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	if m := toolResults(f.Transcript(id))["sum"]; m.IsError || !strings.Contains(text(m), "3") {
		t.Fatalf("after the restart: %+v", m)
	}
}

func up(s toolsource.Source) bool {
	parts, _ := s.Status()
	return len(parts) == 1 && parts[0].Up
}

func TestEverythingEnvHasNoWorkerSecrets(t *testing.T) {
	secrets := map[string]string{"OPENAI_API_KEY": "sk-worker-secret-1", "NATS_PASSWORD": "nats-worker-secret-2", "AGENTS_NATS_TOKEN": "token-secret-3"}
	for k, v := range secrets {
		t.Setenv(k, v)
	}
	f, _ := everythingFleet(t, map[string]string{"GREETING": "hello-from-config"}, toolsource.MCPOptions{})
	req := fleettest.FauxRun("env", fleettest.ToolCall("env", "everything__get-env", map[string]any{}), fleettest.Text("ok"))
	req.Tools = []string{"everything__get-env"}
	id := f.Submit("", req)
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	out := text(toolResults(f.Transcript(id))["env"])
	if !strings.Contains(out, "hello-from-config") || !strings.Contains(out, "PATH") {
		t.Fatalf("get-env lacks the configured variable or PATH: %s", out)
	}
	for k, v := range secrets {
		if strings.Contains(out, v) || strings.Contains(out, k) {
			t.Errorf("get-env shows the worker's %s: %s", k, out)
		}
	}
}
