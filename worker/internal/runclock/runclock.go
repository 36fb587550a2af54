// Package runclock is a run's timeout with the time it spent waiting
// (for an approval, without a slot) left out.
package runclock

import (
	"sync"
	"time"
)

// Clock is a run's timeout with the time spent waiting left out: the
// Deadline is end + waited, and while paused nothing expires.
type Clock struct {
	mu       sync.Mutex
	end      time.Time     // the first attempt's start + the timeout
	waited   time.Duration // finished pauses, this attempt's and earlier ones'
	pauses   int
	pausedAt time.Time
	expired  bool
	timer    *time.Timer
	fire     func()
}

// New starts a clock that calls fire once end + waited passes
// outside pauses. A non-zero pausedSince creates it paused from then (an
// earlier attempt's wait goes on): a deadline already past must not fire
// before the pause.
func New(end time.Time, waited time.Duration, pausedSince time.Time, fire func()) *Clock {
	c := &Clock{end: end, waited: waited, fire: fire}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !pausedSince.IsZero() {
		c.pauses = 1
		c.pausedAt = pausedSince
		if now := time.Now(); pausedSince.After(now) {
			c.pausedAt = now
		}
	}
	// Created under mu: an expire that runs at once sees the pause.
	c.timer = time.AfterFunc(time.Until(end.Add(waited)), c.expire)
	if c.pauses > 0 {
		c.timer.Stop()
	}
	return c
}

func (c *Clock) expire() {
	c.mu.Lock()
	if c.pauses > 0 || c.expired {
		c.mu.Unlock()
		return
	}
	if d := time.Until(c.end.Add(c.waited)); d > 0 {
		c.timer.Reset(d) // moved by a pause that ended meanwhile
		c.mu.Unlock()
		return
	}
	c.expired = true
	c.mu.Unlock()
	c.fire()
}

// Pause stops the clock from since (a resumed wait started before this
// attempt: since is its original start). Pauses nest.
func (c *Clock) Pause(since time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pauses++; c.pauses == 1 {
		c.pausedAt = since
		if now := time.Now(); since.IsZero() || since.After(now) {
			c.pausedAt = now
		}
		c.timer.Stop()
	}
}

// Resume ends one pause; the last one adds its time to waited.
func (c *Clock) Resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pauses == 0 {
		return
	}
	if c.pauses--; c.pauses == 0 {
		c.waited += time.Since(c.pausedAt)
		c.pausedAt = time.Time{}
		if !c.expired {
			c.timer.Reset(time.Until(c.end.Add(c.waited)))
		}
	}
}

// State returns the finished pauses' time and the current pause's start
// (zero when running).
func (c *Clock) State() (waited time.Duration, pausedAt time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waited, c.pausedAt
}

// Deadline is when the run times out if it does not wait again (zero
// while paused).
func (c *Clock) Deadline() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pauses > 0 {
		return time.Time{}
	}
	return c.end.Add(c.waited)
}

// TimedOut reports whether the clock fired.
func (c *Clock) TimedOut() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.expired
}

// Stop stops the clock: it fires no more.
func (c *Clock) Stop() { c.timer.Stop() }
