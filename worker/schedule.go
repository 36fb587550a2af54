package worker

import (
	"context"
	"time"

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

// ScheduleFired and ScheduleSkipped report fires to the metrics.
func (o *metricsObserver) ScheduleFired(late time.Duration) { o.m.ScheduleFired(late) }
func (o *metricsObserver) ScheduleSkipped(reason string)    { o.m.ScheduleSkipped(reason) }
