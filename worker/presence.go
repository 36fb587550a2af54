package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/nats-io/nats.go/jetstream"
)

// presenceCheck is how often the worker looks for a change worth writing
// before the next PresenceInterval.
const presenceCheck = time.Second

// startPresence writes the worker's entry in agents_workers every
// PresenceInterval and when its tools or load change, until the returned
// func is called (it then deletes the entry). Without the bucket
// (SkipEnsureStreams and nobody created it) the worker goes on without.
func (w *Worker) startPresence() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	started := time.Now().UTC()
	var wg sync.WaitGroup
	wg.Go(func() {
		kv, err := w.c.Workers(ctx)
		if err != nil {
			w.log.Warn("no worker presence", "err", err)
		}
		var last []byte
		var lastPut time.Time
		t := time.NewTicker(presenceCheck)
		defer t.Stop()
		for {
			w.observeToolSources()
			b, err := json.Marshal(w.presence(started))
			if kv != nil && err == nil && (!bytes.Equal(b, last) || time.Since(lastPut) >= bus.PresenceInterval) {
				if err := w.putPresence(ctx, kv, b); err != nil && ctx.Err() == nil {
					w.log.Warn("writing worker presence failed", "err", err)
				} else {
					last, lastPut = b, time.Now()
				}
			}
			select {
			case <-ctx.Done():
				if kv != nil {
					dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Second)
					_ = kv.Delete(dctx, w.id)
					dcancel()
				}
				return
			case <-t.C:
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

// putPresence writes the entry. A NATS restart loses the memory buckets
// (presence and the shared rate limits): a worker that ensures streams
// creates both again and writes once more.
func (w *Worker) putPresence(ctx context.Context, kv jetstream.KeyValue, b []byte) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := kv.Put(pctx, w.id, b)
	if err == nil || !bus.IsBucketGone(err) || w.cfg.SkipEnsureStreams {
		return err
	}
	created, err := w.c.EnsureMemoryBuckets(pctx, w.streamsConfig())
	if err != nil {
		return err
	}
	if len(created) > 0 {
		w.log.Info("memory buckets created again (NATS lost them)", "buckets", created)
	}
	if slices.Contains(created, w.c.Names().LimitsBucket()) && w.limiter != nil {
		w.limiter.Rewatch()
	}
	_, err = kv.Put(pctx, w.id, b)
	return err
}

// presence is the worker's entry now.
func (w *Worker) presence(started time.Time) bus.WorkerPresence {
	p := bus.WorkerPresence{
		Worker: w.id, Version: w.cfg.Version, Protocol: bus.ProtocolVersion, StartedAt: started,
		Queues: w.cfg.Queues, Slots: w.cfg.Concurrency, Busy: w.running(), Waiting: w.OffSlot(), Tools: []bus.PresenceTool{},
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
	for _, name := range w.toolNames {
		p.Tools = append(p.Tools, bus.PresenceTool{Name: name, Source: "builtin", Description: w.tools[name].Description, Available: true})
	}
	for _, s := range w.cfg.ToolSources {
		_, tools := s.Status()
		for _, t := range tools {
			p.Tools = append(p.Tools, bus.PresenceTool{Name: t.Name, Source: t.Source, Description: t.Description, Available: t.Available})
		}
	}
	slices.SortStableFunc(p.Tools, func(a, b bus.PresenceTool) int {
		if a.Name < b.Name {
			return -1
		} else if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return p
}
