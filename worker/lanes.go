package worker

import (
	"context"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/intake"
)

// A queue's lanes (since 1.10; docs/architecture.md, Choosing the next
// run): one durable consumer each, asked in priority order by every pull
// loop, so the order of runs is each worker's choice of the consumer it
// pulls and never a message put back (a Nak spends a delivery).
//
// Invariants:
//  1. A loop asks its lanes only for slots it holds, highest priority
//     first, each for what is still unfilled: no request waits in a
//     buffer, as before lanes.
//  2. A lane that answered a short fetch with nothing is empty at that
//     moment and is asked again only after its recheck (laneRecheck, or
//     tenantRecheck for a tenant lane), or once a request was seen in it
//     (tenants.go, invariant 2). The old consumer is asked every time, as
//     before lanes, so a fleet without lanes fetches as it did.
//  3. Minimum share: a priority with work counts the runs started above
//     it; at laneShare-1 it is asked first, for one start per laneShare-1
//     counted (each start it takes so pays laneShare-1 off the count), so
//     while it has work it gets one start in laneShare on every loop,
//     whatever is above it, and not a whole batch of slots freed together.
//  4. Fair share: within a priority each tenant (the old consumer and the
//     no-tenant lane are the tenant "_") has a pass that grows by
//     1/weight per run started; the lane asked next is the one with work
//     whose tenant's pass is lowest, and a tenant coming back from empty
//     starts at the pass of the last served (vtime), so it gets its share
//     from then on, not a burst for the time it had nothing. While two
//     tenants have work their starts on a loop differ from their weights'
//     proportion by at most one each.
//  5. The long pull, when every lane is empty, goes to the queue's old
//     consumer and waits the full PollWait, as before lanes. A request in
//     another lane of an idle worker is started by the queue's lane loop,
//     woken by the request's LaneSeen (tenants.go), with the free slots
//     there are; a lost LaneSeen waits for the next walk (PollWait at most).

// laneRecheck is how long a no-tenant lane found empty is not asked again:
// a high request behind a busy worker's backlog waits at most this long for
// its lane to be asked, and an unused lane costs 20 short fetches a second
// per loop (a round trip each, beside the loop's hundreds).
const laneRecheck = 50 * time.Millisecond

func (w *Worker) laneRecheck() time.Duration {
	if w.cfg.laneRecheck > 0 {
		return w.cfg.laneRecheck
	}
	return laneRecheck
}

// tenantRecheck is laneRecheck for tenant lanes, of which there may be
// thousands: a new request wakes the lane at once (invariant 2), so the
// recheck only bounds what a lost LaneSeen or a redelivery waits.
const tenantRecheck = time.Second

// laneShare: a lower priority with work gets at least one start in laneShare.
const laneShare = 10

// lane is one lane of one pull loop: its puller and what the loop knows.
type lane struct {
	lane       bus.Lane
	pr         *intake.Puller
	entry      *laneEntry // the book's (tenants.go); nil for the old consumer
	seen       uint64     // entry.seen when last found empty (invariant 2)
	emptyUntil time.Time  // found empty: not asked before then (invariant 2)
	drained    uint64     // the walk in which it gave less than asked
	share      *share     // its tenant's (invariant 4)
}

// share is one tenant's standing within one priority of one loop.
type share struct{ weight, pass float64 }

// laneGroup is one priority's lanes of a loop.
type laneGroup struct {
	lanes      []*lane // the old consumer first, then the no-tenant lane, then tenants
	shares     map[string]*share
	passedOver int     // runs started above it while it had work, less what it was owed (invariant 3)
	vtime      float64 // the pass of the tenant last served (invariant 4)
}

// laneSet is one pull loop's lanes.
type laneSet struct {
	w       *Worker
	queue   string
	all     []*lane
	groups  [3]*laneGroup // high, normal, low
	version uint64        // the book's when last synced (tenants.go, invariant 4)
	walk    uint64
	// fetch starts up to k runs from l; nil: Worker.fetch (tests count
	// starts without runs).
	fetch func(ctx context.Context, log *slog.Logger, l *lane, k, fetchBytes int) int
}

func (w *Worker) newLaneSet(queue string) *laneSet {
	ls := &laneSet{w: w, queue: queue}
	for i := range ls.groups {
		ls.groups[i] = &laneGroup{shares: map[string]*share{}}
	}
	return ls
}

// tenantWeight is a tenant's weight: Config.TenantWeights, else 1.
func (w *Worker) tenantWeight(tenant string) float64 {
	if v, ok := w.cfg.TenantWeights[tenant]; ok && v > 0 {
		return v
	}
	return 1
}

func groupOf(l bus.Lane) int {
	switch l.EffectivePriority() {
	case bus.PriorityHigh:
		return 0
	case bus.PriorityNormal:
		return 1
	}
	return 2
}

// addLane adds a lane read through pr; entry is nil for the old consumer.
func (ls *laneSet) addLane(l bus.Lane, pr *intake.Puller, entry *laneEntry) {
	g := ls.groups[groupOf(l)]
	tenant := l.Tenant
	if tenant == "" {
		tenant = bus.NoTenant
	}
	sh := g.shares[tenant]
	if sh == nil {
		sh = &share{weight: ls.w.tenantWeight(tenant), pass: g.vtime}
		g.shares[tenant] = sh
	}
	nl := &lane{lane: l, pr: pr, entry: entry, share: sh}
	ls.all = append(ls.all, nl)
	g.lanes = append(g.lanes, nl)
	slices.SortStableFunc(g.lanes, func(a, b *lane) int { return rank(a.lane) - rank(b.lane) })
}

func rank(l bus.Lane) int {
	switch {
	case l.Old():
		return 0
	case l.Tenant == bus.NoTenant:
		return 1
	}
	return 2
}

func (ls *laneSet) has(l bus.Lane) bool {
	return slices.ContainsFunc(ls.all, func(x *lane) bool { return x.lane == l })
}

func (ls *laneSet) close() {
	for _, l := range ls.all {
		l.pr.Close()
	}
}

// sync adds the lanes the book got consumers for since the last sync.
func (ls *laneSet) sync(log *slog.Logger) {
	b := ls.w.lanes
	v := b.version.Load()
	if v == ls.version {
		return
	}
	m := map[bus.Lane]*laneEntry{}
	b.entries(ls.queue, m)
	for l, e := range m {
		if ls.has(l) {
			continue
		}
		pr, err := intake.NewPuller(ls.w.c.Conn(), e.cons)
		if err != nil {
			log.Warn("lane: cannot pull it", "priority", l.Priority, "tenant", l.Tenant, "err", err)
			return // tried again at the next sync
		}
		ls.addLane(l, pr, e)
	}
	ls.version = v
}

// ready reports whether l may be asked now (invariant 2).
func (ls *laneSet) ready(l *lane, now time.Time) bool {
	if l.drained == ls.walk {
		return false
	}
	return !now.Before(l.emptyUntil) || (l.entry != nil && l.entry.seen.Load() != l.seen)
}

func (ls *laneSet) hasWork(g *laneGroup, now time.Time) bool {
	return slices.ContainsFunc(g.lanes, func(l *lane) bool { return ls.ready(l, now) })
}

// pick is the lane of g to ask next: the ready one whose tenant's pass is
// lowest (invariant 4); nil when none is ready.
func (ls *laneSet) pick(g *laneGroup, now time.Time) *lane {
	var best *lane
	for _, l := range g.lanes {
		if !ls.ready(l, now) {
			continue
		}
		l.share.pass = max(l.share.pass, g.vtime)
		if best == nil || l.share.pass < best.share.pass {
			best = l
		}
	}
	return best
}

// quota is how many of m slots l may take before another tenant of g with
// work is due (at least one).
func (ls *laneSet) quota(g *laneGroup, l *lane, m int, now time.Time) int {
	next := math.Inf(1)
	for _, o := range g.lanes {
		if o.share != l.share && ls.ready(o, now) {
			next = min(next, max(o.share.pass, g.vtime))
		}
	}
	if math.IsInf(next, 1) {
		return m
	}
	return min(m, max(1, int(math.Ceil((next-l.share.pass)*l.share.weight))))
}

// turn is one priority's turn in a walk; a promoted turn is its minimum
// share, asked first (invariant 3).
type turn struct {
	g        *laneGroup
	promoted bool
}

// order is the priorities' turns in the order to take them now: the
// promoted ones, then every priority, highest first (invariant 3).
func (ls *laneSet) order(now time.Time) []turn {
	out := make([]turn, 0, 2*len(ls.groups))
	for _, g := range ls.groups {
		if g.passedOver >= laneShare-1 && ls.hasWork(g, now) {
			out = append(out, turn{g, true})
		}
	}
	for _, g := range ls.groups {
		out = append(out, turn{g, false})
	}
	return out
}

// fetchLanes fills up to n held slots from the lanes; it returns how many
// runs it started. Each started run owns one slot (fetch).
func (ls *laneSet) fetchLanes(ctx context.Context, log *slog.Logger, n, fetchBytes int) int {
	ls.walk++
	now := time.Now()
	got := 0
	for _, t := range ls.order(now) {
		g, limit := t.g, n
		if t.promoted { // its share only (invariant 3)
			limit = min(n, got+g.passedOver/(laneShare-1))
		}
		for got < limit && ctx.Err() == nil {
			l := ls.pick(g, now)
			if l == nil {
				g.passedOver = 0 // empty now
				break
			}
			k := ls.quota(g, l, limit-got, now)
			var seen uint64
			if l.entry != nil {
				seen = l.entry.seen.Load() // before the fetch: a request seen during it wakes the lane
			}
			var r int
			if ls.fetch != nil {
				r = ls.fetch(ctx, log, l, k, fetchBytes)
			} else {
				r = ls.w.fetch(ctx, log, ls.queue, l.pr, k, fetchBytes)
			}
			if r < k {
				l.drained = ls.walk
			}
			if r == 0 {
				if !l.lane.Old() { // asked every time, as before lanes (invariant 2)
					l.seen = seen
					l.emptyUntil = now.Add(ls.w.laneRecheck())
					if l.lane.Tenant != bus.NoTenant {
						l.emptyUntil = now.Add(tenantRecheck)
					}
				}
				continue
			}
			g.vtime = max(g.vtime, l.share.pass)
			l.share.pass += float64(r) / l.share.weight
			got += r
			if t.promoted {
				g.passedOver = max(0, g.passedOver-r*(laneShare-1))
			} else {
				g.passedOver = 0 // served in its own turn
			}
			for _, o := range ls.groups[slices.Index(ls.groups[:], g)+1:] { // lower priorities waited
				if ls.hasWork(o, now) {
					o.passedOver += r
				}
			}
		}
	}
	return got
}

// openLanes finds the lane consumers of a queue; a lane whose consumer
// does not exist (streams an operator created before 1.10) is left out
// with a warning: its requests wait for a worker that has it.
func (w *Worker) openLanes(ctx context.Context, queue string) []jetstream.Consumer {
	var out []jetstream.Consumer
	for _, l := range bus.Lanes(queue) {
		if l.Old() {
			continue
		}
		c, err := w.js.Consumer(ctx, w.names.RunsStream(), w.names.LaneConsumer(l))
		if err != nil {
			w.log.Warn("lane without its consumer: this worker does not take its requests", "queue", queue,
				"priority", l.Priority, "consumer", w.names.LaneConsumer(l), "err", err)
			continue
		}
		out = append(out, c)
	}
	return out
}

// laneOfConsumer names the lane a consumer (from openLanes) serves.
func (w *Worker) laneOfConsumer(queue string, c jetstream.Consumer) bus.Lane {
	name := c.CachedInfo().Name
	for _, l := range bus.Lanes(queue) {
		if w.names.LaneConsumer(l) == name {
			return l
		}
	}
	return bus.Lane{Queue: queue}
}
