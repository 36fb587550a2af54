// Package peers is the fleet's other workers as this worker sees them in
// their presence entries: which of them serve a tool on a queue, and a
// warning when workers of one queue serve different tools.
package peers

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/toolsource"
)

// Runs are not routed by tools: a run goes to any worker of its queue, so
// workers of one queue with different tools fail the runs that name a tool
// some of them lack. The worker says so when it starts, and such a run's
// bad_request names the workers of the queue that have the tool, read from
// their presence.
const (
	peersRead  = time.Second     // the longest a run's bad request waits for the presence
	peersFresh = 5 * time.Second // how long a read of it is reused
)

// List reads the live workers' presence (bus.Client.ListWorkers).
type List func(ctx context.Context) ([]bus.WorkerPresence, error)

// Cache is the other workers' presence as last read. One read is under
// way at a time, without the lock (no lock over I/O): the others wait for
// it, so a burst of bad requests costs one read.
type Cache struct {
	self string // this worker's id
	list List
	log  *slog.Logger

	mu      sync.Mutex
	at      time.Time
	ws      []bus.WorkerPresence
	reading chan struct{} // closed when the read under way ends; nil: none
}

// New is worker self's cache of its peers' presence.
func New(self string, list List, log *slog.Logger) *Cache {
	return &Cache{self: self, list: list, log: log}
}

// peers returns the live workers' presence, read at most every
// peersFresh and within peersRead (none when it cannot be read).
func (c *Cache) peers(ctx context.Context) []bus.WorkerPresence {
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
		// The read serves the runs that wait on it too: not ended by the
		// run that made it. A failed read is not kept.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), peersRead)
		ws, err := c.list(rctx)
		cancel()
		c.mu.Lock()
		if err != nil {
			c.log.Debug("cannot read the workers' presence", "err", err)
		} else {
			c.ws, c.at = ws, time.Now()
		}
		c.reading = nil
		c.mu.Unlock()
		close(done)
		return ws
	}
}

// queuePeersWith names the other live workers of queue that serve tool
// name (a name or a whole namespace, "<ns>__*").
func (c *Cache) queuePeersWith(ctx context.Context, queue, name string) []string {
	var out []string
	for _, p := range c.peers(ctx) {
		if p.Worker != c.self && slices.Contains(p.Queues, queue) && slices.ContainsFunc(p.Tools, func(t bus.PresenceTool) bool {
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

// UnknownToolNote is what a bad request adds about the other workers of
// the run's queue that have the tool, "" when none has.
func (c *Cache) UnknownToolNote(ctx context.Context, queue, name string) string {
	peers := c.queuePeersWith(ctx, queue, name)
	if len(peers) == 0 {
		return ""
	}
	list := strings.Join(peers[:min(len(peers), 5)], ", ")
	if len(peers) > 5 {
		list += fmt.Sprintf(" and %d more", len(peers)-5)
	}
	return fmt.Sprintf("; workers of queue %q that have it: %s (a run goes to any worker of its queue: give the workers with this tool a queue of their own)", queue, list)
}

// WarnMixedTools logs, at start, each live worker sharing one of queues
// with self whose tools differ (a bounded read; nothing when it fails).
func WarnMixedTools(ctx context.Context, list List, self bus.WorkerPresence, queues []string, log *slog.Logger) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ws, err := list(rctx)
	if err != nil {
		return
	}
	mine := toolSet(self)
	warned := 0
	for _, p := range ws {
		if p.Worker == self.Worker || warned == 5 {
			continue
		}
		var shared []string
		for _, q := range queues {
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
		log.Warn(fmt.Sprintf("worker %s on queue %s serves different tools: a run naming one of them fails (bad_request) on the worker without it, as runs go to any worker of their queue; give workers with different tools queues of their own (--queue)",
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
