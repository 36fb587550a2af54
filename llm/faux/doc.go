// Package faux is pi's scripted model: it answers each model call with the
// next queued response, streamed in fixed-size chunks with optional pacing,
// exactly as the reference's faux provider does. Tests, the conformance
// suite, the fleet's load tests and the offline demo use it.
package faux
