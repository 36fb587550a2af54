package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/toolsource"
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
	w.warnMixedTools(ctx, w.presence(started))
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

// Runs are not routed by tools: a run goes to any worker of its queue, so
// workers of one queue with different tools fail the runs that name a tool
// some of them lack. The worker says so when it starts, and such a run's
// bad_request names the workers of the queue that have the tool, read from
// their presence.
const (
	peersRead  = time.Second     // the longest a run's bad request waits for the presence
	peersFresh = 5 * time.Second // how long a read of it is reused
)

// peerCache is the other workers' presence as last read. One read is under
// way at a time, without the lock (no lock over I/O): the others wait for
// it, so a burst of bad requests costs one read.
type peerCache struct {
	mu      sync.Mutex
	at      time.Time
	ws      []bus.WorkerPresence
	reading chan struct{} // closed when the read under way ends; nil: none
}

// peers returns the live workers' presence, read at most every
// peersFresh and within peersRead (none when it cannot be read).
func (w *Worker) peers(ctx context.Context) []bus.WorkerPresence {
	c := &w.peerCache
	for {
		c.mu.Lock()
		if !c.at.IsZero() && time.Since(c.at) < peersFresh {
			ws := c.ws
			c.mu.Unlock()
			return ws
		}
		if c.reading != nil {
			done := c.reading
			c.mu.Unlock()
			select {
			case <-done:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		done := make(chan struct{})
		c.reading = done
		c.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, peersRead)
		ws, err := w.c.ListWorkers(rctx)
		cancel()
		if err != nil {
			w.log.Debug("cannot read the workers' presence", "err", err)
		}
		c.mu.Lock()
		c.ws, c.at, c.reading = ws, time.Now(), nil
		c.mu.Unlock()
		close(done)
		return ws
	}
}

// queuePeersWith names the other live workers of queue that serve tool
// name (a name or a whole namespace, "<ns>__*").
func (w *Worker) queuePeersWith(ctx context.Context, queue, name string) []string {
	var out []string
	for _, p := range w.peers(ctx) {
		if p.Worker != w.id && slices.Contains(p.Queues, queue) && slices.ContainsFunc(p.Tools, func(t bus.PresenceTool) bool {
			return t.Available && toolMatches(t.Name, name)
		}) {
			out = append(out, p.Worker)
		}
	}
	return out
}

// toolMatches reports whether tool is name, or in name's namespace when
// name is "<ns>__*".
func toolMatches(tool, name string) bool {
	if ns, rest, ok := toolsource.SplitName(name); ok && rest == "*" {
		return strings.HasPrefix(tool, ns+toolsource.Separator)
	}
	return tool == name
}

// unknownToolPeers is what a bad request adds about the other workers of
// the run's queue that have the tool, "" when none has.
func (w *Worker) unknownToolPeers(ctx context.Context, queue, name string) string {
	peers := w.queuePeersWith(ctx, queue, name)
	if len(peers) == 0 {
		return ""
	}
	list := strings.Join(peers[:min(len(peers), 5)], ", ")
	if len(peers) > 5 {
		list += fmt.Sprintf(" and %d more", len(peers)-5)
	}
	return fmt.Sprintf("; workers of queue %q that have it: %s (a run goes to any worker of its queue: give the workers with this tool a queue of their own)", queue, list)
}

// warnMixedTools logs, at start, each live worker sharing a queue with
// this one whose tools differ (a bounded read; nothing when it fails).
func (w *Worker) warnMixedTools(ctx context.Context, self bus.WorkerPresence) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ws, err := w.c.ListWorkers(rctx)
	if err != nil {
		return
	}
	mine := toolSet(self)
	warned := 0
	for _, p := range ws {
		if p.Worker == w.id || warned == 5 {
			continue
		}
		var shared []string
		for _, q := range w.cfg.Queues {
			if slices.Contains(p.Queues, q) {
				shared = append(shared, q)
			}
		}
		theirs := toolSet(p)
		only, lacks := difference(theirs, mine), difference(mine, theirs)
		if len(shared) == 0 || len(only)+len(lacks) == 0 {
			continue
		}
		warned++
		w.log.Warn(fmt.Sprintf("worker %s on queue %s serves different tools: a run naming one of them fails (bad_request) on the worker without it, as runs go to any worker of their queue; give workers with different tools queues of their own (--queue)",
			p.Worker, strings.Join(shared, ",")), "peer", p.Worker, "peerOnly", clipList(only), "thisOnly", clipList(lacks))
	}
}

// toolSet is the names of the tools a worker lists.
func toolSet(p bus.WorkerPresence) []string {
	var names []string
	for _, t := range p.Tools {
		names = append(names, t.Name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// difference is what a has and b lacks (both sorted).
func difference(a, b []string) []string {
	var out []string
	for _, n := range a {
		if _, found := slices.BinarySearch(b, n); !found {
			out = append(out, n)
		}
	}
	return out
}

// clipList keeps a log attribute short: the first 10 names and a count.
func clipList(names []string) string {
	if len(names) > 10 {
		return strings.Join(names[:10], ",") + fmt.Sprintf(",… (%d in all)", len(names))
	}
	return strings.Join(names, ",")
}
