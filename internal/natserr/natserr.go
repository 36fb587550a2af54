// Package natserr tells NATS and JetStream failures a retry cures from
// those it repeats.
package natserr

import (
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Transient tells a NATS or JetStream failure that a reconnect, a new
// stream leader, JetStream finishing its start or a less loaded server
// cures, from one a retry
// repeats (a message too large, a wrong sequence). A caller's own
// deadline is not in it: whether to retry past one is the caller's call.
func Transient(err error) bool {
	if errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrAsyncPublishTimeout) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrTooManyStalledMsgs) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
		return true
	}
	// 503: unavailable for now. 429: the stream's ingest queue is full
	// (an overloaded server drops what it cannot queue); a retry after a
	// pause is stored.
	var api *jetstream.APIError
	return errors.As(err, &api) && (api.Code == 503 || api.Code == 429)
}
