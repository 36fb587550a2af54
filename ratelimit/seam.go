package ratelimit

import (
	"context"
	"sync/atomic"
	"time"
)

// Seam connects a model provider's hooks (a gate before each attempt, a
// report of the server's retry time) to a Limiter that exists only once
// the worker runs. Before Attach, and for models without a group, it lets
// everything through.
type Seam struct {
	groups map[string]string // model id → group
	l      atomic.Pointer[Limiter]
	// DefaultPause is the pause of a 429 that names no retry time.
	DefaultPause time.Duration
}

// NewSeam maps model ids (as the provider sees them) to limit groups.
func NewSeam(groups map[string]string) *Seam {
	return &Seam{groups: groups, DefaultPause: time.Second}
}

// Attach makes l the limiter behind the seam.
func (s *Seam) Attach(l *Limiter) { s.l.Store(l) }

// Gate waits while the model's group is paused by a provider.
func (s *Seam) Gate(ctx context.Context, model string) error {
	l, g := s.l.Load(), s.groups[model]
	if l == nil || g == "" {
		return nil
	}
	return l.Gate(ctx, g)
}

// OnRetryAfter pauses the model's group for the whole fleet until the
// server's retry time. It does not block: the shared write runs on its
// own goroutine, bounded by a timeout.
func (s *Seam) OnRetryAfter(model string, until time.Time) {
	l, g := s.l.Load(), s.groups[model]
	if l == nil || g == "" {
		return
	}
	l.count429(g)
	if until.IsZero() {
		until = time.Now().Add(s.DefaultPause)
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = l.Pause(ctx, g, until)
	}()
}
