package metrics

import (
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Namespace prefixes every metric name.
const Namespace = "agentfleet"

// Other replaces a label value outside the bounded set.
const Other = "other"

// Config bounds the label values. Anything outside these sets is counted as
// "other", so a model or tool name chosen by a caller can never grow the
// number of series.
type Config struct {
	Models []string // the worker's model table; "faux" is always allowed
	Tools  []string // the worker's tool registry
	Queues []string // the queues the worker serves
}

// Metrics are the worker's metrics. All methods are safe for concurrent use.
type Metrics struct {
	models, tools, queues map[string]bool
	names                 []string

	runsStarted      *prometheus.CounterVec
	runsFinished     *prometheus.CounterVec
	childRuns        *prometheus.CounterVec
	runsInFlight     *prometheus.GaugeVec
	runDuration      *prometheus.HistogramVec
	queueWait        *prometheus.HistogramVec
	redeliveries     *prometheus.CounterVec
	resumed          *prometheus.CounterVec
	turns            *prometheus.CounterVec
	modelRequests    *prometheus.CounterVec
	modelDuration    *prometheus.HistogramVec
	timeToFirstToken *prometheus.HistogramVec
	tokens           *prometheus.CounterVec
	cost             *prometheus.CounterVec
	usageUnreported  *prometheus.CounterVec
	usageClamped     *prometheus.CounterVec
	usageExcess      *prometheus.CounterVec
	toolCalls        *prometheus.CounterVec
	toolDuration     *prometheus.HistogramVec
	eventsPublished  prometheus.Counter
	publishFailures  prometheus.Counter
	publishWaits     prometheus.Counter
	publishWaitTime  prometheus.Histogram
	controls         *prometheus.CounterVec
	slotsBusy        prometheus.Gauge
	slotsTotal       prometheus.Gauge
	queueDepth       *prometheus.GaugeVec
	toolSourceUp     *prometheus.GaugeVec // toolsources.go
	toolConflict     *prometheus.GaugeVec // toolsources.go

	approvalsRequested prometheus.Counter
	approvalsResolved  *prometheus.CounterVec
	approvalWait       prometheus.Histogram
	keyWait            *prometheus.HistogramVec
	laneDepth          *prometheus.GaugeVec
	tenantDepth        *prometheus.GaugeVec
	tenantSeries       map[string]map[[2]string]bool // per queue, the tenant series set (under mu)
	tenantWait         *prometheus.HistogramVec
	waitSeries         map[[2]string]bool // queue and tenant of the tenantWait series (under mu)
	approvalsRefused   *prometheus.CounterVec
	runsWaiting        prometheus.Gauge
	runsParked         *prometheus.CounterVec
	wakes              *prometheus.CounterVec
	wakeLatency        *prometheus.HistogramVec

	scheduleFires    prometheus.Counter
	scheduleSkips    *prometheus.CounterVec
	scheduleLateness prometheus.Histogram

	toolsMu sync.RWMutex // tools grows as tool sources list tools (toolsources.go)

	// deadlines of the runs in flight, for runs_past_deadline (computed at
	// scrape time, so a stuck run shows without any event).
	mu        sync.Mutex
	deadlines map[string]time.Time
}

// New creates the metrics and registers them, with the Go runtime and
// process collectors, on reg.
func New(reg prometheus.Registerer, cfg Config) *Metrics {
	m := &Metrics{
		models: set(append([]string{"faux"}, cfg.Models...)),
		tools:  set(cfg.Tools),
		queues: set(cfg.Queues),
	}
	latency := prometheus.ExponentialBucketsRange(0.005, 60, 14)
	long := prometheus.ExponentialBucketsRange(0.5, 7200, 14)

	m.runsStarted = counterVec(reg, m, "runs_started_total", "Runs started (attempts included).", "queue", "model")
	m.runsFinished = counterVec(reg, m, "runs_finished_total", "Runs finished, by status (succeeded, failed, aborted) and reason.", "queue", "model", "status", "reason")
	m.childRuns = counterVec(reg, m, "child_runs_finished_total", "Child runs (run_agent) finished, by depth below their root (1..32) and status.", "depth", "status")
	m.runsInFlight = gaugeVec(reg, m, "runs_in_flight", "Runs this worker is driving now.", "queue")
	m.runDuration = histogramVec(reg, m, "run_duration_seconds", "Run duration from start to run_finished on this worker.", long, "queue", "status")
	m.queueWait = histogramVec(reg, m, "queue_wait_seconds", "Time from submission to the run starting on a worker.", latency, "queue")
	m.redeliveries = counterVec(reg, m, "run_redeliveries_total", "Run requests delivered more than once.", "queue")
	m.resumed = counterVec(reg, m, "runs_resumed_total", "Runs resumed from their events after a redelivery.", "queue")
	m.turns = counterVec(reg, m, "turns_total", "Agent turns (model calls that the loop made).", "model")
	m.modelRequests = counterVec(reg, m, "model_requests_total", "Model requests by outcome (the stop reason: stop, length, toolUse, error, aborted).", "model", "outcome")
	m.modelDuration = histogramVec(reg, m, "model_request_duration_seconds", "Model request duration, from the request to the final event.", latency, "model")
	m.timeToFirstToken = histogramVec(reg, m, "model_time_to_first_token_seconds", "Time from the request to the first streamed content.", latency, "model")
	m.tokens = counterVec(reg, m, "tokens_total", "Tokens by kind (input, output, cache_read, cache_write).", "model", "kind")
	m.cost = counterVec(reg, m, "cost_dollars_total", "Model cost in US dollars, from the model table.", "model")
	m.usageUnreported = counterVec(reg, m, "model_calls_unreported_total", "Model calls settled without reported usage, by what they were charged: estimate (cut off, or the provider sent none: the input estimate plus the output streamed) or none (never sent, or refused before any output).", "model", "charged")
	m.usageClamped = counterVec(reg, m, "model_usage_clamped_total", "Model calls whose reported usage was more than the call could use, charged at the bound.", "model")
	m.usageExcess = counterVec(reg, m, "model_usage_excess_tokens_total", "Tokens providers reported beyond what their calls could use (input, output), not charged.", "model", "kind")
	m.toolCalls = counterVec(reg, m, "tool_calls_total", "Tool calls by outcome (ok, error).", "tool", "outcome")
	m.toolDuration = histogramVec(reg, m, "tool_duration_seconds", "Tool execution duration.", latency, "tool")
	m.eventsPublished = counter(reg, m, "events_published_total", "Run events stored in JetStream.")
	m.publishFailures = counter(reg, m, "event_publish_failures_total", "Run events that could not be published.")
	m.publishWaits = counter(reg, m, "publish_backpressure_waits_total", "Times a run waited for the publish window to drain.")
	m.publishWaitTime = histogram(reg, m, "publish_backpressure_wait_seconds", "How long a run waited for the publish window.", latency)
	m.controls = counterVec(reg, m, "control_messages_total", "Control messages received, by kind (steer, followup, abort).", "kind")
	m.approvalsRequested = counter(reg, m, "approvals_requested_total", "Gated tool calls that asked for a person's answer.")
	m.approvalsResolved = counterVec(reg, m, "approvals_resolved_total", "Gated tool calls resolved, by decision (approve, deny, timeout).", "decision")
	m.approvalWait = histogram(reg, m, "approval_wait_seconds", "How long a gated tool call waited for its answer.", prometheus.ExponentialBucketsRange(0.5, 604800, 16))
	m.approvalsRefused = counterVec(reg, m, "approval_refused_total", "Gated tool calls refused without asking, by reason (max_waiting: too many runs wait).", "reason")
	m.approvalsRefused.WithLabelValues("max_waiting") // exported at 0: a rate from the start
	m.runsWaiting = gauge(reg, m, "runs_waiting", "Runs on this worker waiting (for an approval), with or without a slot.")
	// Parked runs (protocol 1.9): on no worker, so counted where they
	// park and wake, not as a gauge of this worker's.
	m.runsParked = counterVec(reg, m, "runs_parked_total", "Runs this worker parked (their state in NATS, their request acknowledged), by what they wait for (approval, children).", "for")
	m.wakes = counterVec(reg, m, "wakes_total", "Wakes of parked runs this worker published, by what woke them (answer: an approve or abort; timer: a pending approval's timeout; parking: an answer that came while the run parked; other: a concurrency key's place, a child's end).", "by")
	m.wakeLatency = histogramVec(reg, m, "wake_latency_seconds", "Latency of a parked run's wake, by stage: published (the answer or timer stored -> its wake stored, at the waker), started (the wake stored -> the woken attempt's run_started, at the worker it woke on).", latency, "stage")
	for _, f := range []string{waitApproval, waitChildren} {
		m.runsParked.WithLabelValues(f) // exported at 0: a rate from the start
	}
	for _, by := range []string{"answer", "timer", "parking", "other"} {
		m.wakes.WithLabelValues(by)
	}
	m.scheduleFires = counter(reg, m, "schedule_fires_total", "Schedule fires that submitted a run (a redelivered fire counts once).")
	m.scheduleSkips = counterVec(reg, m, "schedule_skips_total", "Schedule fires that submitted nothing, by reason (overlap: the previous run still went; missed: late, and the catch-up policy does not run it; invalid; taken: another request held its run id; stale: the schedule was paused, replaced or deleted since; failed: given up after failing at each delivery).", "reason")
	for _, r := range []string{"overlap", "missed", "invalid", "taken", "stale", "failed"} {
		m.scheduleSkips.WithLabelValues(r) // exported at 0: a rate from the start
	}
	m.scheduleLateness = histogram(reg, m, "schedule_fire_lateness_seconds", "Time from a schedule fire's planned time to its run request being stored.", latency)
	m.slotsBusy = gauge(reg, m, "worker_slots_busy", "Run slots in use on this worker.")
	m.slotsTotal = gauge(reg, m, "worker_slots", "Run slots on this worker (its concurrency).")
	m.deadlines = map[string]time.Time{}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: fqName(m, "runs_past_deadline"),
		Help: "Runs on this worker still going after their timeout (a tool or model ignoring cancellation).",
	}, m.pastDeadline))
	m.queueDepth = gaugeVec(reg, m, "queue_depth", "Run requests waiting or in progress on a queue (consumer pending + ack pending, every lane).", "queue")
	m.laneDepth = gaugeVec(reg, m, "queue_depth_by_priority", "Run requests waiting or in progress on a queue's lanes of a priority (since 1.10).", "queue", "priority")
	m.tenantDepth = gaugeVec(reg, m, "queue_depth_by_tenant", "Run requests waiting or in progress on a queue's tenant lanes of a priority (since 1.10; runs without a tenant are not counted here).", "queue", "priority", "tenant")
	m.tenantWait = histogramVec(reg, m, "queue_wait_by_tenant_seconds", "Time from submission to the run starting, by tenant lane (since 1.10; runs without a tenant are not counted here; a tenant beyond the tenants with a lane is \"other\").", prometheus.ExponentialBucketsRange(0.05, 86400, 16), "queue", "tenant")
	m.keyWait = histogramVec(reg, m, "key_wait_seconds", "How long a run waited, parked, for a place in its concurrency key (since 1.10).", prometheus.ExponentialBucketsRange(0.05, 86400, 16), "queue")
	m.toolSourceUp = gaugeVec(reg, m, "tool_source_up", "Tool sources (mcp:<server>, service:<name>): 1 while up.", "source")
	m.toolConflict = gaugeVec(reg, m, "tool_source_conflict", "Tool services refused because their instances announce different tools: 1 while they differ.", "source")

	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	sort.Strings(m.names)
	return m
}

// Names lists the full names of the metric families this package defines
// (histograms also expose _bucket, _sum and _count).
func (m *Metrics) Names() []string { return append([]string(nil), m.names...) }

func set(values []string) map[string]bool {
	s := make(map[string]bool, len(values))
	for _, v := range values {
		s[v] = true
	}
	return s
}

func bound(s map[string]bool, v string) string {
	if s[v] {
		return v
	}
	return Other
}

// Model bounds a model label value.
func (m *Metrics) Model(id string) string { return bound(m.models, id) }

func (m *Metrics) tool(name string) string {
	m.toolsMu.RLock()
	defer m.toolsMu.RUnlock()
	return bound(m.tools, name)
}
func (m *Metrics) queue(name string) string { return bound(m.queues, name) }
func oneOf(v string, allowed ...string) string {
	for _, a := range allowed {
		if v == a {
			return v
		}
	}
	return Other
}

// RunStarted counts a run attempt starting; wait is the time since submission.
func (m *Metrics) RunStarted(queue, model string, attempt int, wait time.Duration) {
	q := m.queue(queue)
	m.runsStarted.WithLabelValues(q, m.Model(model)).Inc()
	m.runsInFlight.WithLabelValues(q).Inc()
	if attempt > 1 {
		m.redeliveries.WithLabelValues(q).Inc()
	}
	if wait >= 0 {
		m.queueWait.WithLabelValues(q).Observe(wait.Seconds())
	}
}

// RunResumed counts a run continued from its events after a redelivery.
func (m *Metrics) RunResumed(queue string) { m.resumed.WithLabelValues(m.queue(queue)).Inc() }

// RunFinished counts a run ending on this worker. A run that was started
// with RunStarted leaves the in-flight gauge.
func (m *Metrics) RunFinished(queue, model, status, reason string, d time.Duration, started bool) {
	q := m.queue(queue)
	status = oneOf(status, "succeeded", "failed", "aborted")
	m.runsFinished.WithLabelValues(q, m.Model(model), status, oneOf(reason, reasons...)).Inc()
	if started {
		m.runsInFlight.WithLabelValues(q).Dec()
	}
	m.runDuration.WithLabelValues(q, status).Observe(d.Seconds())
}

// ChildRunFinished counts a child run's end by its depth below its root
// (bounded by the protocol: 1..32) and status.
func (m *Metrics) ChildRunFinished(depth int, status string) {
	m.childRuns.WithLabelValues(strconv.Itoa(min(max(depth, 1), 32)), oneOf(status, "succeeded", "failed", "aborted")).Inc()
}

// reasons are the run_finished reasons the label takes ("" for success).
var reasons = []string{"", "model_error", "bad_request", "max_turns", "timeout", "token_budget",
	"aborted_by_user", "gave_up", "lease_lost", "internal"}

// RunHandedBack marks a run that a draining worker stopped and handed back
// to the queue: it leaves the in-flight gauge without finishing.
func (m *Metrics) RunHandedBack(queue string) { m.runsInFlight.WithLabelValues(m.queue(queue)).Dec() }

// Turn counts one agent turn.
func (m *Metrics) Turn(model string) { m.turns.WithLabelValues(m.Model(model)).Inc() }

// ModelUsage is what one model request used.
type ModelUsage struct {
	Input, Output, CacheRead, CacheWrite int
	Cost                                 float64
}

// ModelRequest records one model request: its outcome (stop reason), its
// duration, the time to its first content (negative when none came) and usage.
func (m *Metrics) ModelRequest(model, outcome string, d, ttft time.Duration, u ModelUsage) {
	mod := m.Model(model)
	m.modelRequests.WithLabelValues(mod, oneOf(outcome, "stop", "length", "toolUse", "error", "aborted")).Inc()
	m.modelDuration.WithLabelValues(mod).Observe(d.Seconds())
	if ttft >= 0 {
		m.timeToFirstToken.WithLabelValues(mod).Observe(ttft.Seconds())
	}
	for kind, n := range map[string]int{"input": u.Input, "output": u.Output, "cache_read": u.CacheRead, "cache_write": u.CacheWrite} {
		if n > 0 {
			m.tokens.WithLabelValues(mod, kind).Add(float64(n))
		}
	}
	if u.Cost > 0 {
		m.cost.WithLabelValues(mod).Add(u.Cost)
	}
}

// ModelUsageSettled records how a model call's charge was worked out:
// source "estimated" or "none" counts a call without reported usage;
// "clamped" one whose reported usage passed its bounds, by the excess
// tokens; "reported" nothing.
func (m *Metrics) ModelUsageSettled(model, source string, excessInput, excessOutput int) {
	mod := m.Model(model)
	switch source {
	case "estimated":
		m.usageUnreported.WithLabelValues(mod, "estimate").Inc()
	case "none":
		m.usageUnreported.WithLabelValues(mod, "none").Inc()
	case "clamped":
		m.usageClamped.WithLabelValues(mod).Inc()
		if excessInput > 0 {
			m.usageExcess.WithLabelValues(mod, "input").Add(float64(excessInput))
		}
		if excessOutput > 0 {
			m.usageExcess.WithLabelValues(mod, "output").Add(float64(excessOutput))
		}
	}
}

// ToolCall records one tool call.
func (m *Metrics) ToolCall(tool string, isError bool, d time.Duration) {
	t := m.tool(tool)
	outcome := "ok"
	if isError {
		outcome = "error"
	}
	m.toolCalls.WithLabelValues(t, outcome).Inc()
	m.toolDuration.WithLabelValues(t).Observe(d.Seconds())
}

// EventsPublished counts events stored.
func (m *Metrics) EventsPublished(n int) { m.eventsPublished.Add(float64(n)) }

// PublishFailed counts an event that could not be published.
func (m *Metrics) PublishFailed() { m.publishFailures.Inc() }

// PublishWaited records a wait for the publish window.
func (m *Metrics) PublishWaited(d time.Duration) {
	m.publishWaits.Inc()
	m.publishWaitTime.Observe(d.Seconds())
}

// ControlReceived counts a control message (steer, followup, abort).
func (m *Metrics) ControlReceived(kind string) {
	m.controls.WithLabelValues(oneOf(kind, "steer", "followup", "abort", "approve")).Inc()
}

// ApprovalRequested counts a gated call asking for an answer.
func (m *Metrics) ApprovalRequested() { m.approvalsRequested.Inc() }

// ApprovalResolved counts a gated call's answer (approve, deny, timeout)
// and how long it waited.
func (m *Metrics) ApprovalResolved(decision string, d time.Duration) {
	m.approvalsResolved.WithLabelValues(oneOf(decision, "approve", "deny", "timeout")).Inc()
	m.approvalWait.Observe(d.Seconds())
}

// ApprovalRefused counts a gated call refused without asking.
func (m *Metrics) ApprovalRefused(reason string) {
	m.approvalsRefused.WithLabelValues(oneOf(reason, "max_waiting")).Inc()
}

// ScheduleFired counts a fire that submitted a run, late after its
// planned time.
func (m *Metrics) ScheduleFired(late time.Duration) {
	m.scheduleFires.Inc()
	m.scheduleLateness.Observe(max(late, 0).Seconds())
}

// ScheduleSkipped counts a fire that submitted nothing.
func (m *Metrics) ScheduleSkipped(reason string) {
	m.scheduleSkips.WithLabelValues(oneOf(reason, "overlap", "missed", "invalid", "taken", "stale", "failed")).Inc()
}

// What parked runs wait for (bus.WaitingApproval, bus.WaitingChildren).
const (
	waitApproval = "approval"
	waitChildren = "children"
)

// RunParked counts a run parked while waiting for what.
func (m *Metrics) RunParked(what string) {
	m.runsParked.WithLabelValues(oneOf(what, waitApproval, waitChildren)).Inc()
}

// WakePublished counts a parked run's wake published (by answer, timer,
// parking or other), d after what woke it was stored (negative: not known).
func (m *Metrics) WakePublished(by string, d time.Duration) {
	m.wakes.WithLabelValues(oneOf(by, "answer", "timer", "parking", "other")).Inc()
	if d >= 0 {
		m.wakeLatency.WithLabelValues("published").Observe(d.Seconds())
	}
}

// WokenStarted observes a woken attempt's run_started, d after its wake
// was stored.
func (m *Metrics) WokenStarted(d time.Duration) {
	m.wakeLatency.WithLabelValues("started").Observe(max(d, 0).Seconds())
}

// SetRunsWaiting sets the runs waiting now.
func (m *Metrics) SetRunsWaiting(n int) { m.runsWaiting.Set(float64(n)) }

// SetSlots sets the busy and total run slots.
func (m *Metrics) SetSlots(busy, total int) {
	m.slotsBusy.Set(float64(busy))
	m.slotsTotal.Set(float64(total))
}

// RunDeadline tracks the deadline of a run in flight under key (not a
// label: any unique string); a zero deadline stops tracking it.
func (m *Metrics) RunDeadline(key string, deadline time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if deadline.IsZero() {
		delete(m.deadlines, key)
	} else {
		m.deadlines[key] = deadline
	}
}

func (m *Metrics) pastDeadline() float64 {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, d := range m.deadlines {
		if now.After(d) {
			n++
		}
	}
	return float64(n)
}

// SetLaneDepth sets the depth of a queue's lanes of one priority.
func (m *Metrics) SetLaneDepth(queue, priority string, depth int) {
	m.laneDepth.WithLabelValues(m.queue(queue), priority).Set(float64(depth))
}

// SetTenantDepths sets the depths of a queue's tenant lanes by priority
// and tenant, and removes the series of lanes no longer there (a tenant
// lane's consumer goes after an hour without work).
func (m *Metrics) SetTenantDepths(queue string, depths map[[2]string]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tenantSeries == nil {
		m.tenantSeries = map[string]map[[2]string]bool{}
	}
	q := m.queue(queue)
	for k := range m.tenantSeries[q] {
		if _, ok := depths[k]; !ok {
			m.tenantDepth.DeleteLabelValues(q, k[0], k[1])
			delete(m.tenantSeries[q], k)
		}
	}
	// A wait series goes with the tenant's last lane (bounded as depths).
	laned := map[string]bool{}
	for k := range depths {
		laned[k[1]] = true
	}
	for k := range m.waitSeries {
		if k[0] == q && !laned[k[1]] {
			m.tenantWait.DeleteLabelValues(k[0], k[1])
			delete(m.waitSeries, k)
		}
	}
	if m.tenantSeries[q] == nil {
		m.tenantSeries[q] = map[[2]string]bool{}
	}
	for k, v := range depths {
		m.tenantDepth.WithLabelValues(q, k[0], k[1]).Set(float64(v))
		m.tenantSeries[q][k] = true
	}
}

// maxWaitTenants bounds the tenants with a wait series of their own
// between two depth polls (which remove those without a lane).
const maxWaitTenants = 100

// TenantWaited observes the wait from submission to start of a run from a
// tenant lane. Invariant: at most maxWaitTenants tenant series, and none
// outlives its tenant's lanes by more than a depth poll.
func (m *Metrics) TenantWaited(queue, tenant string, wait time.Duration) {
	if tenant == "" || wait < 0 {
		return
	}
	k := [2]string{m.queue(queue), tenant}
	m.mu.Lock()
	if !m.waitSeries[k] {
		if len(m.waitSeries) >= maxWaitTenants {
			k[1] = Other
		} else {
			if m.waitSeries == nil {
				m.waitSeries = map[[2]string]bool{}
			}
			m.waitSeries[k] = true
		}
	}
	m.mu.Unlock()
	m.tenantWait.WithLabelValues(k[0], k[1]).Observe(wait.Seconds())
}

// KeyWaited observes a run's wait for its concurrency key.
func (m *Metrics) KeyWaited(queue string, d time.Duration) {
	m.keyWait.WithLabelValues(m.queue(queue)).Observe(d.Seconds())
}

// SetQueueDepth sets a queue's depth (pending + ack pending).
func (m *Metrics) SetQueueDepth(queue string, depth int) {
	m.queueDepth.WithLabelValues(m.queue(queue)).Set(float64(depth))
}

func fqName(m *Metrics, name string) string {
	full := prometheus.BuildFQName(Namespace, "", name)
	m.names = append(m.names, full)
	return full
}

// register registers c on reg and returns it.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	reg.MustRegister(c)
	return c
}

func counter(reg prometheus.Registerer, m *Metrics, name, help string) prometheus.Counter {
	return register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: fqName(m, name), Help: help}))
}

func counterVec(reg prometheus.Registerer, m *Metrics, name, help string, labels ...string) *prometheus.CounterVec {
	return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: fqName(m, name), Help: help}, labels))
}

func gauge(reg prometheus.Registerer, m *Metrics, name, help string) prometheus.Gauge {
	return register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: fqName(m, name), Help: help}))
}

func gaugeVec(reg prometheus.Registerer, m *Metrics, name, help string, labels ...string) *prometheus.GaugeVec {
	return register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: fqName(m, name), Help: help}, labels))
}

func histogram(reg prometheus.Registerer, m *Metrics, name, help string, buckets []float64) prometheus.Histogram {
	return register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{Name: fqName(m, name), Help: help, Buckets: buckets}))
}

func histogramVec(reg prometheus.Registerer, m *Metrics, name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: fqName(m, name), Help: help, Buckets: buckets}, labels))
}
