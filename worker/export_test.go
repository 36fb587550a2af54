package worker

import (
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

// WithLaneRecheck sets how long a no-tenant lane found empty is not asked
// again unless a request is seen in it.
func WithLaneRecheck(c Config, d time.Duration) Config {
	c.laneRecheck = d
	return c
}
