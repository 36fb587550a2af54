package worker

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/metrics"
)

// MetricsObserver reports what the worker observes to Prometheus metrics.
func MetricsObserver(m *metrics.Metrics) Observer {
	return &metricsObserver{m: m, active: map[string]bool{}}
}

type metricsObserver struct {
	m *metrics.Metrics

	mu     sync.Mutex
	active map[string]bool // run attempts started and not yet left
}

func attemptKey(r RunInfo) string { return r.ID + ":" + strconv.Itoa(r.Attempt) }

// leave reports whether the attempt had started, and forgets it.
func (o *metricsObserver) leave(r RunInfo) bool {
	k := attemptKey(r)
	o.mu.Lock()
	started := o.active[k]
	delete(o.active, k)
	o.mu.Unlock()
	if started {
		o.m.RunDeadline(k, time.Time{})
	}
	return started
}

// modelLabel maps "provider/id" to the label metrics bound: the model id,
// or "faux" for any scripted model.
func modelLabel(model string) string {
	provider, id, ok := strings.Cut(model, "/")
	if !ok {
		return model
	}
	if provider == "faux" {
		return "faux"
	}
	return id
}

func (o *metricsObserver) RunStarted(r RunInfo) {
	wait := time.Duration(-1)
	if !r.SubmittedAt.IsZero() && !r.StartedAt.IsZero() {
		wait = max(r.StartedAt.Sub(r.SubmittedAt), 0)
	}
	k := attemptKey(r)
	o.mu.Lock()
	o.active[k] = true
	o.mu.Unlock()
	o.m.RunStarted(r.Queue, modelLabel(r.Model), r.Attempt, wait)
	if r.Attempt <= 1 { // a later attempt's wait holds the earlier ones' run
		o.m.TenantWaited(r.Queue, r.Tenant, wait)
	}
	o.m.RunDeadline(k, r.Deadline)
}

// RunFinished also comes for runs that never started on this worker (bad
// requests, give-ups): only a started one leaves the in-flight gauge.
func (o *metricsObserver) RunFinished(r RunInfo, f bus.RunFinished) {
	o.m.RunFinished(r.Queue, modelLabel(r.Model), f.Status, f.Reason, time.Duration(f.DurationMs)*time.Millisecond, o.leave(r))
	if r.Depth > 0 {
		o.m.ChildRunFinished(r.Depth, f.Status)
	}
}

func (o *metricsObserver) RunHandedBack(r RunInfo) {
	if o.leave(r) {
		o.m.RunHandedBack(r.Queue)
	}
}
func (o *metricsObserver) Turn(r RunInfo) { o.m.Turn(modelLabel(r.Model)) }

func (o *metricsObserver) ModelRequest(r RunInfo, mr ModelRequest) {
	ttft := mr.TimeToFirstEvent
	if ttft <= 0 {
		ttft = -1
	}
	u := mr.Usage
	o.m.ModelRequest(modelLabel(mr.Model), string(mr.StopReason), mr.Duration, ttft, metrics.ModelUsage{
		Input: u.Input, Output: u.Output, CacheRead: u.CacheRead, CacheWrite: u.CacheWrite, Cost: u.Cost.Total,
	})
	o.m.ModelUsageSettled(modelLabel(mr.Model), mr.UsageSource, mr.ExcessInput, mr.ExcessOutput)
}

func (o *metricsObserver) ToolCall(_ RunInfo, t ToolCall) {
	o.m.ToolCall(t.Tool, t.Err != nil, t.Duration)
}

func (o *metricsObserver) EventPublished()             { o.m.EventsPublished(1) }
func (o *metricsObserver) PublishFailed(error)         { o.m.PublishFailed() }
func (o *metricsObserver) PublishWait(d time.Duration) { o.m.PublishWaited(d) }
func (o *metricsObserver) ControlReceived(kind string) { o.m.ControlReceived(kind) }
func (o *metricsObserver) Slots(busy, total int)       { o.m.SetSlots(busy, total) }
func (o *metricsObserver) ApprovalRequested(RunInfo)   { o.m.ApprovalRequested() }
func (o *metricsObserver) ApprovalResolved(_ RunInfo, decision string, d time.Duration) {
	o.m.ApprovalResolved(decision, d)
}
func (o *metricsObserver) ApprovalRefused(_ RunInfo, reason string) { o.m.ApprovalRefused(reason) }
func (o *metricsObserver) KeyWaited(r RunInfo, d time.Duration)     { o.m.KeyWaited(r.Queue, d) }
func (o *metricsObserver) RunParked(_ RunInfo, what string)         { o.m.RunParked(what) }
func (o *metricsObserver) WakePublished(by string, d time.Duration) { o.m.WakePublished(by, d) }
func (o *metricsObserver) WokenStarted(_ RunInfo, d time.Duration)  { o.m.WokenStarted(d) }

// RunsWaiting also moves the run's deadline: none while it waits, a
// later one after (waiting does not count against the timeout).
func (o *metricsObserver) RunsWaiting(r RunInfo, n int) {
	o.m.SetRunsWaiting(n)
	k := attemptKey(r)
	o.mu.Lock()
	active := o.active[k]
	o.mu.Unlock()
	if active {
		o.m.RunDeadline(k, r.Deadline)
	}
}

// PollQueueDepth sets each queue's depth (its consumers' pending plus ack
// pending, every lane's: what KEDA scales on) and, with setLane, each
// priority's (since 1.10) every interval until ctx is done. A failed poll
// keeps the last value; readiness reports NATS trouble.
func PollQueueDepth(ctx context.Context, c *bus.Client, queues []string, interval time.Duration, set func(queue string, depth int), setLane func(queue, priority string, depth int), setTenants func(queue string, depths map[[2]string]int)) {
	n := c.Names()
	poll := func() {
		// One listing of AGENTS_RUNS' consumers: the old one, the no-tenant
		// lanes and every tenant lane (since 1.10: tenant lanes are made by
		// the workers that see their requests, so they are not known here).
		pctx, cancel := context.WithTimeout(ctx, interval)
		defer cancel()
		s, err := c.JetStream().Stream(pctx, n.RunsStream())
		if err != nil {
			return
		}
		type depth struct {
			total   int
			byPrio  map[string]int
			byLane  map[[2]string]int
			counted bool
		}
		d := map[string]*depth{}
		for _, q := range queues {
			d[q] = &depth{byPrio: map[string]int{}, byLane: map[[2]string]int{}}
		}
		list := s.ListConsumers(pctx)
		for info := range list.Info() {
			l, ok := laneOfConsumerInfo(n, info)
			qd := d[l.Queue]
			if !ok || qd == nil {
				continue
			}
			v := int(info.NumPending) + info.NumAckPending
			qd.total += v
			qd.byPrio[l.EffectivePriority()] += v
			if !l.Old() && l.Tenant != bus.NoTenant {
				qd.byLane[[2]string{l.Priority, l.Tenant}] += v
			}
			qd.counted = true
		}
		if list.Err() != nil {
			return // a partial listing would understate the depth
		}
		for _, q := range queues {
			qd := d[q]
			if !qd.counted {
				continue
			}
			set(q, qd.total)
			if setLane != nil {
				for _, p := range bus.Priorities() {
					setLane(q, p, qd.byPrio[p])
				}
			}
			if setTenants != nil {
				setTenants(q, qd.byLane)
			}
		}
	}
	poll()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			poll()
		}
	}
}

// laneOfConsumerInfo is the lane a consumer of AGENTS_RUNS serves: the old
// subject's (workers-<queue>) or a lane's, by its filter.
func laneOfConsumerInfo(n bus.Names, info *jetstream.ConsumerInfo) (bus.Lane, bool) {
	f := info.Config.FilterSubject
	if sub, ok := strings.CutSuffix(f, ".>"); ok {
		if l, _, err := n.ParseRequest(sub + ".x"); err == nil && !l.Old() {
			return l, true
		}
	}
	if q, ok := strings.CutPrefix(info.Name, "workers-"); ok && info.Name == n.Consumer(q) && f == n.QueueFilter(q) {
		return bus.Lane{Queue: q}, true
	}
	return bus.Lane{}, false
}
