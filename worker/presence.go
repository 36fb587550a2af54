package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/peers"
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
	peers.WarnMixedTools(ctx, w.c.ListWorkers, w.presence(started), w.cfg.Queues, w.log)
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
	p.Tools, p.ToolsTruncated, p.ToolsOmitted = boundPresenceTools(all)
	return p
}

// boundPresenceTools keeps of the tools what fits an entry, whatever the
// sources announce (one huge description or thousands of tools would
// otherwise make every write fail, and the worker vanish from the fleet):
// descriptions cut, then as many tools as bus.MaxPresenceTools and
// bus.MaxPresenceToolBytes allow, in name order.
func boundPresenceTools(all []bus.PresenceTool) (tools []bus.PresenceTool, truncated bool, omitted int) {
	tools = make([]bus.PresenceTool, 0, min(len(all), bus.MaxPresenceTools))
	size := 0
	for i, t := range all {
		if len(t.Description) > bus.MaxPresenceDescription {
			t.Description, truncated = clipString(t.Description, bus.MaxPresenceDescription), true
		}
		// Names and sources are bounded by the sources; clipped here too.
		t.Name, t.Source = clipString(t.Name, 128), clipString(t.Source, 128)
		b, err := json.Marshal(t)
		if err != nil || len(tools) == bus.MaxPresenceTools || size+len(b)+1 > bus.MaxPresenceToolBytes {
			return tools, true, len(all) - i
		}
		size += len(b) + 1
		tools = append(tools, t)
	}
	return tools, truncated, 0
}
