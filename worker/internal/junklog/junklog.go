// Package junklog logs the requests with an invalid subject a worker
// terminates, without a line each: anyone who may submit can store
// thousands a second.
package junklog

import (
	"log/slog"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/worker/internal/genai"
)

// Every is the interval of a Log.
const Every = 10 * time.Second

// Log logs the first request of an interval of Every at once, then, when
// the interval ends (or the worker stops: it calls Flush), how many more
// were terminated. Every one is counted in a line; none is logged under
// mu. The zero Log is ready.
type Log struct {
	mu    sync.Mutex
	open  bool        // an interval runs: its first request was logged
	held  int         // requests terminated since, not logged yet
	timer *time.Timer // ends the interval
}

// Note counts a request terminated for its subject (clipped to 200 bytes
// in the log).
func (j *Log) Note(log *slog.Logger, subject string, err error) {
	j.mu.Lock()
	if j.open {
		j.held++
		j.mu.Unlock()
		return
	}
	j.open = true
	j.timer = time.AfterFunc(Every, func() { j.Flush(log) })
	j.mu.Unlock()
	if len(subject) > 200 {
		subject = genai.ClipUTF8(subject, 200) + "…"
	}
	log.Error("request with an invalid subject terminated", "subject", subject, "err", err)
}

// Flush ends the interval, logging how many requests it held back.
func (j *Log) Flush(log *slog.Logger) {
	j.mu.Lock()
	held := j.held
	j.open, j.held = false, 0
	if j.timer != nil {
		j.timer.Stop()
		j.timer = nil
	}
	j.mu.Unlock()
	if held > 0 {
		log.Error("more requests with an invalid subject terminated", "count", held, "interval", Every)
	}
}
