package worker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// The lane book: every lane of this worker's queues other than the old
// subject, with its consumer once it has one (since 1.10; docs/
// architecture.md, Choosing the next run). Tenant lanes are learned from
// the requests AGENTS_RUNS republishes, headers only (Names.LaneSeen), and
// from the lane consumers that exist at start.
//
// Invariants:
//  1. The LaneSeen callback does no I/O: it counts the lane's requests
//     seen and wakes the queue's lane loop; a lane new to the worker is
//     handed to the book's goroutine, which creates its consumer
//     (CreateOrUpdateConsumer: workers racing to create it agree).
//  2. A lane's seen count only grows. A loop that found the lane empty
//     asks it again once the count moved (a request came) or after its
//     recheck, whichever is first: a lost republish costs the recheck.
//  3. The book holds at most maxTenantLanes tenant lanes: a flood of
//     made-up tenants costs consumers up to that bound, no more (logged).
//  4. version grows after a lane got its consumer: a loop that saw the
//     version before has every lane with a consumer it could see then.
//  5. No lane holding requests stays without a consumer for longer than
//     laneRescan: the LaneSeen subscription is at the server before the
//     start's read of the lanes' subjects, and the read is repeated every
//     laneRescan (a lost republish, a failed create, a full creator).

// maxTenantLanes bounds the tenant lanes (queue, priority, tenant) one
// worker serves (invariant 3).
const maxTenantLanes = 4096

type laneBook struct {
	mu      sync.Mutex
	lanes   map[bus.Lane]*laneEntry
	tenants int                      // tenant lanes in lanes (invariant 3)
	wake    map[string]chan struct{} // per queue, buffer 1: its lane loop
	create  chan bus.Lane            // new lanes, for run's goroutine
	version atomic.Uint64            // invariant 4
	full    atomic.Bool              // invariant 3, logged once
}

type laneEntry struct {
	cons jetstream.Consumer // nil until created; set under book.mu
	seen atomic.Uint64      // invariant 2
}

func newLaneBook(queues []string) *laneBook {
	b := &laneBook{lanes: map[bus.Lane]*laneEntry{}, wake: map[string]chan struct{}{}, create: make(chan bus.Lane, 1024)}
	for _, q := range queues {
		b.wake[q] = make(chan struct{}, 1)
	}
	return b
}

// add notes a lane with its consumer (nil: to be created).
func (b *laneBook) add(l bus.Lane, c jetstream.Consumer) {
	b.mu.Lock()
	e := b.lanes[l]
	if e == nil {
		e = &laneEntry{}
		b.lanes[l] = e
		if l.Tenant != bus.NoTenant {
			b.tenants++
		}
	}
	if c != nil && e.cons == nil {
		e.cons = c
		b.version.Add(1)
	}
	b.mu.Unlock()
	if c != nil {
		b.poke(l.Queue)
	}
}

// forget drops a lane whose consumer could not be made: the next request
// seen in it tries again.
func (b *laneBook) forget(l bus.Lane) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.lanes[l]; e != nil && e.cons == nil {
		delete(b.lanes, l)
		if l.Tenant != bus.NoTenant {
			b.tenants--
		}
	}
}

func (b *laneBook) poke(queue string) {
	select {
	case b.wake[queue] <- struct{}{}:
	default:
	}
}

// seen is the LaneSeen callback's work (invariant 1): it reports whether
// the lane is new to the book and was queued for its consumer.
func (b *laneBook) seen(l bus.Lane) (created, full bool) {
	if _, ok := b.wake[l.Queue]; !ok {
		return false, false // not one of this worker's queues
	}
	b.mu.Lock()
	e := b.lanes[l]
	switch {
	case e != nil:
		e.seen.Add(1)
	case l.Tenant != bus.NoTenant && b.tenants >= maxTenantLanes:
		full = true
	default:
		select {
		case b.create <- l:
			b.lanes[l] = &laneEntry{}
			if l.Tenant != bus.NoTenant {
				b.tenants++
			}
			created = true
		default: // the creator is behind: the next request seen tries again
		}
	}
	b.mu.Unlock()
	b.poke(l.Queue)
	return created, full
}

// entries are the lanes of queue that have their consumer.
func (b *laneBook) entries(queue string, into map[bus.Lane]*laneEntry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for l, e := range b.lanes {
		if l.Queue == queue && e.cons != nil {
			into[l] = e
		}
	}
}

func (b *laneBook) consumer(l bus.Lane) jetstream.Consumer {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.lanes[l]; e != nil {
		return e.cons
	}
	return nil
}

// startLaneBook fills the book with the lanes that have consumers (the
// fixed ones from openLanes, and tenant lanes a worker made before),
// looks for tenant lanes holding requests without one, subscribes to
// LaneSeen, and creates the consumers of lanes it learns until stop.
func (w *Worker) startLaneBook(setup context.Context, fixed [][]jetstream.Consumer) (stop func(), err error) {
	b := w.lanes
	for i, q := range w.cfg.Queues {
		for _, c := range fixed[i] {
			b.add(w.laneOfConsumer(q, c), c)
		}
	}
	lister := w.runsStream.ListConsumers(setup)
	for info := range lister.Info() {
		l, ok := w.tenantLaneOf(info.Config.FilterSubject)
		if !ok {
			continue
		}
		if c, err := w.js.Consumer(setup, w.names.RunsStream(), info.Name); err == nil {
			b.add(l, c)
		}
	}
	if err := lister.Err(); err != nil {
		w.log.Warn("tenant lanes: cannot list the lane consumers; lanes are learned from new requests", "err", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(setup))
	var subs []*nats.Subscription
	unsub := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	for _, q := range w.cfg.Queues {
		s, err := w.c.Conn().Subscribe(w.names.LaneSeen(q), w.onLaneSeen)
		if err != nil {
			unsub()
			cancel()
			return nil, err
		}
		s.SetPendingLimits(-1, 16<<20)
		subs = append(subs, s)
	}
	// Invariant 5: subscribed at the server before the read below, so a
	// request stored after the read is seen by the subscription.
	if err := w.c.Conn().FlushWithContext(setup); err != nil {
		unsub()
		cancel()
		return nil, err
	}
	w.rescanLanes(setup)
	rescan := w.cfg.laneRescan
	if rescan <= 0 {
		rescan = laneRescan
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(rescan)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case l := <-b.create:
				w.createLane(ctx, l)
			case <-tick.C:
				w.rescanLanes(ctx)
			}
		}
	}()
	return func() { unsub(); cancel(); <-done }, nil
}

// laneRescan is how often a worker reads its queues' lane subjects for
// lanes it has no consumer for (invariant 5): a republish lost (a
// reconnect, a slow consumer), a consumer that could not be made, or a
// full creator costs at most this wait.
const laneRescan = 10 * time.Second

// rescanLanes notes every lane holding requests that has no consumer
// (invariant 5): at start, requests waiting in tenant lanes whose consumer
// went (an hour without a worker); then the net under lost republishes.
func (w *Worker) rescanLanes(ctx context.Context) {
	b := w.lanes
	for _, q := range w.cfg.Queues {
		info, err := w.runsStream.Info(ctx, jetstream.WithSubjectFilter(w.names.LaneQueueAll(q)))
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("tenant lanes: cannot read the lanes' subjects", "queue", q, "err", err)
			}
			continue
		}
		for subj := range info.State.Subjects {
			if l, _, err := w.names.ParseRequest(subj); err == nil && b.consumer(l) == nil {
				b.seen(l)
			}
		}
	}
}

// tenantLaneOf is the tenant lane a lane consumer's filter names.
func (w *Worker) tenantLaneOf(filter string) (bus.Lane, bool) {
	subj, ok := strings.CutSuffix(filter, ".>")
	if !ok {
		return bus.Lane{}, false
	}
	l, _, err := w.names.ParseRequest(subj + ".x")
	if err != nil || l.Old() || l.Tenant == bus.NoTenant || !slices.Contains(w.cfg.Queues, l.Queue) {
		return bus.Lane{}, false
	}
	return l, true
}

// onLaneSeen notes a stored lane request (invariant 1).
func (w *Worker) onLaneSeen(m *nats.Msg) {
	if w.cfg.dropLaneSeen {
		return // tests: every republish lost
	}
	l, _, err := w.names.ParseLaneSeen(m.Subject)
	if err != nil {
		return // the worker that takes it terminates it
	}
	if _, full := w.lanes.seen(l); full && w.lanes.full.CompareAndSwap(false, true) {
		w.log.Warn("tenant lanes: too many; requests of further tenants wait for a worker restart", "max", maxTenantLanes)
	}
}

// createLane makes a new lane's consumer, like its priority's no-tenant
// lane's but removed after an hour without a pull (Names.LaneConsumerConfig).
func (w *Worker) createLane(ctx context.Context, l bus.Lane) {
	cfg := w.names.LaneConsumerConfig(l, w.cfg.AckWait, w.cfg.MaxDeliver, 10_000, 0)
	if base := w.lanes.consumer(bus.Lane{Queue: l.Queue, Priority: l.Priority, Tenant: bus.NoTenant}); base != nil {
		bc := base.CachedInfo().Config
		cfg.AckWait, cfg.MaxDeliver, cfg.MaxAckPending, cfg.Replicas = bc.AckWait, bc.MaxDeliver, bc.MaxAckPending, bc.Replicas
	}
	c, err := w.js.CreateOrUpdateConsumer(ctx, w.names.RunsStream(), cfg)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			w.log.Warn("tenant lane: cannot create its consumer; its requests wait", "queue", l.Queue,
				"priority", l.Priority, "tenant", l.Tenant, "err", err)
		}
		w.lanes.forget(l)
		return
	}
	w.lanes.add(l, c)
}
