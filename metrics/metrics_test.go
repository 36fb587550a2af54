package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newTest(t *testing.T) (*prometheus.Registry, *Metrics) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	return reg, New(reg, Config{Models: []string{"gpt-4o-mini"}, Tools: []string{"calculator"}, Queues: []string{"default"}})
}

func TestLabelsStayBounded(t *testing.T) {
	reg, m := newTest(t)
	for i := range 50 {
		id := "run-" + strings.Repeat("x", i)
		m.RunStarted(id, id, 1, time.Millisecond)
		m.RunFinished(id, id, id, id, time.Second, true)
		m.ModelRequest(id, id, time.Second, time.Millisecond, ModelUsage{Input: 1})
		m.ToolCall(id, i%2 == 0, time.Millisecond)
		m.ControlReceived(id)
		m.SetQueueDepth(id, i)
	}
	m.RunStarted("default", "faux", 2, time.Millisecond)
	m.ModelRequest("gpt-4o-mini", "stop", time.Second, -1, ModelUsage{Input: 10, Output: 5, CacheRead: 2, Cost: 0.5})

	// 50 distinct unknown values collapse to one series each.
	if n := testutil.CollectAndCount(m.runsStarted); n != 2 {
		t.Fatalf("runs_started series = %d, want 2 (other, default/faux)", n)
	}
	if n := testutil.CollectAndCount(m.toolCalls); n != 2 {
		t.Fatalf("tool_calls series = %d, want 2 (other/ok, other/error)", n)
	}
	if got := testutil.ToFloat64(m.redeliveries.WithLabelValues("default")); got != 1 {
		t.Fatalf("redeliveries = %v", got)
	}
	if got := testutil.ToFloat64(m.tokens.WithLabelValues("gpt-4o-mini", "cache_read")); got != 2 {
		t.Fatalf("cache_read tokens = %v", got)
	}
	if got := testutil.ToFloat64(m.runsInFlight.WithLabelValues(Other)); got != 0 {
		t.Fatalf("in flight (other) = %v, want 0 after finishing", got)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestNamesAreWhatIsExported(t *testing.T) {
	reg, m := newTest(t)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
	}
	// Families without observations are not gathered; touch all of them.
	m.RunStarted("default", "faux", 2, 0)
	m.RunResumed("default")
	m.RunFinished("default", "faux", "succeeded", "", time.Second, true)
	m.Turn("faux")
	m.ModelRequest("faux", "stop", time.Second, time.Millisecond, ModelUsage{Input: 1, Cost: 1})
	m.ModelUsageSettled("faux", "estimated", 0, 0)
	m.ModelUsageSettled("faux", "clamped", 1, 1)
	m.ToolCall("calculator", false, time.Millisecond)
	m.PublishWaited(time.Millisecond)
	m.ControlReceived("steer")
	m.SetQueueDepth("default", 1)
	m.SetLaneDepth("default", "high", 1)
	m.SetTenantDepths("default", map[[2]string]int{{"normal", "acme"}: 1})
	m.KeyWaited("default", time.Second)
	m.TenantWaited("default", "acme", time.Second)
	m.ToolSourceUp("mcp:x", true)
	m.ToolSourceConflict("service:x", true)
	m.ApprovalResolved("approve", time.Second)
	m.ChildRunFinished(1, "succeeded")
	m.WakePublished("answer", time.Second)
	m.WokenStarted(time.Second)
	if families, err = reg.Gather(); err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		exported[f.GetName()] = true
	}
	for _, n := range m.Names() {
		if !exported[n] {
			t.Errorf("%s is in Names() but not exported", n)
		}
	}
	for _, want := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if !exported[want] {
			t.Errorf("runtime/process collector metric %s missing", want)
		}
	}
}

func TestHandler(t *testing.T) {
	reg, m := newTest(t)
	m.SetSlots(3, 8)
	var readyErr error
	srv := httptest.NewServer(Handler(reg, func(context.Context) error { return readyErr }))
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "agentfleet_worker_slots_busy 3") {
		t.Fatalf("/metrics %d:\n%s", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz %d", code)
	}
	readyErr = errors.New("nats: connection closed")
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "connection closed") {
		t.Fatalf("/readyz unready: %d %s", code, body)
	}
	srv.CloseClientConnections()
}

func TestRunsPastDeadline(t *testing.T) {
	reg, m := newTest(t)
	value := func() float64 {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "agentfleet_runs_past_deadline" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("runs_past_deadline not exported")
		return 0
	}
	m.RunDeadline("r1:1", time.Now().Add(-time.Second))
	m.RunDeadline("r2:1", time.Now().Add(time.Hour))
	if got := value(); got != 1 {
		t.Fatalf("past deadline = %v, want 1", got)
	}
	m.RunDeadline("r1:1", time.Time{})
	if got := value(); got != 0 {
		t.Fatalf("past deadline after the run left = %v, want 0", got)
	}
}

// A call without reported usage counts by what it was charged; a clamped
// one counts once, with the tokens cut by kind; a reported one not at all.
func TestModelUsageSettled(t *testing.T) {
	reg, m := newTest(t)
	m.ModelUsageSettled("gpt-4o-mini", "estimated", 0, 0)
	m.ModelUsageSettled("gpt-4o-mini", "estimated", 0, 0)
	m.ModelUsageSettled("gpt-4o-mini", "none", 0, 0)
	m.ModelUsageSettled("gpt-4o-mini", "reported", 0, 0)
	m.ModelUsageSettled("unknown-model", "clamped", 1<<53, 7)
	for _, c := range []struct {
		c    prometheus.Collector
		want float64
	}{
		{m.usageUnreported.WithLabelValues("gpt-4o-mini", "estimate"), 2},
		{m.usageUnreported.WithLabelValues("gpt-4o-mini", "none"), 1},
		{m.usageClamped.WithLabelValues(Other), 1},
		{m.usageExcess.WithLabelValues(Other, "input"), 1 << 53},
		{m.usageExcess.WithLabelValues(Other, "output"), 7},
	} {
		if got := testutil.ToFloat64(c.c); got != c.want {
			t.Errorf("got %v, want %v", got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.usageClamped); n != 1 {
		t.Errorf("clamped series %d, want 1: a reported usage is not counted", n)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestParkAndWakeMetrics(t *testing.T) {
	_, m := newTest(t)
	m.RunParked("approval")
	m.RunParked("children")
	m.RunParked("a caller's text") // bounded: other
	m.WakePublished("answer", 200*time.Millisecond)
	m.WakePublished("timer", -1) // when it was due is not known: counted, not observed
	m.WokenStarted(2 * time.Second)
	for _, c := range []struct {
		got, want float64
		what      string
	}{
		{testutil.ToFloat64(m.runsParked.WithLabelValues("approval")), 1, "parked for approval"},
		{testutil.ToFloat64(m.runsParked.WithLabelValues(Other)), 1, "parked for other"},
		{testutil.ToFloat64(m.wakes.WithLabelValues("answer")), 1, "wakes by answer"},
		{testutil.ToFloat64(m.wakes.WithLabelValues("timer")), 1, "wakes by timer"},
		{testutil.ToFloat64(m.wakes.WithLabelValues("parking")), 0, "wakes while parking"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.wakeLatency); n != 2 {
		t.Errorf("wake latency series = %d, want 2 (published, started)", n)
	}
	if got := sampleCount(t, m.wakeLatency, "published"); got != 1 {
		t.Errorf("published observations = %d, want 1 (the timer's latency is not known)", got)
	}
}

// sampleCount is a histogram vec's observation count for one label value.
func sampleCount(t *testing.T, h *prometheus.HistogramVec, label string) uint64 {
	t.Helper()
	var d dto.Metric
	if err := h.WithLabelValues(label).(prometheus.Histogram).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram().GetSampleCount()
}

// A tenant lane that went (its consumer removed after an hour without
// work) takes its series with it.
func TestTenantDepthSeriesGo(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, Config{Queues: []string{"default"}})
	m.SetTenantDepths("default", map[[2]string]int{{"normal", "acme"}: 2, {"low", "globex"}: 1})
	m.SetTenantDepths("default", map[[2]string]int{{"low", "globex"}: 3})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series []string
	for _, f := range families {
		if f.GetName() == "agentfleet_queue_depth_by_tenant" {
			for _, s := range f.GetMetric() {
				series = append(series, s.String())
			}
		}
	}
	if len(series) != 1 || !strings.Contains(series[0], "globex") {
		t.Fatalf("series %v; want globex's only", series)
	}
}

// The wait by tenant has at most maxWaitTenants tenant series, and a
// tenant's series goes with its last lane.
func TestTenantWaitSeriesAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, Config{Queues: []string{"default"}})
	for i := range maxWaitTenants + 50 {
		m.TenantWaited("default", fmt.Sprintf("t%d", i), time.Second)
	}
	count := func() (n int, other bool) {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "agentfleet_queue_wait_by_tenant_seconds" {
				for _, s := range f.GetMetric() {
					n++
					other = other || strings.Contains(s.String(), `value:"other"`)
				}
			}
		}
		return n, other
	}
	if n, other := count(); n != maxWaitTenants+1 || !other {
		t.Fatalf("%d series (other: %v); want %d tenants and other", n, other, maxWaitTenants)
	}
	m.SetTenantDepths("default", map[[2]string]int{{"normal", "t1"}: 1})
	if n, _ := count(); n != 2 { // t1 and other
		t.Fatalf("%d series after the depth poll; want t1's and other", n)
	}
}
