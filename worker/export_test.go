package worker

import "github.com/agentfleet/agentfleet/worker/internal/metering"

// For the package's external tests (package worker_test).

// CallInputTokens is a call's input estimate: the spending tests price a
// call as the worker does.
var CallInputTokens = metering.CallInputTokens

// EstimateTokens is a call's rate-limit reservation.
var EstimateTokens = metering.Reservation

// SetWakeFault makes a child's wake of its parked parent fail while f
// returns an error for the parent (nil f: no fault).
func SetWakeFault(f func(parent string) error) {
	if f == nil {
		wakeFault.Store(nil)
		return
	}
	wakeFault.Store(&f)
}
