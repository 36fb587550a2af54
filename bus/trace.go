package bus

import (
	"context"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/tracing"
)

// tracedMsg is a message to publish carrying ctx's trace context in its
// headers (traceparent, tracestate); without a span in ctx it has none.
func tracedMsg(ctx context.Context, subject string, data []byte) *nats.Msg {
	m := &nats.Msg{Subject: subject, Data: data}
	if h := (nats.Header{}); tracing.Inject(ctx, h) {
		m.Header = h
	}
	return m
}
