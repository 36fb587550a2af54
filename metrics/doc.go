// Package metrics owns the worker's Prometheus metrics: their names, labels
// and buckets, the bounds on label values, and the HTTP endpoints /metrics,
// /healthz and /readyz. It registers on a registry passed in (never the
// global default one) and knows nothing of NATS or of models beyond names.
package metrics
