package worker

import (
	"context"
	"slices"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/peers"
	"github.com/agentfleet/agentfleet/worker/internal/presence"
)

// startPresence writes the worker's entry in agents_workers every
// PresenceInterval and when its tools or load change, until the returned
// func is called (it then deletes the entry): worker/internal/presence.
func (w *Worker) startPresence() (stop func()) {
	started := time.Now().UTC()
	peers.WarnMixedTools(context.Background(), w.c.ListWorkers, w.presence(started), w.cfg.Queues, w.log)
	e := presence.Env{Open: w.c.Workers, Key: w.id, Log: w.log, Before: w.observeToolSources,
		Entry: func() bus.WorkerPresence { return w.presence(started) }}
	if !w.cfg.SkipEnsureStreams {
		e.Recreate = w.recreateMemoryBuckets
	}
	return presence.Start(e)
}

// recreateMemoryBuckets creates the memory buckets again (NATS lost them
// in a restart): the presence's and the shared rate limits', which the
// limiter then watches again.
func (w *Worker) recreateMemoryBuckets(ctx context.Context) (bool, error) {
	created, err := w.c.EnsureMemoryBuckets(ctx, w.streamsConfig())
	if err != nil {
		return false, err
	}
	if len(created) > 0 {
		w.log.Info("memory buckets created again (NATS lost them)", "buckets", created)
	}
	if slices.Contains(created, w.c.Names().LimitsBucket()) && w.limiter != nil {
		w.limiter.Rewatch()
	}
	return len(created) > 0, nil
}

// presence is the worker's entry now.
func (w *Worker) presence(started time.Time) bus.WorkerPresence {
	p := bus.WorkerPresence{
		Worker: w.id, Version: w.cfg.Version, Protocol: bus.ProtocolVersion, StartedAt: started,
		Queues: w.cfg.Queues, Slots: w.cfg.Concurrency, Busy: w.running(), Waiting: w.OffSlot(),
		DefaultModel: w.cfg.DefaultModel,
	}
	for name, pr := range w.cfg.Providers {
		if ml, ok := pr.(ModelLister); ok {
			for _, id := range ml.Models() {
				p.Models = append(p.Models, name+"/"+id)
			}
		}
	}
	slices.Sort(p.Models)
	var all []bus.PresenceTool
	for _, name := range w.toolNames {
		all = append(all, bus.PresenceTool{Name: name, Source: "builtin", Description: w.tools[name].Description, Available: true})
	}
	for _, s := range w.cfg.ToolSources {
		_, tools := s.Status()
		for _, t := range tools {
			all = append(all, bus.PresenceTool{Name: t.Name, Source: t.Source, Description: t.Description, Available: t.Available})
		}
	}
	slices.SortStableFunc(all, func(a, b bus.PresenceTool) int {
		if a.Name < b.Name {
			return -1
		} else if a.Name > b.Name {
			return 1
		}
		return 0
	})
	p.Tools, p.ToolsTruncated, p.ToolsOmitted = presence.Bound(all)
	return p
}
