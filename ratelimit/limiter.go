// Package ratelimit shares model rate limits (requests, tokens and calls in
// flight per sliding window) across a fleet of workers through one NATS KV
// bucket, with no leader: each limit group is one key whose value every
// worker changes by compare-and-set.
//
// A call reserves its estimated tokens before it starts (Acquire) and
// settles to what it used after (Grant.Settle). Calls that have to wait
// queue in the key in the order they asked, so the fleet grants them first
// come, first served. A worker that dies leaves holds that stop counting
// as in flight once its liveness lapses and leave the window one window
// after they were granted.
package ratelimit

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/natserr"
)

// Limits are one group's limits per window; 0 means no limit.
type Limits struct {
	RPM         int `json:"rpm,omitempty"`
	TPM         int `json:"tpm,omitempty"`
	Concurrency int `json:"concurrency,omitempty"`
}

// IsZero reports whether no limit is set.
func (l Limits) IsZero() bool { return l.RPM <= 0 && l.TPM <= 0 && l.Concurrency <= 0 }

// Validate rejects negative limits.
func (l Limits) Validate() error {
	if l.RPM < 0 || l.TPM < 0 || l.Concurrency < 0 {
		return errors.New("negative limit")
	}
	return nil
}

// DefaultWindow is the providers' minute.
const DefaultWindow = 60 * time.Second

// Config configures a Limiter.
type Config struct {
	// Groups are the limits by group name.
	Groups map[string]Limits
	// Worker names this process in the shared state; required.
	Worker string
	// Window is the sliding window of RPM and TPM; default 60 s. Tests
	// shorten it.
	Window time.Duration
	// Liveness is how long a worker's holds and waiters survive without a
	// refresh (they are refreshed every Liveness/4 while the worker lives);
	// default 15 s, at most Window.
	Liveness time.Duration
	// MaxHold bounds how long a granted call counts as in flight: a hold
	// whose Settle never arrived (it failed) must not take a concurrency
	// slot for as long as its worker lives [10m].
	MaxHold time.Duration
	// Jitter spreads the fleet's resumption after a provider's pause:
	// each call waits up to this much more; default 500 ms.
	Jitter time.Duration
}

// Grant is one admitted call.
type Grant struct {
	l        *Limiter
	group    string
	id       string
	Waited   time.Duration // how long the call queued; 0 if it did not
	At       time.Time     // when it was granted: what the window counts
	done     bool
	reserved int
}

// Limiter admits model calls against the fleet's shared limits.
type Limiter struct {
	kv  jetstream.KeyValue
	cfg Config
	win window

	rewatch chan struct{} // Rewatch's signal to Run

	mu      sync.Mutex
	changed map[string]chan struct{} // closed when the key changes
	cached  map[string]*state        // last seen state by key
	active  map[string]int           // this worker's holds and waiters by group
	stats   map[string]*Stats
}

// Stats are one group's counters in this process.
type Stats struct {
	Waits      int           // calls that queued
	WaitTime   time.Duration // total time queued
	Reserved   int64         // tokens reserved
	Used       int64         // tokens settled
	RetryAfter int           // 429s and 503s with a retry time reported
	Grants     int
}

// Stats returns a copy of the counters by group.
func (l *Limiter) Stats() map[string]Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]Stats, len(l.stats))
	for g, s := range l.stats {
		out[g] = *s
	}
	return out
}

// stat changes a group's counters under the lock.
func (l *Limiter) stat(group string, f func(*Stats)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats[group]
	if s == nil {
		s = &Stats{}
		l.stats[group] = s
	}
	f(s)
}

func (l *Limiter) count429(group string) { l.stat(group, func(s *Stats) { s.RetryAfter++ }) }

var validKey = regexp.MustCompile(`^[-_=.a-zA-Z0-9]+$`)

// Key is the KV key of a group: the name itself when it is a valid key,
// else "b64." and its base64url form.
func Key(group string) string {
	if validKey.MatchString(group) && group[0] != '.' && group[len(group)-1] != '.' && len(group) <= 200 {
		return group
	}
	return "b64." + base64.RawURLEncoding.EncodeToString([]byte(group))
}

// New returns a Limiter on kv; Run must run for it to see changes.
func New(kv jetstream.KeyValue, cfg Config) (*Limiter, error) {
	if cfg.Worker == "" {
		return nil, errors.New("ratelimit: Config.Worker is required")
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.MaxHold <= 0 {
		cfg.MaxHold = 10 * time.Minute
	}
	if cfg.Liveness <= 0 {
		cfg.Liveness = 15 * time.Second
	}
	cfg.Liveness = min(cfg.Liveness, cfg.Window)
	if cfg.Jitter == 0 {
		cfg.Jitter = 500 * time.Millisecond
	}
	for g, lim := range cfg.Groups {
		if err := lim.Validate(); err != nil {
			return nil, fmt.Errorf("ratelimit: group %q: %w", g, err)
		}
	}
	return &Limiter{kv: kv, cfg: cfg, win: newWindow(cfg.Window), rewatch: make(chan struct{}, 1),
		changed: map[string]chan struct{}{}, cached: map[string]*state{}, active: map[string]int{}, stats: map[string]*Stats{}}, nil
}

// Limits returns a group's limits; ok is false for a group without any.
func (l *Limiter) Limits(group string) (Limits, bool) {
	lim, ok := l.cfg.Groups[group]
	return lim, ok && !lim.IsZero()
}

// Run watches the bucket and refreshes this worker's liveness until ctx
// ends. Acquire works without it, but then only sees changes when a timer
// fires. The watch is opened again, with backoff, when it cannot be
// opened or ends, when Rewatch asks, and when the bucket is another one
// than the watch's: a NATS restart loses a memory bucket, any worker may
// create it again, and a watch that outlived the old one goes on from the
// old stream sequence, blind to the new bucket's first entries.
func (l *Limiter) Run(ctx context.Context) error {
	var w jetstream.KeyWatcher
	stop := func() {}
	defer func() { stop() }()
	var created time.Time // the watched bucket's stream's creation
	tick := time.NewTicker(l.cfg.Liveness / 4)
	defer tick.Stop()
	check := time.NewTicker(bucketCheck)
	defer check.Stop()
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval, retry.MaxInterval = 100*time.Millisecond, 2*time.Second
	var again <-chan time.Time // set while there is no watch
	reopen := func() {
		stop()
		w, stop, created = nil, func() {}, time.Time{}
		var err error
		if created, err = l.bucketCreated(ctx); err == nil {
			w, stop, err = l.watch(ctx)
		}
		if err != nil {
			again = time.After(retry.NextBackOff())
			return
		}
		retry.Reset()
		again = nil
		l.notifyAll() // what changed while there was no watch
	}
	reopen()
	for {
		var updates <-chan jetstream.KeyValueEntry
		if w != nil {
			updates = w.Updates()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-l.rewatch:
			reopen()
		case <-again:
			reopen()
		case e, ok := <-updates:
			if !ok {
				reopen()
				continue
			}
			if e != nil {
				var s state
				if e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &s) == nil {
					l.remember(e.Key(), &s)
				}
				l.notify(e.Key())
			}
		case <-check.C:
			if w != nil {
				if now, err := l.bucketCreated(ctx); err == nil && !now.Equal(created) {
					reopen()
				}
			}
		case <-tick.C:
			l.refresh(ctx)
		}
	}
}

// bucketCheck is how often Run asks whether the bucket is still the one
// it watches: one stream info request a worker.
const bucketCheck = 5 * time.Second

// watchOpenTimeout bounds opening a watch: with NATS away the request
// would wait for it, and Run would stop refreshing liveness meanwhile.
const watchOpenTimeout = 5 * time.Second

// bucketCreated is when the bucket's stream was created: another time
// means another bucket.
func (l *Limiter) bucketCreated(ctx context.Context) (time.Time, error) {
	sctx, cancel := context.WithTimeout(ctx, watchOpenTimeout)
	defer cancel()
	st, err := l.kv.Status(sctx)
	if err != nil {
		return time.Time{}, err
	}
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil {
		return bs.StreamInfo().Created, nil
	}
	return time.Time{}, nil
}

// watch opens a watch of the whole bucket; stop ends it.
func (l *Limiter) watch(ctx context.Context) (jetstream.KeyWatcher, func(), error) {
	// The watch lives as long as the context it was opened with, so the
	// open is bounded by a timer cancelling that context, not a deadline.
	wctx, cancel := context.WithCancel(ctx)
	t := time.AfterFunc(watchOpenTimeout, cancel)
	w, err := l.kv.WatchAll(wctx)
	if !t.Stop() && err == nil {
		_ = w.Stop()
		err = fmt.Errorf("no answer in %s", watchOpenTimeout)
	}
	if err != nil {
		cancel()
		return nil, func() {}, err
	}
	return w, func() {
		_ = w.Stop()
		cancel()
		// nats.go delivers into Updates under the watcher's lock and
		// closes it under the same lock: an undrained full channel
		// would hold its delivery goroutine for good.
		go func() {
			for range w.Updates() {
			}
		}()
	}, nil
}

// Rewatch makes Run open its watch again. A worker calls it after it
// created the bucket again: a watch that outlived the old bucket waits
// for sequences the new one has not reached, so it would see nothing.
func (l *Limiter) Rewatch() {
	select {
	case l.rewatch <- struct{}{}:
	default: // one is pending already
	}
}

func (l *Limiter) notify(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ch, ok := l.changed[key]; ok {
		close(ch)
		delete(l.changed, key)
	}
}

// notifyAll wakes every waiter: they read their keys again.
func (l *Limiter) notifyAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, ch := range l.changed {
		close(ch)
		delete(l.changed, key)
	}
}

// changes returns a channel closed at the key's next change.
func (l *Limiter) changes(key string) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.changed[key]
	if !ok {
		ch = make(chan struct{})
		l.changed[key] = ch
	}
	return ch
}

func (l *Limiter) track(group string, d int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.active[group] += d
	if l.active[group] <= 0 {
		delete(l.active, group)
	}
}

// refresh extends this worker's liveness in every group it has holds or
// waiters in.
func (l *Limiter) refresh(ctx context.Context) {
	l.mu.Lock()
	groups := make([]string, 0, len(l.active))
	for g := range l.active {
		groups = append(groups, g)
	}
	l.mu.Unlock()
	for _, g := range groups {
		_, _ = l.update(ctx, g, func(*state, int64) (bool, error) { return true, nil })
	}
}

func (l *Limiter) now() int64 { return time.Now().UnixMilli() }

// update applies change to the group's state by compare-and-set until it
// sticks. change reports whether to write; the state is pruned first and
// this worker's liveness extended on every write.
func (l *Limiter) update(ctx context.Context, group string, change func(s *state, now int64) (bool, error)) (*state, error) {
	key := Key(group)
	// A failure that passes (the bucket being made again, NATS away) is
	// waited out within ctx: the caller's call would fail for nothing.
	pause := 20 * time.Millisecond
	passing := func(err error) bool {
		if !natserr.Transient(err) {
			return false
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
		}
		pause = min(2*pause, time.Second)
		return true
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var s state
		var rev uint64
		e, err := l.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil && passing(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("ratelimit: read %s: %w", key, err)
		default:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), &s); err != nil {
				// A value no worker wrote: start over rather than stall.
				s = state{}
			}
		}
		now := l.now()
		s.prune(l.win, now, l.cfg.MaxHold.Milliseconds())
		write, err := change(&s, now)
		if err != nil || !write {
			l.remember(key, &s)
			return &s, err
		}
		s.alive(l.cfg.Worker, now+l.cfg.Liveness.Milliseconds())
		b, err := json.Marshal(&s)
		if err != nil {
			return nil, err
		}
		if rev == 0 {
			_, err = l.kv.Create(ctx, key, b)
		} else {
			_, err = l.kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			l.remember(key, &s)
			return &s, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !passing(err) {
			return nil, fmt.Errorf("ratelimit: write %s: %w", key, err)
		}
	}
}

func (l *Limiter) remember(key string, s *state) {
	l.mu.Lock()
	l.cached[key] = s
	l.mu.Unlock()
}

// behind reports whether the last state seen has the waiter queued behind
// another: it cannot be granted, so it need not read the key.
func (l *Limiter) behind(key, id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.cached[key]
	return s != nil && len(s.Queue) > 0 && s.Queue[0].ID != id && s.has(id)
}

// Acquire waits until a call of tokens may start in group, in the order
// calls asked across the fleet, and reserves it. A group without limits
// grants at once without touching NATS. A reservation larger than the TPM
// is cut to the TPM (it runs alone in its window).
func (l *Limiter) Acquire(ctx context.Context, group string, tokens int) (*Grant, error) {
	lim, ok := l.Limits(group)
	if !ok {
		return &Grant{l: l, group: group, done: true, At: time.Now()}, nil
	}
	if lim.TPM > 0 {
		tokens = min(tokens, lim.TPM)
	}
	tokens = max(tokens, 0)
	id := newID()
	asked := time.Now()
	g := &Grant{l: l, group: group, id: id}
	l.track(group, 1)
	key := Key(group)
	queued := false
	woken := false
	for {
		ch := l.changes(key) // before the read: no change is missed
		if woken && l.behind(key, id) {
			// Someone else's turn: no read until the next change.
			var err error
			if woken, err = l.wait(ctx, ch, 0); err != nil {
				l.abandon(group, id)
				return nil, err
			}
			continue
		}
		var retryAt int64
		granted := false
		_, err := l.update(ctx, group, func(s *state, now int64) (bool, error) {
			granted, retryAt = false, 0
			head := len(s.Queue) == 0 || s.Queue[0].ID == id
			if queued && !s.has(id) {
				// Dropped as stale (this worker stalled): ask again, at the
				// original time.
				s.enqueue(waiter{ID: id, Worker: l.cfg.Worker, At: asked.UnixMilli(), Tokens: tokens})
				return true, nil
			}
			if head {
				if ok, at := s.fits(lim, l.win, now, tokens); ok {
					s.dequeue(id)
					s.Holds = append(s.Holds, hold{ID: id, Worker: l.cfg.Worker, At: now, Tokens: tokens})
					granted, g.At = true, time.UnixMilli(now)
					return true, nil
				} else {
					retryAt = at
				}
			}
			if !queued {
				s.enqueue(waiter{ID: id, Worker: l.cfg.Worker, At: asked.UnixMilli(), Tokens: tokens})
				return true, nil
			}
			return false, nil
		})
		if err != nil {
			l.abandon(group, id)
			return nil, err
		}
		if granted {
			if queued {
				g.Waited = time.Since(asked)
			}
			g.reserved = tokens
			l.stat(group, func(s *Stats) {
				s.Grants++
				s.Reserved += int64(tokens)
				if g.Waited > 0 {
					s.Waits++
					s.WaitTime += g.Waited
				}
			})
			return g, nil
		}
		queued = true
		if woken, err = l.wait(ctx, ch, retryAt); err != nil {
			l.abandon(group, id)
			return nil, err
		}
	}
}

// wait waits for a change of the key, until retryAt (Unix ms) if set, and
// at most Liveness/2: a lapsed liveness changes nothing in the key.
func (l *Limiter) wait(ctx context.Context, changed <-chan struct{}, retryAt int64) (woken bool, err error) {
	d := l.cfg.Liveness / 2
	if retryAt > 0 {
		d = min(d, time.Duration(retryAt-l.now()+1)*time.Millisecond)
	}
	t := time.NewTimer(max(d, time.Millisecond))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-changed:
		return true, nil
	case <-t.C:
		return false, nil
	}
}

func (s *state) has(id string) bool {
	for _, q := range s.Queue {
		if q.ID == id {
			return true
		}
	}
	return false
}

// abandon takes a waiter that gave up out of the queue.
func (l *Limiter) abandon(group, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The granting write may have been applied though its answer was
	// lost (a cancelled or timed-out request): a hold with this id is then
	// this call's, and no Grant will ever settle it.
	_, _ = l.update(ctx, group, func(s *state, _ int64) (bool, error) {
		return s.dequeue(id) || s.release(l.win, id), nil
	})
	l.track(group, -1)
}

// Settle replaces the call's reservation by the tokens it used. It is
// safe to call more than once; only the first counts.
func (g *Grant) Settle(ctx context.Context, used int) error {
	if g == nil || g.done {
		return nil
	}
	g.done = true
	defer g.l.track(g.group, -1)
	g.l.stat(g.group, func(s *Stats) { s.Used += int64(max(used, 0)) })
	_, err := g.l.update(ctx, g.group, func(s *state, _ int64) (bool, error) {
		return s.settle(g.l.win, g.id, max(used, 0)), nil
	})
	return err
}

// Pause stops every worker's calls of group until until (a provider's
// retry time). It never shortens a pause.
func (l *Limiter) Pause(ctx context.Context, group string, until time.Time) error {
	if _, ok := l.Limits(group); !ok {
		return nil
	}
	_, err := l.update(ctx, group, func(s *state, now int64) (bool, error) {
		u := until.UnixMilli()
		if u <= s.PausedUntil || u <= now {
			return false, nil
		}
		s.PausedUntil = u
		return true, nil
	})
	return err
}

// Gate waits while group is paused, then a random part of Jitter so that
// the fleet does not resume at one instant. It reads the shared state.
func (l *Limiter) Gate(ctx context.Context, group string) error {
	if _, ok := l.Limits(group); !ok {
		return nil
	}
	for {
		s, err := l.update(ctx, group, func(*state, int64) (bool, error) { return false, nil })
		if err != nil {
			return err
		}
		wait := time.Until(time.UnixMilli(s.PausedUntil))
		if wait <= 0 {
			return nil
		}
		wait += time.Duration(rand.Int64N(int64(l.cfg.Jitter) + 1))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func newID() string {
	var b [9]byte
	for i := range b {
		b[i] = byte(rand.IntN(256))
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}
