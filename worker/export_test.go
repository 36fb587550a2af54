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

// WithBeforeEventsSync calls f at a run's end before its events' flush.
func WithBeforeEventsSync(c Config, f func(ctx context.Context, run string)) Config {
	c.beforeEventsSync = f
	return c
}
