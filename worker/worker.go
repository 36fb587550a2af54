package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/semaphore"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/budget"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/ratelimit"
	"github.com/agentfleet/agentfleet/worker/internal/eventpub"
	"github.com/agentfleet/agentfleet/worker/internal/eventread"
	"github.com/agentfleet/agentfleet/worker/internal/intake"
	"github.com/agentfleet/agentfleet/worker/internal/junklog"
	"github.com/agentfleet/agentfleet/worker/internal/keys"
	"github.com/agentfleet/agentfleet/worker/internal/lease"
	"github.com/agentfleet/agentfleet/worker/internal/memtrim"
	"github.com/agentfleet/agentfleet/worker/internal/park"
	"github.com/agentfleet/agentfleet/worker/internal/peers"
)

// Worker takes run requests from its queues and runs them. Create it with
// New and start it with Run.
type Worker struct {
	cfg Config
	// childWaits are the run_agent calls waiting for their children
	// (worker/childwait.go).
	childWaits childNotices
	// recordsStream is the records bucket's stream, opened at the first
	// look for a deleted record (childwait.go).
	recordsStream atomic.Pointer[jetstream.Stream]
	c             *bus.Client
	js            jetstream.JetStream
	// events is what the runs' event publishers share, from Run on.
	events *eventpub.Env
	names  bus.Names
	log    *slog.Logger
	obs    Observer
	id     string

	scratch scratchPool // the listeners' event buffers (listener.go)

	tools        map[string]*agent.Tool
	toolNames    []string
	providers    map[string]Provider
	defaultModel bus.ModelRef

	slots chan struct{}
	reads *eventread.Reads    // this worker's reads of stored events
	loads *semaphore.Weighted // Config.LoadBudget (continuation.go)
	// queueSlots caps a queue's runs in flight (QueueConcurrency); a
	// queue without an entry has only the shared slots.
	queueSlots map[string]chan struct{}

	controlStream jetstream.Stream
	pickupReads   pickupReads // which first deliveries skip the record read (pickupread.go)
	runsStream    jetstream.Stream
	lanes         *laneBook // lanes and their consumers (tenants.go)
	kv            jetstream.KeyValue
	leases        *lease.Env       // the runs' leases on their records, from Run on
	parking       *park.Env        // parking and waking (worker/park.go); nil: no AGENTS_PARKED
	keys          *keys.Env        // concurrency keys' places (keys.go); nil: no agents_keys
	trim          *memtrim.Trimmer // gives parked runs' memory back (worker/park.go)

	// hardCtx is cancelled when runs must stop (drain timeout, or Run's end).
	hardCtx    context.Context
	hardCancel context.CancelFunc

	ready chan struct{}

	// What runs send on and read from, as small interfaces: New sets the
	// real ones (reading what Run opens); a test wraps one before Run to
	// stop a run at a step.
	wire         wire         // events and request acks go out on it (the connection)
	records      recordReader // the runs' records (kv)
	controlReads controlReads // the control stream (controlStream)

	mu    sync.Mutex
	runs  map[string]*run
	cover *intake.ControlCoverage // which first attempts skip the control read (coverage.go)
	// coverageAudit is how often the coverage is checked against the
	// control stream (coverage.go).
	coverageAudit time.Duration
	// ctlSub is the live control subscription, from Run on.
	ctlSub *nats.Subscription
	wg     sync.WaitGroup

	peers *peers.Cache // the other workers' presence, for bad requests (internal/peers)

	limiter *ratelimit.Limiter // shared model rate limits; nil without (ratelimit.go)
	ledger  *budget.Ledger     // tenants' spending; nil without budgets (tenant.go)
	trees   *budget.Ledger     // run trees' spending (treebudget.go); nil without the bucket
	// childKey names and seals child runs (children.go); nil: no child runs
	childKey bus.ChildKey

	// runCtx is Run's context: it ends when the worker starts draining.
	runCtx context.Context
	places waitPlaces   // the waiting runs' places (waiting.go)
	junk   junklog.Log  // requests with an invalid subject (run.go)
	tracer trace.Tracer // nil when not tracing (trace.go)
}

// Run creates a worker and runs it until ctx is cancelled; see Worker.Run.
func Run(ctx context.Context, cfg Config) error {
	w, err := New(cfg)
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

// New checks the configuration and builds a worker.
func New(cfg Config) (*Worker, error) {
	if cfg.Client == nil {
		return nil, errors.New("worker: Config.Client is required")
	}
	cfg.defaults()
	for _, q := range cfg.Queues {
		if err := bus.CheckQueue(q); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
	}
	def, err := bus.ParseModelRef(cfg.DefaultModel)
	if err != nil {
		return nil, fmt.Errorf("worker: default model: %w", err)
	}
	id := cfg.WorkerID
	if id == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "worker"
		}
		id = host + "-" + bus.NewRunID()[:8]
	}
	js, err := jetstream.New(cfg.Client.Conn())
	if err != nil {
		return nil, err
	}
	w := &Worker{
		cfg: cfg, c: cfg.Client, js: js, names: cfg.Client.Names(),
		log: cfg.Logger.With("worker", id), obs: cfg.Observer, id: id,
		tools: map[string]*agent.Tool{}, providers: map[string]Provider{},
		defaultModel:  def,
		slots:         make(chan struct{}, cfg.Concurrency),
		reads:         eventread.New(cfg.Client.ReadEvents),
		loads:         semaphore.NewWeighted(cfg.LoadBudget),
		runs:          map[string]*run{},
		cover:         intake.NewControlCoverage(),
		coverageAudit: 5 * time.Second,
		pickupReads:   pickupReads{every: 10 * time.Second},
		ready:         make(chan struct{}),
		queueSlots:    map[string]chan struct{}{},
		lanes:         newLaneBook(cfg.Queues),
	}
	w.wire, w.records, w.controlReads = cfg.Client.Conn(), kvRecords{w}, streamControls{w}
	w.trim = memtrim.New(10*time.Second, debug.FreeOSMemory, func() bool { return len(w.slots) == 0 })
	w.peers = peers.New(id, cfg.Client.ListWorkers, w.log)
	for q, n := range cfg.QueueConcurrency {
		if err := bus.CheckQueue(q); err != nil {
			return nil, fmt.Errorf("worker: queue concurrency: %w", err)
		}
		if n <= 0 {
			return nil, fmt.Errorf("worker: queue concurrency of %s must be positive, not %d", q, n)
		}
		if n < cfg.Concurrency {
			w.queueSlots[q] = make(chan struct{}, n)
		}
	}
	for _, kl := range cfg.KeyLimits {
		if _, err := path.Match(kl.Pattern, ""); err != nil || kl.Pattern == "" {
			return nil, fmt.Errorf("worker: concurrency key limit: bad pattern %q", kl.Pattern)
		}
		if kl.Limit <= 0 || kl.Limit > bus.MaxConcurrencyLimit {
			return nil, fmt.Errorf("worker: concurrency key limit of %q must be 1..%d, not %d", kl.Pattern, bus.MaxConcurrencyLimit, kl.Limit)
		}
	}
	var tools []*agent.Tool
	if !cfg.NoBuiltinTools {
		tools = append(BuiltinTools(), w.runAgentTool()) // run_agent: worker/children.go
	}
	tools = append(tools, cfg.Tools...)
	for _, t := range tools {
		if t == nil || t.Name == "" {
			return nil, errors.New("worker: a tool without a name")
		}
		w.tools[t.Name] = w.wrapTool(t)
	}
	for name := range w.tools {
		w.toolNames = append(w.toolNames, name)
	}
	sort.Strings(w.toolNames)
	for name, p := range cfg.Providers {
		if p != nil {
			w.providers[name] = p
		}
	}
	if w.providers["faux"] == nil {
		w.providers["faux"] = DemoProvider()
	}
	if w.providers[def.Provider] == nil {
		return nil, fmt.Errorf("worker: default model %s: no provider %q is configured", def, def.Provider)
	}
	w.tracer = newTracer(cfg.TracerProvider)
	return w, nil
}

// wire is what the worker sends on: a *nats.Conn.
type wire interface {
	eventpub.Out
	intake.AckConn
}

// Ready is closed once Run has set up the streams and subscriptions and
// starts pulling.
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// ID returns the worker's id.
func (w *Worker) ID() string { return w.id }

// ToolNames returns the names of the tools runs may use.
func (w *Worker) ToolNames() []string { return append([]string(nil), w.toolNames...) }

// streamsConfig is what the worker ensures: its streams config with its
// queues and delivery settings.
func (w *Worker) streamsConfig() bus.StreamsConfig {
	sc := w.cfg.Streams
	sc.Queues, sc.AckWait, sc.MaxDeliver, sc.MaxAckPending = w.cfg.Queues, w.cfg.AckWait, w.cfg.MaxDeliver, w.cfg.MaxAckPending
	return sc
}

// Run ensures the streams (unless SkipEnsureStreams), then pulls requests
// until ctx is cancelled. Then it stops pulling, lets running runs finish
// within DrainTimeout, stops the rest and hands them back (Nak, so another
// worker takes them at once), and returns nil. The connection is left open
// (drain it after Run returns).
func (w *Worker) Run(ctx context.Context) error {
	w.runCtx = ctx
	w.hardCtx, w.hardCancel = context.WithCancel(context.WithoutCancel(ctx))
	defer w.hardCancel()
	defer w.junk.Flush(w.log) // after the pulls: the junk requests held back
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if !w.cfg.SkipEnsureStreams {
		if err := w.c.EnsureStreams(setup, w.streamsConfig()); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
	}
	var err error
	if w.controlStream, err = w.c.JetStream().Stream(setup, w.names.ControlStream()); err != nil {
		return fmt.Errorf("worker: control stream: %w", err)
	}
	if w.kv, err = w.c.Records(setup); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.leases = &lease.Env{KV: w.kv, Worker: w.id, Read: w.getRecord, Index: w.waitingIndex(setup)} // worker/waitindex.go
	consumers := make([]jetstream.Consumer, len(w.cfg.Queues))
	for i, q := range w.cfg.Queues {
		if consumers[i], err = w.js.Consumer(setup, w.names.RunsStream(), w.names.Consumer(q)); err != nil {
			return fmt.Errorf("worker: consumer %s: %w", w.names.Consumer(q), err)
		}
	}
	if w.runsStream, err = w.c.JetStream().Stream(setup, w.names.RunsStream()); err != nil {
		return fmt.Errorf("worker: runs stream: %w", err)
	}
	w.openParking(setup)            // worker/park.go
	w.openKeys(setup)               // keys.go
	w.openChildKey(setup)           // children.go
	w.warnStreamSettings(consumers) // worker/orphans.go
	stopServices, err := startServices(setup, w.services(consumers))
	if err != nil {
		return err
	}
	defer stopServices() // after the runs: Run returns once they are done

	loops := make([]int, len(w.cfg.Queues))
	total := 0
	for i, q := range w.cfg.Queues {
		loops[i] = w.pullLoops(q)
		total += loops[i]
	}
	fetchBytes := fetchBytesPerLoop(w.cfg.FetchBytes, total)
	// Each loop has a puller per lane (lanes.go): the queue's old
	// consumer, its no-tenant lanes and the tenant lanes the book knows
	// (tenants.go); a queue's lane loop has its own.
	laneCons := make([][]jetstream.Consumer, len(w.cfg.Queues))
	for i, q := range w.cfg.Queues {
		laneCons[i] = w.openLanes(setup, q)
	}
	stopBook, err := w.startLaneBook(setup, laneCons)
	if err != nil {
		return fmt.Errorf("worker: lanes: %w", err)
	}
	defer stopBook()
	loopLanes := make([][]*laneSet, len(w.cfg.Queues))
	closeAll := func() {
		for _, q := range loopLanes {
			for _, ls := range q {
				ls.close()
			}
		}
	}
	for i, q := range w.cfg.Queues {
		for range loops[i] + 1 { // the last is the lane loop's
			ls := w.newLaneSet(q)
			pr, err := intake.NewPuller(w.c.Conn(), consumers[i])
			if err != nil {
				ls.close()
				closeAll()
				return fmt.Errorf("worker: %w", err)
			}
			ls.addLane(bus.Lane{Queue: q}, pr, nil)
			ls.sync(w.log)
			loopLanes[i] = append(loopLanes[i], ls)
		}
	}
	w.log.Info("worker started", "queues", w.cfg.Queues, "concurrency", w.cfg.Concurrency,
		"ackWait", w.cfg.AckWait, "maxDeliver", w.cfg.MaxDeliver, "tools", w.toolNames,
		"defaultModel", w.defaultModel.String())
	w.obs.Slots(0, w.cfg.Concurrency)
	close(w.ready)

	var pullers sync.WaitGroup
	for i, q := range w.cfg.Queues {
		for j, ls := range loopLanes[i] {
			pullers.Go(func() {
				defer ls.close()
				if j == len(loopLanes[i])-1 {
					w.laneLoop(ctx, q, ls, fetchBytes)
					return
				}
				w.pull(ctx, q, ls, fetchBytes)
			})
		}
	}
	<-ctx.Done()
	pullers.Wait()
	w.log.Info("worker stopping: no new runs; waiting for running runs", "running", w.running(), "drainTimeout", w.cfg.DrainTimeout)

	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	t := time.NewTimer(w.cfg.DrainTimeout)
	select {
	case <-done:
		t.Stop()
	case <-t.C:
		w.log.Warn("drain timeout: stopping running runs and handing them back", "running", w.running())
		w.hardCancel()
		<-done
	}
	w.log.Info("worker stopped")
	return nil
}

func (w *Worker) running() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.runs)
}

// pullLoops is how many pull loops take a queue's requests. One loop
// waits a round trip per fetch, and when runs are short their slots free
// one at a time: a fetch each, one after the other, was a busy worker's
// limit (docs/benchmarks/2026-12.md, 2026-12-03 afternoon). Each
// loop's long pull holds a slot while the queue is empty, so a loop is
// added per 8 slots the queue may use (its cap, or its share of the
// worker's), up to three.
func (w *Worker) pullLoops(queue string) int {
	limit := w.cfg.Concurrency / len(w.cfg.Queues)
	if qs := w.queueSlots[queue]; qs != nil {
		limit = min(limit, cap(qs))
	}
	return max(1, min(3, limit/8))
}

// largestRequestMsg is the most one request message may take of a
// fetch's bytes: the requests stream's largest message (MaxRequestBytes
// and 64 KiB) with its subject, reply and headers.
const largestRequestMsg = bus.MaxRequestBytes + 128<<10

// fetchBytesPerLoop shares the fetches' byte bound between the pull
// loops; each loop may still take one request of the largest size.
func fetchBytesPerLoop(total, loops int) int {
	return max(total/max(loops, 1), largestRequestMsg)
}

// pull takes requests from one queue, one per free slot: it takes every
// free slot, asks for at most that many messages and fetchBytes bytes
// without waiting, gives back the slots it got nothing for, and when
// nothing is pending parks one long pull holding one slot. No message is ever fetched without a slot for it, so none waits in
// a buffer while its AckWait runs.
func (w *Worker) pull(ctx context.Context, queue string, lanes *laneSet, fetchBytes int) {
	log := w.log.With("queue", queue)
	pr := lanes.all[0].pr // the old consumer's, for the long pull (lanes.go, invariant 5)
	qs := w.queueSlots[queue]
	limit := w.cfg.Concurrency
	if qs != nil {
		limit = cap(qs)
	}
	for {
		// Stopping: no new fetch (a select below may pick a free slot over
		// ctx.Done, and every message fetched now is handed back, one
		// delivery used up).
		if ctx.Err() != nil {
			return
		}
		// The queue's own slot first: a queue at its cap holds no shared
		// slot while it waits.
		if qs != nil {
			select {
			case qs <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
		select {
		case w.slots <- struct{}{}:
		case <-ctx.Done():
			if qs != nil {
				<-qs
			}
			return
		}
		n := 1
	more:
		for n < limit {
			if qs != nil {
				select {
				case qs <- struct{}{}:
				default:
					break more
				}
			}
			select {
			case w.slots <- struct{}{}:
				n++
			default:
				if qs != nil {
					<-qs
				}
				break more
			}
		}
		w.obs.Slots(len(w.slots), w.cfg.Concurrency)
		lanes.sync(log)
		if len(lanes.all) > 1 {
			// Every lane, in priority order, even for one slot.
			got := lanes.fetchLanes(ctx, log, n, fetchBytes)
			if got > 0 {
				w.releaseSlots(queue, n-got)
				continue
			}
			w.releaseSlots(queue, n-1) // keep one for the long pull
		} else if n > 1 {
			got := w.fetch(ctx, log, queue, pr, n, fetchBytes)
			if got > 0 {
				w.releaseSlots(queue, n-got)
				continue
			}
			w.releaseSlots(queue, n-1) // keep one for the long pull
		}
		// The full long poll, lanes or not (lanes.go, invariant 5): a
		// shorter one is a poll storm from every idle loop of the fleet.
		if w.fetch(ctx, log, queue, pr, 1, 0) == 0 {
			w.releaseSlots(queue, 1)
		}
	}
}

// laneLoop starts a queue's lane requests while its pull loops idle in
// their long pull (lanes.go, invariant 5): woken by a request seen in a
// lane (tenants.go), it takes the free slots there are, never waiting for
// one (a busy loop walks the lanes at its next free slot anyway), and
// walks the lanes without waiting.
func (w *Worker) laneLoop(ctx context.Context, queue string, lanes *laneSet, fetchBytes int) {
	log := w.log.With("queue", queue, "loop", "lanes")
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.lanes.wake[queue]:
		}
		lanes.sync(log)
		n := w.takeFreeSlots(queue)
		if n == 0 {
			// Every slot is held, if only by a loop's walk: wait for
			// one rather than drop the wake-up.
			if !w.takeSlot(ctx, queue) {
				return
			}
			n = 1 + w.takeFreeSlots(queue)
		}
		w.obs.Slots(len(w.slots), w.cfg.Concurrency)
		got := lanes.fetchLanes(ctx, log, n, fetchBytes)
		w.releaseSlots(queue, n-got)
	}
}

// takeSlot waits for one slot of queue; false when ctx ended first.
func (w *Worker) takeSlot(ctx context.Context, queue string) bool {
	qs := w.queueSlots[queue]
	if qs != nil {
		select {
		case qs <- struct{}{}:
		case <-ctx.Done():
			return false
		}
	}
	select {
	case w.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		if qs != nil {
			<-qs
		}
		return false
	}
}

// takeFreeSlots takes every slot free now for queue, without waiting.
func (w *Worker) takeFreeSlots(queue string) int {
	qs := w.queueSlots[queue]
	n := 0
	for {
		if qs != nil {
			select {
			case qs <- struct{}{}:
			default:
				return n
			}
		}
		select {
		case w.slots <- struct{}{}:
			n++
		default:
			if qs != nil {
				<-qs
			}
			return n
		}
	}
}

// releaseSlots gives back n slots taken for queue: the shared ones, and
// the queue's own if it has a cap.
func (w *Worker) releaseSlots(queue string, n int) {
	qs := w.queueSlots[queue]
	for range n {
		giveBack(w.slots, "a slot")
		if qs != nil {
			giveBack(qs, "a slot of queue "+queue)
		}
	}
	if n > 0 {
		w.obs.Slots(len(w.slots), w.cfg.Concurrency)
	}
}

// giveBack gives back one slot of slots. A slot is taken by a send and
// given back by a receive, and a receive only follows its send, so a
// channel with nothing to receive means a slot given back that was not
// taken: one given back twice. That panics at once; a blocking receive
// would wait for the next slot someone takes and give that back instead,
// and the worker would hang once none was left (found only by go test's
// timeout). A run's own slot cannot be given back twice: slotHold.release
// gives it back only while it is held.
func giveBack(slots chan struct{}, what string) {
	select {
	case <-slots:
	default:
		panic("worker: " + what + " given back that was not taken (given back twice)")
	}
}

// fetch asks for up to n messages and starts a run for each; it returns how
// many it got. Each started run owns one slot. With maxBytes it is a
// short fetch of several within maxBytes (no wait), else a long pull.
//
// A short fetch is bounded in bytes: asked for every free slot's request
// at once, the server would queue them all for the worker and disconnect
// it as a slow consumer past max_pending. A request that does not fit is
// left for the next fetch (the long pull of one has no byte bound, so
// one larger than maxBytes is taken too).
func (w *Worker) fetch(ctx context.Context, log *slog.Logger, queue string, pr *intake.Puller, n, maxBytes int) int {
	short := maxBytes > 0
	wait := w.longPollWait()
	if short {
		wait = intake.ShortWait
	}
	got, err := pr.Fetch(ctx, n, maxBytes, wait, func(m jetstream.Msg) {
		if ctx.Err() != nil {
			// Stopping: hand it back at once.
			_ = m.Nak()
			w.releaseSlots(queue, 1)
			return
		}
		w.wg.Add(1)
		hold := w.newSlotHold(queue)
		go func() {
			defer w.wg.Done()
			defer hold.release()
			w.handle(m, hold)
		}()
	})
	var refused *intake.RefusedError
	switch {
	case err == nil:
	case errors.As(err, &refused) && (got > 0 || short || refused.LeadershipChanged()):
		// Only a long pull refused at once waits (holding its one slot); a
		// leader change ends every parked pull: they pull again at once.
		log.Debug("fetch ended", "err", err)
	case refused != nil:
		// Refused at once (the consumer's MaxWaiting pulls are parked
		// already, say): asking again at once would spin.
		log.Warn("fetch refused", "err", err)
		pause(ctx, time.Second)
	default:
		if ctx.Err() == nil { // stopping, a silent request is given up
			log.Warn("fetch failed", "err", err)
		}
		if got == 0 {
			pause(ctx, time.Second)
		}
	}
	return got
}

// pause waits d, or until ctx ends; it reports whether d passed.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// offSlotPollWait bounds the long pull while runs wait without a slot: the
// long pull holds a slot, and an answered run that finds none free gets it
// when the pull ends (a pull cannot be cut short safely: the server would
// still deliver to it).
const offSlotPollWait = 500 * time.Millisecond

func (w *Worker) longPollWait() time.Duration {
	if w.OffSlot() > 0 {
		return min(w.cfg.PollWait, offSlotPollWait)
	}
	return w.cfg.PollWait
}

// onControl is the wildcard subscription's handler: it hands the message
// to its run's control owner without blocking.
func (w *Worker) onControl(m *nats.Msg) {
	runID, kind, err := w.names.ParseRepublished(m.Subject)
	seq := controlSeq(m)
	w.mu.Lock()
	var r *run
	if err == nil {
		r = w.runs[runID]
	}
	w.cover.Saw(seq, runID, r != nil || err != nil)
	// Under the lock (offer never blocks): a run whose pickup finds
	// nothing noted has every message claimed for it in its inbox.
	ignored := r != nil && !r.ctl.offer(kind, m)
	w.mu.Unlock()
	if ignored {
		r.log.Debug("control message for a finishing run ignored", "kind", kind)
	}
}

func (w *Worker) register(r *run) {
	w.mu.Lock()
	w.runs[r.id] = r
	w.mu.Unlock()
}

func (w *Worker) unregister(r *run) {
	w.mu.Lock()
	if w.runs[r.id] == r {
		delete(w.runs, r.id)
	}
	w.mu.Unlock()
}

// providerNames lists the configured providers, for error texts.
func (w *Worker) providerNames() string {
	var names []string
	for n := range w.providers {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
