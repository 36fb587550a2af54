package tracing

import "strings"

// CaptureContentEnv turns on recording prompts and completions in spans.
const CaptureContentEnv = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

// Enabled says whether tracing is on: the flag (--otel), or an OTLP traces
// endpoint or an exporter set in the environment; OTEL_SDK_DISABLED=true
// always wins, and OTEL_TRACES_EXPORTER=none turns it off.
func Enabled(flag bool, getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	exp := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	if exp == "none" {
		return false
	}
	return flag || exp != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" ||
		getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}
