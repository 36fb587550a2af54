package worker

import (
	"context"
	"time"

	"github.com/agentfleet/agentfleet/worker/internal/metering"
)

// For the package's external tests (package worker_test).

// CallInputTokens is a call's input estimate: the spending tests price a
// call as the worker does.
var CallInputTokens = metering.CallInputTokens

// EstimateTokens is a call's rate-limit reservation.
var EstimateTokens = metering.Reservation

// WithWakeFault makes the worker's wakes of parked parents fail while f
// returns an error for the parent.
func WithWakeFault(c Config, f func(parent string) error) Config {
	c.wakeFault = f
	return c
}

// WithTreeTTL gives the trees' accounts a shorter life (budgets off).
func WithTreeTTL(c Config, d time.Duration) Config {
	c.treeTTL = d
	return c
}

// WithChildRecheck sets how often a waiting run_agent call reads its
// child's record without a notice.
func WithChildRecheck(c Config, d time.Duration) Config {
	c.childRecheck = d
	return c
}

// WithLostNotices makes the worker publish no notice of finished children.
func WithLostNotices(c Config) Config {
	c.loseNotices = true
	return c
}

// WithLostChildren makes run_agent skip the submit of the children lost
// returns true for.
func WithLostChildren(c Config, lost func(child string) bool) Config {
	c.loseChild = lost
	return c
}

// WithLaneRecheck sets how long a no-tenant lane found empty is not asked
// again unless a request is seen in it.
func WithLaneRecheck(c Config, d time.Duration) Config {
	c.laneRecheck = d
	return c
}

// WithBeforeEventsSync calls f at a run's end before its events' flush.
func WithBeforeEventsSync(c Config, f func(ctx context.Context, run string)) Config {
	c.beforeEventsSync = f
	return c
}

// WithChildStored calls stored in run_agent once the child's request is
// stored, before the call's update names it.
func WithChildStored(c Config, stored func(ctx context.Context, child string)) Config {
	c.childStored = stored
	return c
}

// WithLostLaneSeen makes the worker drop every LaneSeen republish and
// read its lanes' subjects every rescan.
func WithLostLaneSeen(c Config, rescan time.Duration) Config {
	c.dropLaneSeen, c.laneRescan = true, rescan
	return c
}
