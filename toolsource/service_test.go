package toolsource_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/toolsource"
	"github.com/agentfleet/agentfleet/worker"
)

const addSchema = `{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]}`

// calcInstance is one instance of tool service "calc".
type calcInstance struct {
	name    string
	nc      *nats.Conn
	svc     micro.Service
	mu      sync.Mutex
	calls   int
	headers []map[string]string
}

func (c *calcInstance) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// startCalc starts an instance of "calc" on its own connection. block,
// when not nil, is the "block" endpoint's handler.
func startCalc(t *testing.T, f *fleettest.Fleet, name string, block func()) *calcInstance {
	t.Helper()
	nc := fleettest.Connect(t, f.URL()).Conn()
	c := &calcInstance{name: name, nc: nc}
	svc, err := micro.AddService(nc, micro.Config{Name: "calc", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	c.svc = svc
	meta := func(desc, schema string) micro.EndpointOpt {
		return micro.WithEndpointMetadata(map[string]string{"description": desc, "schema": schema})
	}
	g := svc.AddGroup("agents.tools.calc")
	add := func(ep string, h micro.HandlerFunc, opts ...micro.EndpointOpt) {
		if err := g.AddEndpoint(ep, h, opts...); err != nil {
			t.Fatal(err)
		}
	}
	add("add", func(r micro.Request) {
		var args struct{ A, B float64 }
		_ = json.Unmarshal(r.Data(), &args)
		h := map[string]string{}
		for k := range r.Headers() {
			h[k] = r.Headers().Get(k)
		}
		c.mu.Lock()
		c.calls++
		c.headers = append(c.headers, h)
		c.mu.Unlock()
		_ = r.RespondJSON(map[string]any{"content": []map[string]any{{"type": "text", "text": fmt.Sprintf("%g from %s", args.A+args.B, name)}},
			"details": map[string]any{"instance": name}})
	}, meta("Add two numbers.", addSchema))
	add("fail", func(r micro.Request) { _ = r.Error("503", "the disk is full", nil) }, meta("Always fails.", `{"type":"object"}`))
	add("slow", func(micro.Request) {}, meta("Never answers.", `{"type":"object"}`))
	add("plain", func(r micro.Request) { _ = r.Respond([]byte("just text")) }, meta("Answers plain text.", `{"type":"object"}`))
	add("internal", func(r micro.Request) { _ = r.Respond([]byte("no")) }) // no metadata: not a tool
	add("refuse", func(r micro.Request) {
		_ = r.Respond([]byte(`{"content":[{"type":"text","text":"I will not."}],"isError":true}`))
	}, meta("Refuses.", `{"type":"object"}`))
	add(strings.Repeat("x", 70), func(r micro.Request) { _ = r.Respond(nil) }, meta("Too long a name.", `{"type":"object"}`))
	if block != nil {
		add("block", func(r micro.Request) { block(); _ = r.Respond([]byte("released")) }, meta("Waits.", `{"type":"object"}`))
	}
	return c
}

func serviceWorker(t *testing.T, f *fleettest.Fleet, allowed ...string) *toolsource.Services {
	t.Helper()
	src, err := toolsource.NewServices(fleettest.Connect(t, f.URL()).Conn(), toolsource.ServiceOptions{Allowed: allowed})
	if err != nil {
		t.Fatal(err)
	}
	f.StartWorker(worker.Config{ToolSources: []toolsource.Source{src}, ToolTimeout: 2 * time.Second})
	return src
}

func TestServiceCalls(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	a, b := startCalc(t, f, "A", nil), startCalc(t, f, "B", nil)
	serviceWorker(t, f, "calc")

	var calls []agent.Content
	for i := range 20 {
		calls = append(calls, agent.ToolCall(fmt.Sprintf("add%d", i), "calc__add", map[string]any{"a": i, "b": 1}))
	}
	calls = append(calls,
		agent.ToolCall("fail", "calc__fail", map[string]any{}),
		agent.ToolCall("slow", "calc__slow", map[string]any{}),
		agent.ToolCall("plain", "calc__plain", map[string]any{}),
		agent.ToolCall("refuse", "calc__refuse", map[string]any{}),
		agent.ToolCall("bad", "calc__add", map[string]any{"a": "x"}))
	req := fleettest.FauxRun("calc", batch(calls...), fleettest.Text("done"))
	req.Tools = []string{"calc__*"}
	id := f.Submit("", req)
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	tr := f.Transcript(id)
	if want := []string{"calc__add", "calc__fail", "calc__plain", "calc__refuse", "calc__slow"}; !slices.Equal(tr.Started.Tools, want) {
		t.Errorf("run_started.tools %v, want %v", tr.Started.Tools, want)
	}
	res := toolResults(tr)
	for i := range 20 {
		m := res[fmt.Sprintf("add%d", i)]
		if m.IsError || !strings.HasPrefix(text(m), strconv.Itoa(i+1)+" from ") || !strings.Contains(string(m.Details), `"instance"`) {
			t.Errorf("add%d: %+v", i, m)
		}
	}
	if a.count() == 0 || b.count() == 0 || a.count()+b.count() != 20 {
		t.Errorf("calls per instance: A %d, B %d; want both used, 20 in all", a.count(), b.count())
	}
	if m := res["fail"]; !m.IsError || text(m) != "calc__fail failed: the disk is full (code 503)" {
		t.Errorf("fail: %+v", m)
	}
	if m := res["slow"]; !m.IsError || !strings.Contains(text(m), "calc__slow timed out after 2s") {
		t.Errorf("slow: %+v", m)
	}
	if m := res["refuse"]; !m.IsError || text(m) != "I will not." {
		t.Errorf("isError reply: %+v", m)
	}
	if m := res["plain"]; m.IsError || text(m) != "just text" {
		t.Errorf("plain: %+v", m)
	}
	if m := res["bad"]; !m.IsError || !strings.Contains(text(m), "a") {
		t.Errorf("arguments are validated before the call: %+v", m)
	}
	a.mu.Lock()
	h := a.headers[0]
	a.mu.Unlock()
	dl, _ := strconv.ParseInt(h[toolsource.HeaderDeadline], 10, 64)
	if h[toolsource.HeaderRun] != id || h[toolsource.HeaderAttempt] != "1" || !strings.HasPrefix(h[toolsource.HeaderToolCall], "add") ||
		h[toolsource.HeaderTool] != "calc__add" || dl < time.Now().Add(-time.Minute).UnixMilli() {
		t.Errorf("headers %v", h)
	}
}

// One instance stops in the middle of a run: the run's next calls are
// answered by the other.
func TestServiceInstanceStopsMidRun(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	started, release := make(chan struct{}, 2), make(chan struct{})
	block := func() {
		started <- struct{}{}
		<-release
	}
	a, b := startCalc(t, f, "A", block), startCalc(t, f, "B", block)
	serviceWorker(t, f, "calc")

	var second []agent.Content
	for i := range 6 {
		second = append(second, agent.ToolCall(fmt.Sprintf("add%d", i), "calc__add", map[string]any{"a": 1, "b": 1}))
	}
	req := fleettest.FauxRun("calc",
		fleettest.ToolCall("block", "calc__block", map[string]any{}), batch(second...), fleettest.Text("done"))
	req.Tools = []string{"calc__block", "calc__add"}
	id := f.Submit("", req)
	<-started
	if err := a.svc.Stop(); err != nil {
		t.Fatal(err)
	}
	// Stop only queues A's unsubscribes on its connection: until the
	// server has them, it may still route a request to A.
	if err := a.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	close(release)
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	res := toolResults(f.Transcript(id))
	for i := range 6 {
		if m := res[fmt.Sprintf("add%d", i)]; m.IsError || text(m) != "2 from B" {
			t.Errorf("add%d after A stopped: %+v", i, m)
		}
	}
	if a.count() != 0 || b.count() != 6 {
		t.Errorf("calls: A %d, B %d", a.count(), b.count())
	}
}

// An allowed service without instances never makes a request bad; under
// "*" an unknown service is looked for, then refused.
func TestServiceDiscoveryAndMissing(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	src := serviceWorker(t, f, "*")

	// Started after the worker's discovery: found when a run names it.
	startCalc(t, f, "A", nil)
	req := fleettest.FauxRun("calc", fleettest.ToolCall("add", "calc__add", map[string]any{"a": 1, "b": 2}), fleettest.Text("done"))
	req.Tools = []string{"calc__add"}
	id := f.Submit("", req)
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	if m := toolResults(f.Transcript(id))["add"]; m.IsError || text(m) != "3 from A" {
		t.Errorf("add: %+v", m)
	}
	if parts, tools := src.Status(); len(parts) != 1 || parts[0] != (toolsource.SourceStatus{Name: "service:calc", Up: true}) || len(tools) != 6 ||
		!slices.Contains(tools, toolsource.ToolStatus{Name: "calc__" + strings.Repeat("x", 70), Source: "service:calc"}) {
		t.Errorf("status %+v %+v", parts, tools)
	}

	req = fleettest.FauxRun("x", fleettest.Text("never"))
	req.Tools = []string{"cal__add", "*"}
	id = f.Submit("", req)
	fin := f.WaitFinished(id)
	if fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, `unknown tool "cal__add"`) || !strings.Contains(fin.Error, `tool "*"`) ||
		!strings.Contains(fin.Error, "calc__add") {
		t.Errorf("finished %+v", fin)
	}
}

func TestServiceAllowedButNotRunning(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	serviceWorker(t, f, "calc")
	req := fleettest.FauxRun("calc", fleettest.ToolCall("add", "calc__add", map[string]any{"a": 1}), fleettest.Text("done"))
	req.Tools = []string{"calc__add", "calc__*"}
	id := f.Submit("", req)
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	if m := toolResults(f.Transcript(id))["add"]; !m.IsError || text(m) != "no instance of service calc is running" {
		t.Errorf("add: %+v", m)
	}
}
