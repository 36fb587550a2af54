package worker_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/metrics"
	"github.com/agentfleet/agentfleet/worker"
)

// gathered indexes a registry's samples by name and sorted label pairs.
type gathered map[string]*dto.Metric

func gather(t *testing.T, reg *prometheus.Registry) (gathered, []string) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := gathered{}
	var labelValues []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
				labelValues = append(labelValues, l.GetValue())
			}
			out[key] = m
		}
	}
	return out, labelValues
}

func (g gathered) value(t *testing.T, key string) float64 {
	t.Helper()
	m, ok := g[key]
	if !ok {
		t.Errorf("no sample %s", key)
		return 0
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

// A faux run with a tool call moves the counters and histograms it should,
// and no label carries the run id or the prompt.
func TestMetricsFromAFauxRun(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg, metrics.Config{Models: []string{"gpt-4o-mini"}, Tools: []string{"calculator"}, Queues: []string{"default", "other"}})
	stop := f.StartWorker(worker.Config{Observer: worker.MetricsObserver(m)}).Stop

	const prompt = "what is 6*7, secret-prompt-text"
	id := f.Submit("default", &bus.RunRequest{
		Prompt: prompt, Model: fleettest.FauxModel(), Tools: []string{"calculator"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("c1", "calculator", map[string]any{"expression": "6*7"}),
			fleettest.Text("It is 42."),
		}},
	})
	envs := f.Follow(id)
	// A bad request finishes without starting: it must not move runs_in_flight.
	bad := f.Submit("default", &bus.RunRequest{Prompt: "x", Model: fleettest.FauxModel(), Tools: []string{"no_such_tool"}})
	badEnvs := f.Follow(bad)
	stop() // drains: every ack and observer call is done

	g, labels := gather(t, reg)
	checks := map[string]float64{
		"agentfleet_runs_started_total,model=faux,queue=default":                           1,
		"agentfleet_runs_finished_total,model=faux,queue=default,reason=,status=succeeded": 1,
		"agentfleet_runs_in_flight,queue=default":                                          0,
		"agentfleet_run_duration_seconds,queue=default,status=succeeded":                   1,
		"agentfleet_queue_wait_seconds,queue=default":                                      1,
		"agentfleet_turns_total,model=faux":                                                2,
		"agentfleet_model_requests_total,model=faux,outcome=toolUse":                       1,
		"agentfleet_model_requests_total,model=faux,outcome=stop":                          1,
		"agentfleet_model_request_duration_seconds,model=faux":                             2,
		"agentfleet_tool_calls_total,outcome=ok,tool=calculator":                           1,
		"agentfleet_tool_duration_seconds,tool=calculator":                                 1,
		"agentfleet_events_published_total":                                                float64(len(envs) + len(badEnvs)),
	}
	for key, want := range checks {
		if got := g.value(t, key); got != want {
			t.Errorf("%s = %v, want %v", key, got, want)
		}
	}
	for _, kind := range []string{"input", "output"} {
		if got := g.value(t, "agentfleet_tokens_total,kind="+kind+",model=faux"); got <= 0 {
			t.Errorf("%s tokens = %v, want > 0", kind, got)
		}
	}
	if got := g.value(t, "agentfleet_worker_slots"); got != 8 {
		t.Errorf("slots = %v, want 8", got)
	}
	for _, v := range labels {
		if strings.Contains(v, id) || strings.Contains(v, "secret-prompt") {
			t.Errorf("label value %q carries the run id or the prompt", v)
		}
	}
}

// Child runs are counted by depth and status (issue 56); the run ids stay
// out of the labels.
func TestMetricsChildRunsByDepth(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg, metrics.Config{Queues: []string{"default", "other"}})
	f.StartWorker(worker.Config{Observer: worker.MetricsObserver(m)})
	req := fleettest.FauxRun("plan",
		agent.ScriptedResponse{StopReason: agent.StopReasonToolUse, Content: []agent.Content{
			agent.ToolCall("a", bus.ToolRunAgent, map[string]any{"prompt": "ok", "request": map[string]any{"faux": fleettest.Texts("fine")}}),
			agent.ToolCall("b", bus.ToolRunAgent, map[string]any{"prompt": "fail", "request": map[string]any{"faux": bus.FauxScript{
				Responses: []agent.ScriptedResponse{{StopReason: agent.StopReasonError, ErrorMessage: "boom"}}}}}),
		}},
		fleettest.Text("merged"))
	req.Tools = []string{bus.ToolRunAgent}
	id := f.Submit("", req)
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("parent %+v", fin)
	}
	g, labels := gather(t, reg)
	if v := g.value(t, "agentfleet_child_runs_finished_total,depth=1,status=succeeded"); v != 1 {
		t.Errorf("succeeded children at depth 1: %v", v)
	}
	if v := g.value(t, "agentfleet_child_runs_finished_total,depth=1,status=failed"); v != 1 {
		t.Errorf("failed children at depth 1: %v", v)
	}
	for _, l := range labels {
		if strings.Contains(l, id) || strings.HasPrefix(l, "c") && len(l) == 41 {
			t.Errorf("a run id in a label: %q", l)
		}
	}
}

// A run from a tenant lane is counted in its tenant's wait; one without a
// tenant only in the queue's.
func TestMetricsWaitByTenant(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg, metrics.Config{Queues: []string{"default"}})
	f.StartWorker(worker.Config{Observer: worker.MetricsObserver(m)})
	req := fleettest.FauxRun("acme's", fleettest.Text("ok"))
	req.Metadata = map[string]string{"tenant": "acme"}
	ids := []string{f.Submit("", req), f.Submit("", fleettest.FauxRun("nobody's", fleettest.Text("ok")))}
	for _, id := range ids {
		if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
			t.Fatalf("run %+v", fin)
		}
	}
	g, _ := gather(t, reg)
	h := g["agentfleet_queue_wait_by_tenant_seconds,queue=default,tenant=acme"]
	if h == nil || h.GetHistogram().GetSampleCount() != 1 {
		t.Fatalf("acme's wait: %v; want one sample", h)
	}
	for k := range g {
		if strings.HasPrefix(k, "agentfleet_queue_wait_by_tenant_seconds,") && !strings.HasSuffix(k, "tenant=acme") {
			t.Errorf("a series %s for a run without a tenant", k)
		}
	}
}
