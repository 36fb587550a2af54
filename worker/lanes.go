package worker

import (
	"context"
	"log/slog"
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
//     moment and is asked again only after laneRecheck: a fleet that uses
//     one lane pays at most one empty fetch per other lane per
//     laneRecheck per loop. The old consumer is asked every time, as
//     before lanes, so a fleet without lanes fetches as it did.
//  3. Minimum share: a lane with work counts the runs started above it;
//     at laneShare-1 it is asked first, so while it has work it gets at
//     least one start in laneShare on every loop, whatever is above it.
//  4. The long pull, when every lane is empty, goes to the queue's old
//     consumer (most requests, old clients') and waits the full PollWait,
//     as before lanes: an idle loop sends one walk and one long pull per
//     PollWait. A request in another lane of an idle worker waits for the
//     next walk: a run's end, a normal request, or PollWait at most.

// laneRecheck is how long a lane found empty is not asked again: a high
// request behind a busy worker's backlog waits at most this long for its
// lane to be asked, and an unused lane costs 20 short fetches a second per
// loop (a round trip each, beside the loop's hundreds).
const laneRecheck = 50 * time.Millisecond

// laneShare: a lower lane with work gets at least one start in laneShare.
const laneShare = 10

// lane is one lane of one pull loop: its puller and what the loop knows.
type lane struct {
	lane       bus.Lane
	pr         *intake.Puller
	emptyUntil time.Time // found empty: not asked before then (invariant 2)
	passedOver int       // runs started above it while it had work (invariant 3)
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

// sortLanes puts a loop's lanes in priority order, the old consumer
// first among the normal ones.
func sortLanes(ls []*lane) {
	slices.SortStableFunc(ls, func(a, b *lane) int { return rank(a.lane) - rank(b.lane) })
}

func rank(l bus.Lane) int {
	switch {
	case l.EffectivePriority() == bus.PriorityHigh:
		return 0
	case l.Old():
		return 1
	case l.EffectivePriority() == bus.PriorityNormal:
		return 2
	}
	return 3
}

// order returns the lanes in the order to ask them now (invariants 2, 3).
func order(lanes []*lane, now time.Time, into []*lane) []*lane {
	into = into[:0]
	for _, l := range lanes { // promoted first, in priority order
		if l.passedOver >= laneShare-1 && !now.Before(l.emptyUntil) {
			into = append(into, l)
		}
	}
	for _, l := range lanes {
		if l.passedOver < laneShare-1 && !now.Before(l.emptyUntil) {
			into = append(into, l)
		}
	}
	return into
}

// fetchLanes fills up to n held slots from the lanes; it returns how many
// runs it started. Each started run owns one slot (fetch).
func (w *Worker) fetchLanes(ctx context.Context, log *slog.Logger, queue string, lanes []*lane, scratch []*lane, n, fetchBytes int) int {
	now := time.Now()
	got := 0
	for _, l := range order(lanes, now, scratch) {
		if got == n || ctx.Err() != nil {
			break
		}
		g := w.fetch(ctx, log, queue, l.pr, n-got, fetchBytes)
		if g == 0 {
			if !l.lane.Old() { // asked every time, as before lanes (invariant 2)
				l.emptyUntil = now.Add(laneRecheck)
			}
			l.passedOver = 0
			continue
		}
		got += g
		l.passedOver = 0
		after := false
		for _, o := range lanes { // those after it (lanes is in priority order) waited
			if o == l {
				after = true
			} else if after && !now.Before(o.emptyUntil) {
				o.passedOver += g
			}
		}
	}
	return got
}
