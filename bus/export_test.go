package bus

import (
	"context"
	"sync/atomic"
	"time"
)

// StallFirstConsumer makes c's first follow consumer go silent (later
// ones deliver) and counts the consumers opened: for the tests of
// package bus_test, which run as the roles of deploy/nats/accounts.conf.
func StallFirstConsumer(c *Client) *atomic.Int32 { return stallFirstConsumer(c) }

// StoredEvents is the read PendingOf folds: the envelopes it keeps.
func StoredEvents(ctx context.Context, c *Client, run string) ([]*Envelope, error) {
	return c.storedEvents(ctx, run, time.Time{})
}
