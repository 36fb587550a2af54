package worker

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/schedule"
)

// ScheduleObserver is told what schedule fires did; an Observer that
// implements it gets those calls too (MetricsObserver does).
type ScheduleObserver = schedule.Observer

// startSchedules pulls the schedule fires (worker/internal/schedule).
// Every worker does, whatever queues it serves: a fire submits a request
// to its schedule's queue, which the workers of that queue run.
func (w *Worker) startSchedules(setup context.Context) (func(), error) {
	cons, err := w.js.Consumer(setup, w.names.SchedulesStream(), w.names.FiresConsumer())
	if err != nil {
		w.log.Warn("schedules off: no fires consumer (create the streams with EnsureStreams)", "err", err)
		return func() {}, nil
	}
	env := &schedule.Env{Client: w.c, Log: w.log, Late: w.cfg.ScheduleLate}
	if o, ok := w.obs.(ScheduleObserver); ok {
		env.Obs = o
	}
	stop, err := env.Start(w.hardCtx, cons)
	if err != nil {
		w.log.Warn("schedules off", "err", err)
		return func() {}, nil
	}
	return stop, nil
}

// startScheduleOps answers the schedule operations of the worker's queues
// (bus/scheduleops.go): only workers write AGENTS_SCHEDULES, so what a
// user stores there is what a worker checked. One worker of the queue
// answers each request (a queue group).
//
// Invariants: the NATS callback only hands the request to a goroutine
// (the operation reads and writes NATS); at most maxScheduleOps run at
// once, a request beyond that is answered "failed" (retry) at once; once
// stopping, no operation starts, so wg.Add never races wg.Wait.
func (w *Worker) startScheduleOps(context.Context) (func(), error) {
	const maxScheduleOps = 16
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		stopping bool
		running  int
	)
	answer := func(m *nats.Msg, r bus.ScheduleOpReply) {
		b, err := json.Marshal(r)
		if err == nil {
			err = m.Respond(b)
		}
		if err != nil {
			w.log.Debug("schedule operation: reply failed", "subject", m.Subject, "err", err)
		}
	}
	handle := func(m *nats.Msg) {
		// A reply goes out with the worker's rights: one to a subject
		// other than an inbox would make the worker the requester's
		// deputy (a schedule's def, a KV entry, an abort): not answered.
		if !bus.IsInbox(m.Reply) {
			w.log.Debug("schedule operation: dropped, its reply subject is not an inbox", "subject", m.Subject, "reply", m.Reply)
			return
		}
		queue, name, op, ok := w.names.ParseScheduleOp(m.Subject)
		if !ok {
			answer(m, bus.ScheduleOpReply{Code: bus.ScheduleOpInvalid, Error: "not a schedule operation subject",
				Problems: []string{"the subject must be " + w.names.ScheduleOp("<queue>", "<name>", "<op>")}})
			return
		}
		mu.Lock()
		if stopping || running >= maxScheduleOps {
			mu.Unlock()
			answer(m, bus.ScheduleOpReply{Code: bus.ScheduleOpFailed, Error: "the worker is busy or stopping: retry"})
			return
		}
		running++
		wg.Add(1)
		mu.Unlock()
		go func() {
			defer func() {
				mu.Lock()
				running--
				mu.Unlock()
				wg.Done()
			}()
			ctx, cancel := context.WithTimeout(w.hardCtx, 20*time.Second)
			defer cancel()
			r := w.c.ApplyScheduleOp(ctx, queue, name, op, m.Data)
			if r.Code != "" {
				w.log.Info("schedule operation refused", "op", op, "queue", queue, "schedule", name, "code", r.Code, "err", r.Error)
			} else {
				w.log.Info("schedule operation", "op", op, "queue", queue, "schedule", name)
			}
			answer(m, r)
		}()
	}
	var subs []*nats.Subscription
	unsubscribe := func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}
	for _, q := range w.cfg.Queues {
		sub, err := w.c.Conn().QueueSubscribe(w.names.ScheduleOps(q), bus.ScheduleOpsGroup, handle)
		if err != nil {
			unsubscribe()
			return nil, err
		}
		subs = append(subs, sub)
	}
	return func() {
		unsubscribe()
		mu.Lock()
		stopping = true
		mu.Unlock()
		wg.Wait()
	}, nil
}

// ScheduleFired and ScheduleSkipped report fires to the metrics.
func (o *metricsObserver) ScheduleFired(late time.Duration) { o.m.ScheduleFired(late) }
func (o *metricsObserver) ScheduleSkipped(reason string)    { o.m.ScheduleSkipped(reason) }
