// Package tracing carries OpenTelemetry trace context across NATS in
// message headers (traceparent, tracestate) and says when a command traces.
// It needs only the OTel API; package tracing/otlp sets up the SDK and its
// exporter for the commands.
//
// Nothing here is global: a TracerProvider is passed explicitly
// (worker.Config, the commands), a noop one when tracing is off.
package tracing
