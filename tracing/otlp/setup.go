// Package otlp sets up a command's OpenTelemetry tracing: an SDK
// TracerProvider exporting over OTLP/HTTP as the standard OTEL_* variables
// say, or a noop one when tracing is off. It is apart from package tracing
// so that importers of the bus (the carrier) do not pull in the SDK.
package otlp

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/agentfleet/agentfleet/tracing"
)

// Tracing is a command's tracing: its provider (noop when off) and whether
// message content is recorded.
type Tracing struct {
	Provider trace.TracerProvider
	// CaptureContent: prompts and completions go into spans
	// (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true).
	CaptureContent bool
	// On is false when Provider is a noop.
	On bool
	// Warning says why tracing the environment asked for is off (an
	// exporter or protocol this build does not have); "" otherwise.
	Warning string
	sdk     *sdktrace.TracerProvider
}

// Off is tracing turned off: a noop provider.
func Off() *Tracing { return &Tracing{Provider: noop.NewTracerProvider()} }

// New sets up tracing for a command: off (a noop provider) unless Enabled;
// on, spans are batched and exported over OTLP/HTTP (protobuf) as the
// OTEL_EXPORTER_OTLP_* variables say (default http://localhost:4318).
// service is the service.name unless OTEL_SERVICE_NAME sets one. Call
// Shutdown before exiting to flush what is buffered.
//
// An exporter or protocol other than OTLP/HTTP is an error when flag
// asked for tracing; when only the environment did (variables often set
// for every process of a cluster, gRPC included), tracing stays off and
// Warning says why: the command still starts.
func New(ctx context.Context, flag bool, service string, getenv func(string) string) (*Tracing, error) {
	if !tracing.Enabled(flag, getenv) {
		return Off(), nil
	}
	if err := unsupported(getenv); err != nil {
		if flag {
			return nil, err
		}
		t := Off()
		t.Warning = err.Error() + "; tracing is off"
		return t, nil
	}
	exp, err := otlptracehttp.New(ctx) // the OTEL_EXPORTER_OTLP_* variables
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(),
		resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, err
	}
	if getenv("OTEL_SERVICE_NAME") != "" || getenv("OTEL_RESOURCE_ATTRIBUTES") != "" {
		// The environment's service.name and attributes win over ours.
		env, err := resource.New(ctx, resource.WithFromEnv())
		if err != nil {
			return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
		}
		if res, err = resource.Merge(res, env); err != nil {
			return nil, err
		}
	}
	// Sampler (OTEL_TRACES_SAMPLER[_ARG]) and batching (OTEL_BSP_*) are
	// read from the environment by the SDK.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{Provider: tp, sdk: tp, On: true,
		CaptureContent: strings.EqualFold(strings.TrimSpace(getenv(tracing.CaptureContentEnv)), "true")}, nil
}

// unsupported says what in the environment's exporter settings this
// build cannot export to.
func unsupported(getenv func(string) string) error {
	if exp := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))); exp != "" && exp != "otlp" {
		return fmt.Errorf("OTEL_TRACES_EXPORTER=%s: only otlp (or none) is supported", exp)
	}
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto != "" && proto != "http/protobuf" {
		return fmt.Errorf("OTLP protocol %q: only http/protobuf is supported (point it at the collector's port 4318)", proto)
	}
	return nil
}

// Shutdown flushes and stops the exporter; a noop for tracing off.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.sdk == nil {
		return nil
	}
	return t.sdk.Shutdown(ctx)
}
