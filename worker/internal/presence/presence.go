// Package presence keeps a worker's entry in the agents_workers bucket:
// written when it changes and at least every bus.PresenceInterval,
// deleted when the worker stops, and bounded whatever the tool sources
// announce.
package presence

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/genai"
)

// Check is how often the writer looks for a change worth writing before
// the next bus.PresenceInterval.
const Check = time.Second

// Env is what the writer needs of its worker.
type Env struct {
	// Open opens the bucket; an error: the worker goes on without an
	// entry (SkipEnsureStreams and nobody created it), said once.
	Open func(ctx context.Context) (jetstream.KeyValue, error)
	Key  string // the worker's id
	// Entry is the entry now (Before runs first: the tool sources'
	// changes it observes are in it).
	Entry  func() bus.WorkerPresence
	Before func()
	// Recreate creates the memory buckets again after NATS lost them (a
	// restart) and reports whether it did; nil: never (the worker does
	// not ensure streams).
	Recreate func(ctx context.Context) (bool, error)
	Log      *slog.Logger
}

// Start writes the entry until the returned stop is called, which
// deletes it (within 2 s) and returns once the writer is gone.
func Start(e Env) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		kv, err := e.Open(ctx)
		if err != nil {
			e.Log.Warn("no worker presence", "err", err)
		}
		var last []byte
		var lastPut time.Time
		t := time.NewTicker(Check)
		defer t.Stop()
		for {
			e.Before()
			b, err := json.Marshal(e.Entry())
			if kv != nil && err == nil && (!bytes.Equal(b, last) || time.Since(lastPut) >= bus.PresenceInterval) {
				if err := e.put(ctx, kv, b); err != nil && ctx.Err() == nil {
					e.Log.Warn("writing worker presence failed", "err", err)
				} else {
					last, lastPut = b, time.Now()
				}
			}
			select {
			case <-ctx.Done():
				if kv != nil {
					dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Second)
					_ = kv.Delete(dctx, e.Key)
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

// put writes the entry. A NATS restart loses the memory buckets
// (presence and the shared rate limits): a worker that ensures streams
// creates both again and writes once more.
func (e Env) put(ctx context.Context, kv jetstream.KeyValue, b []byte) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := kv.Put(pctx, e.Key, b)
	if err == nil || !bus.IsBucketGone(err) || e.Recreate == nil {
		return err
	}
	if _, err := e.Recreate(pctx); err != nil {
		return err
	}
	_, err = kv.Put(pctx, e.Key, b)
	return err
}

// Bound keeps of the tools what fits an entry, whatever the sources
// announce (one huge description or thousands of tools would otherwise
// make every write fail, and the worker vanish from the fleet):
// descriptions cut, then as many tools as bus.MaxPresenceTools and
// bus.MaxPresenceToolBytes allow, in the order given.
func Bound(all []bus.PresenceTool) (tools []bus.PresenceTool, truncated bool, omitted int) {
	tools = make([]bus.PresenceTool, 0, min(len(all), bus.MaxPresenceTools))
	size := 0
	for i, t := range all {
		if len(t.Description) > bus.MaxPresenceDescription {
			t.Description, truncated = clip(t.Description, bus.MaxPresenceDescription), true
		}
		// Names and sources are bounded by the sources; clipped here too.
		t.Name, t.Source = clip(t.Name, 128), clip(t.Source, 128)
		b, err := json.Marshal(t)
		if err != nil || len(tools) == bus.MaxPresenceTools || size+len(b)+1 > bus.MaxPresenceToolBytes {
			return tools, true, len(all) - i
		}
		size += len(b) + 1
		tools = append(tools, t)
	}
	return tools, truncated, 0
}

// clip cuts s to n bytes (whole UTF-8 characters) and marks the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return genai.ClipUTF8(s, n) + "…"
}
