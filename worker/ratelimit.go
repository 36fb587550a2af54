package worker

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/ratelimit"
	"github.com/agentfleet/agentfleet/worker/internal/metering"
)

// RateLimits are the fleet's shared model rate limits as one worker sees
// them. Every worker of a fleet should be given the same ones.
type RateLimits struct {
	// Models maps "provider/id" to its limits.
	Models map[string]ModelLimit
	// Window is the sliding window; default 60 s (tests shorten it).
	Window time.Duration
	// Liveness bounds how long a dead worker's reservations count as in
	// flight; default 15 s.
	Liveness time.Duration
	// Seam, when set, is attached to the worker's limiter once it runs:
	// the providers' Gate and OnRetryAfter go through it.
	Seam *ratelimit.Seam
}

// ModelLimit is one model's limits and the group that holds them.
type ModelLimit struct {
	Group  string
	Limits ratelimit.Limits
	// MaxTokens is the model table's output bound: the output reserve
	// (OutputReserve) of a call that asks for none. A run's calls always
	// ask for theirs, from the model table the provider gives.
	MaxTokens int
}

// startRateLimits creates the worker's limiter and runs its watch until
// the returned stop is called. Without RateLimits it does nothing.
func (w *Worker) startRateLimits(ctx context.Context) (stop func(), err error) {
	rl := w.cfg.RateLimits
	if rl == nil || len(rl.Models) == 0 {
		return func() {}, nil
	}
	kv, err := w.c.Limits(ctx)
	if err != nil {
		return nil, err
	}
	groups := map[string]ratelimit.Limits{}
	for ref, m := range rl.Models {
		if m.Group == "" {
			return nil, fmt.Errorf("rate limits of %s: no group", ref)
		}
		if have, ok := groups[m.Group]; ok && have != m.Limits {
			return nil, fmt.Errorf("rate limits of %s: group %s has other limits already", ref, m.Group)
		}
		groups[m.Group] = m.Limits
	}
	l, err := ratelimit.New(kv, ratelimit.Config{Groups: groups, Worker: w.id, Window: rl.Window, Liveness: rl.Liveness})
	if err != nil {
		return nil, err
	}
	w.limiter = l
	if rl.Seam != nil {
		rl.Seam.Attach(l)
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := l.Run(lctx); err != nil {
			w.log.Error("shared rate limits: watch failed; waiting calls see changes only on their timers", "err", err)
		}
	}()
	return func() { cancel(); <-done }, nil
}

// limitStream makes each call of fn take capacity from the model's group
// first: it reserves the estimated input plus the output reserve, tells
// the run's readers how long it waited, and settles to the call's charge
// (internal/metering: the reported usage, within what the call could use); a
// call without reported usage counts as reserved, or as charged if that is
// more; a call whose usage was clamped counts as charged or as reserved,
// whichever is less.
func (r *run) limitStream(fn agent.StreamFn, ml ModelLimit) agent.StreamFn {
	l := r.w.limiter
	return func(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			reserve := metering.Reservation(llm, opts.MaxTokens, ml.MaxTokens)
			r.waitingModel.Store(true) // the record says so at the next heartbeat
			start := time.Now()
			g, err := l.Acquire(ctx, ml.Group, reserve)
			r.waitingModel.Store(false)
			r.traceLimitWait(ctx, ml.Group, start, g.Waited, err)
			if err != nil {
				yield(limitError(ctx, err))
				return
			}
			if g.Waited > 0 {
				_, _ = r.pub.Fleet(bus.EventModelWait, bus.ModelWait{Type: bus.EventModelWait,
					Reason: bus.WaitRateLimit, WaitedMs: g.Waited.Milliseconds(), Group: ml.Group})
			}
			var final *agent.Message
			defer func() {
				// A call cut off before its usage counts as reserved; a
				// usage cut to the call's bounds (clamped: a count the
				// call could not have used) counts at most as reserved,
				// so that it holds no more of the window than the call
				// could have.
				s := chargeOf(ctx, final)
				used := s.Tokens()
				switch {
				case s.Unreported() || used == 0:
					used = max(reserve, used)
				case s.Source == metering.SourceClamped:
					used = min(reserve, used)
				}
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				if err := g.Settle(sctx, used); err != nil {
					r.log.Warn("shared rate limits: cannot settle a call; its reservation counts until it leaves the window", "err", err)
				}
			}()
			for ev := range fn(ctx, model, llm, opts) {
				if (ev.Type == agent.StreamDone || ev.Type == agent.StreamError) && ev.Message != nil {
					final = ev.Message
				}
				if !yield(ev) {
					return
				}
			}
		}
	}
}

func limitError(ctx context.Context, err error) agent.StreamEvent {
	m := &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonError,
		ErrorMessage: "waiting for the model's shared rate limits: " + err.Error(), Timestamp: time.Now().UnixMilli()}
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		m.StopReason, m.ErrorMessage = agent.StopReasonAborted, "aborted while waiting for the model's shared rate limits"
	}
	return agent.StreamEvent{Type: agent.StreamError, Message: m}
}

// modelLimit returns the shared limits of a model, if it has any.
func (w *Worker) modelLimit(ref bus.ModelRef) (ModelLimit, bool) {
	if w.limiter == nil {
		return ModelLimit{}, false
	}
	ml, ok := w.cfg.RateLimits.Models[ref.String()]
	if !ok || ml.Limits.IsZero() {
		return ModelLimit{}, false
	}
	return ml, true
}
