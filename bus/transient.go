package bus

import (
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Transient tells a NATS or JetStream failure that a reconnect, a new
// stream leader or JetStream finishing its start cures, from one a retry
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
	var api *jetstream.APIError
	return errors.As(err, &api) && api.Code == 503
}
