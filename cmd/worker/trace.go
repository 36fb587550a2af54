package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/agentfleet/agentfleet/tracing/otlp"
)

// otelFlag registers --otel [AGENTS_OTEL].
func otelFlag(fs *flag.FlagSet, p *bool, e *environment) {
	def := false
	if v := os.Getenv("AGENTS_OTEL"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			e.errs = append(e.errs, fmt.Errorf("AGENTS_OTEL: %w", err))
		}
		def = b
	}
	fs.BoolVar(p, "otel", def, "export OpenTelemetry traces over OTLP/HTTP as the OTEL_* variables say (also on when OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_TRACES_EXPORTER is set; OTEL_SDK_DISABLED=true turns it off) [AGENTS_OTEL]")
}

// startTracing sets up the worker's tracing; stop flushes it.
func startTracing(ctx context.Context, on bool, log *slog.Logger) (t *otlp.Tracing, stop func(), err error) {
	t, err = otlp.New(ctx, on, "agentfleet-worker", os.Getenv)
	if err != nil {
		return nil, nil, err
	}
	if t.On {
		log.Info("exporting OpenTelemetry traces (OTLP/HTTP)", "captureContent", t.CaptureContent)
	}
	if t.Warning != "" {
		log.Warn("OpenTelemetry: " + t.Warning)
	}
	return t, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := t.Shutdown(sctx); err != nil {
			log.Warn("traces not all exported", "err", err)
		}
	}, nil
}
