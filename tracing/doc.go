// Package tracing sets up OpenTelemetry tracing for agentfleet's commands
// and carries trace context across NATS in message headers (traceparent,
// tracestate).
//
// Nothing here is global: New returns a TracerProvider that the caller
// passes on explicitly (worker.Config, the submit command), and a noop one
// when tracing is off. Exporter, sampler, batching, service name and
// resource come from the standard OTEL_* environment, read by the SDK.
package tracing
