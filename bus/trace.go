package bus

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/tracing"
)

// tracedMsg is a message to publish carrying ctx's trace context in its
// headers (traceparent, tracestate); without a span in ctx it has none
// and costs nothing more than a plain publish.
func tracedMsg(ctx context.Context, subject string, data []byte) *nats.Msg {
	m := &nats.Msg{Subject: subject, Data: data}
	if trace.SpanContextFromContext(ctx).IsValid() {
		m.Header = nats.Header{}
		tracing.Inject(ctx, m.Header)
	}
	return m
}
