package budget

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Entry is one tenant's spending in one period: the value of its key in
// the budgets bucket, changed only by compare-and-set.
type Entry struct {
	Tenant string `json:"tenant"`
	// Period and its bounds (Unix ms, UTC); the period is a Go duration.
	Period string `json:"period"`
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
	// LimitUSD is the budget the workers were configured with, last
	// written by a worker: `submit budgets` reads it from here.
	LimitUSD float64 `json:"limitUsd"`
	// SpentUSD is the settled cost of the period's model calls.
	SpentUSD float64 `json:"spentUsd"`
	// Holds are calls reserved and not settled yet, at their worst case.
	Holds []Hold `json:"holds,omitempty"`
	// Workers maps a worker to when its holds lapse (Unix ms) unless it
	// refreshes them.
	Workers map[string]int64 `json:"workers,omitempty"`
}

// Hold is one call's reservation.
type Hold struct {
	ID     string  `json:"id"`
	Worker string  `json:"w"`
	At     int64   `json:"t"` // reserved, Unix ms
	USD    float64 `json:"usd"`
}

// Held is the sum of the open reservations.
func (e *Entry) Held() float64 {
	var s float64
	for _, h := range e.Holds {
		s += h.USD
	}
	return s
}

// Remaining is what the tenant may still reserve in the period.
func (e *Entry) Remaining() float64 { return max(e.LimitUSD-e.SpentUSD-e.Held(), 0) }

// ResetsAt is the end of the entry's period.
func (e *Entry) ResetsAt() time.Time { return time.UnixMilli(e.End).UTC() }

// prune charges the holds that lapsed: their worker stopped refreshing
// them, or they are older than maxHold. A lapsed hold is charged at its
// reservation: the provider may have billed the call.
func (e *Entry) prune(now, maxHold int64) {
	e.Holds = slices.DeleteFunc(e.Holds, func(h Hold) bool {
		if e.Workers[h.Worker] <= now || h.At+maxHold <= now {
			e.SpentUSD += h.USD
			return true
		}
		return false
	})
	for w, until := range e.Workers {
		if until <= now {
			delete(e.Workers, w)
		}
	}
}

var plainTenant = regexp.MustCompile(`^[-=a-zA-Z0-9][-_=a-zA-Z0-9]{0,199}$`)

// Key is the KV key of a tenant's period: the period's start in Unix
// seconds, a dot, and the tenant's name when it is a plain key token,
// else "_" and its base64url form (so a key never names two tenants).
func Key(tenant string, start time.Time) string {
	t := tenant
	if !plainTenant.MatchString(tenant) {
		t = "_" + base64.RawURLEncoding.EncodeToString([]byte(tenant))
	}
	return strconv.FormatInt(start.Unix(), 10) + "." + t
}

// TenantOfKey decodes the tenant part of a key.
func TenantOfKey(key string) (string, bool) {
	_, t, ok := strings.Cut(key, ".")
	if !ok {
		return "", false
	}
	if b, found := strings.CutPrefix(t, "_"); found {
		d, err := base64.RawURLEncoding.DecodeString(b)
		return string(d), err == nil
	}
	return t, true
}

// LedgerConfig configures a Ledger.
type LedgerConfig struct {
	// Worker names this process in the shared entries; required.
	Worker string
	// Liveness is how long this worker's holds survive without a refresh
	// (refreshed every Liveness/4 while Run runs); default 15 s.
	Liveness time.Duration
	// MaxHold bounds how long any hold counts, refreshed or not; default
	// 10 minutes (a call longer than it is charged its reservation, then
	// corrected when it settles).
	MaxHold time.Duration
	// RetryFor bounds how long Reserve tries again after NATS errors
	// (with backoff) before it gives up; default 30 s.
	RetryFor time.Duration
	// KeyTTL, with JetStream, makes every write of an entry expire after
	// it (the bucket's stream must allow per-message TTLs), so the keys
	// of past periods go: two periods keeps the last one for `submit
	// budgets --all`. Zero keeps every key.
	KeyTTL    time.Duration
	JetStream jetstream.JetStream
}

// Ledger reserves and settles tenants' spending in the budgets bucket.
type Ledger struct {
	kv  jetstream.KeyValue
	cfg LedgerConfig

	mu     sync.Mutex
	active map[string]int // this worker's holds by key
	// orphans are holds whose reservation failed: their write may have
	// been stored behind a lost answer. Run removes them (uncharged: no
	// call was made) once NATS answers again.
	orphans map[orphan]int64 // to when they are given up (Unix ms)
}

type orphan struct{ key, id string }

// NewLedger returns a ledger on kv; Run keeps its holds alive.
func NewLedger(kv jetstream.KeyValue, cfg LedgerConfig) (*Ledger, error) {
	if cfg.Worker == "" {
		return nil, errors.New("budget: LedgerConfig.Worker is required")
	}
	if cfg.Liveness <= 0 {
		cfg.Liveness = 15 * time.Second
	}
	if cfg.MaxHold <= 0 {
		cfg.MaxHold = 10 * time.Minute
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = 30 * time.Second
	}
	return &Ledger{kv: kv, cfg: cfg, active: map[string]int{}, orphans: map[orphan]int64{}}, nil
}

// Account names one tenant's budget in one period.
type Account struct {
	Tenant     string
	Period     time.Duration
	Start, End time.Time
	LimitUSD   float64
}

// AccountAt is the tenant's account for the period containing now.
func AccountAt(tenant string, t Tenant, period time.Duration, now time.Time) Account {
	start, end := PeriodAt(now, period)
	return Account{Tenant: tenant, Period: period, Start: start, End: end, LimitUSD: t.USD}
}

func (a Account) key() string { return Key(a.Tenant, a.Start) }

// Run refreshes this worker's liveness in the entries it holds
// reservations in, until ctx ends.
func (l *Ledger) Run(ctx context.Context) {
	t := time.NewTicker(l.cfg.Liveness / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.mu.Lock()
		keys := make([]string, 0, len(l.active))
		for k := range l.active {
			keys = append(keys, k)
		}
		l.mu.Unlock()
		for _, k := range keys {
			_, _ = l.update(ctx, k, nil, func(*Entry, int64) (bool, error) { return true, nil })
		}
		l.releaseOrphans(ctx)
	}
}

// releaseOrphans removes the holds of failed reservations, without
// charging them, once the bucket answers again. Those still missing when
// they are given up (MaxHold) were never stored, or lapsed and were
// charged meanwhile: nothing tells which.
func (l *Ledger) releaseOrphans(ctx context.Context) {
	l.mu.Lock()
	var todo []orphan
	now := time.Now().UnixMilli()
	for o, until := range l.orphans {
		if until <= now {
			delete(l.orphans, o)
			continue
		}
		todo = append(todo, o)
	}
	l.mu.Unlock()
	for _, o := range todo {
		_, err := l.update(ctx, o.key, nil, func(e *Entry, _ int64) (bool, error) {
			n := len(e.Holds)
			e.Holds = slices.DeleteFunc(e.Holds, func(h Hold) bool { return h.ID == o.id })
			return len(e.Holds) != n, nil
		})
		if err == nil {
			l.mu.Lock()
			delete(l.orphans, o)
			l.mu.Unlock()
		}
	}
}

func (l *Ledger) track(key string, d int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.active[key] += d
	if l.active[key] <= 0 {
		delete(l.active, key)
	}
}

// update applies change to the entry by compare-and-set until it sticks;
// fresh, when set, creates a missing entry. change reports whether to
// write; lapsed holds are charged first, and the account's limit is
// written with every change (workers agree on it; the last write wins).
func (l *Ledger) update(ctx context.Context, key string, acct *Account, change func(e *Entry, now int64) (bool, error)) (*Entry, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var e Entry
		var rev uint64
		got, err := l.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if acct == nil {
				return nil, nil // nothing to refresh or settle into
			}
		case err != nil:
			return nil, fmt.Errorf("budget: read %s: %w", key, err)
		default:
			rev = got.Revision()
			if err := json.Unmarshal(got.Value(), &e); err != nil {
				// A value no worker wrote: refuse rather than forget
				// the period's spending.
				return nil, fmt.Errorf("budget: entry %s does not decode: %w: %w", key, ErrBadEntry, err)
			}
		}
		if acct != nil {
			e.Tenant, e.Period = acct.Tenant, FormatPeriod(acct.Period)
			e.Start, e.End = acct.Start.UnixMilli(), acct.End.UnixMilli()
			e.LimitUSD = acct.LimitUSD
		}
		now := time.Now().UnixMilli()
		e.prune(now, l.cfg.MaxHold.Milliseconds())
		write, err := change(&e, now)
		if err != nil || (!write && rev != 0) {
			return &e, err
		}
		l.mu.Lock()
		mine := l.active[key] > 0
		l.mu.Unlock()
		if mine || slices.ContainsFunc(e.Holds, func(h Hold) bool { return h.Worker == l.cfg.Worker }) {
			if e.Workers == nil {
				e.Workers = map[string]int64{}
			}
			e.Workers[l.cfg.Worker] = now + l.cfg.Liveness.Milliseconds()
		}
		b, err := json.Marshal(&e)
		if err != nil {
			return nil, err
		}
		err = l.write(ctx, key, b, rev)
		if err == nil {
			return &e, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil, fmt.Errorf("budget: write %s: %w", key, err)
		}
	}
}

// write stores an entry by compare-and-set on its revision (0: create),
// with KeyTTL when set.
func (l *Ledger) write(ctx context.Context, key string, b []byte, rev uint64) error {
	ttl := l.cfg.KeyTTL
	if ttl <= 0 || l.cfg.JetStream == nil {
		var err error
		if rev == 0 {
			_, err = l.kv.Create(ctx, key, b)
		} else {
			_, err = l.kv.Update(ctx, key, b, rev)
		}
		return err
	}
	ttl = max(ttl.Round(time.Second), time.Second)
	if rev == 0 {
		_, err := l.kv.Create(ctx, key, b, jetstream.KeyTTL(ttl))
		return err
	}
	// KeyValue.Update carries no TTL: publish as it does, with one.
	_, err := l.cfg.JetStream.PublishMsg(ctx, &nats.Msg{Subject: "$KV." + l.kv.Bucket() + "." + key, Data: b},
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(ttl))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
	}
	return err
}

// Open returns the account's entry, creating it (with its limit) when
// the period has none yet, so `submit budgets` lists the tenant.
func (l *Ledger) Open(ctx context.Context, a Account) (*Entry, error) {
	return l.update(ctx, a.key(), &a, func(e *Entry, _ int64) (bool, error) { return false, nil })
}

// Reservation is one call's hold on a tenant's budget.
type Reservation struct {
	l    *Ledger
	key  string
	id   string
	usd  float64
	done bool
}

// ErrBadEntry is a ledger entry that does not decode: no worker wrote it.
var ErrBadEntry = errors.New("not a ledger entry")

// Reserve holds usd of the account's budget for one call if the spent
// cost, the open holds and usd fit in the limit. Without room it returns
// nil and the entry as it is. NATS errors are tried again, with backoff,
// for up to RetryFor; the retries reuse the hold's id, so a write stored
// behind a lost answer is found, not made twice. A reservation that fails
// all the same leaves its hold, if it was stored, for Run to remove.
func (l *Ledger) Reserve(ctx context.Context, a Account, usd float64) (*Reservation, *Entry, error) {
	id := newID()
	key := a.key()
	l.track(key, 1)
	ok := false
	try := func() (*Entry, error) {
		return l.update(ctx, key, &a, func(e *Entry, now int64) (bool, error) {
			if slices.ContainsFunc(e.Holds, func(h Hold) bool { return h.ID == id }) {
				ok = true // an earlier try's write was stored
				return false, nil
			}
			ok = e.SpentUSD+e.Held()+usd <= e.LimitUSD
			if ok {
				e.Holds = append(e.Holds, Hold{ID: id, Worker: l.cfg.Worker, At: now, USD: usd})
			}
			return ok, nil
		})
	}
	e, err := try()
	deadline := time.Now().Add(l.cfg.RetryFor)
	for wait := 100 * time.Millisecond; err != nil && ctx.Err() == nil && !errors.Is(err, ErrBadEntry); wait = min(2*wait, 2*time.Second) {
		d := wait/2 + rand.N(wait/2)
		if time.Now().Add(d).After(deadline) {
			break
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		e, err = try()
	}
	if err != nil || !ok {
		l.track(key, -1)
		if err != nil {
			l.mu.Lock()
			l.orphans[orphan{key, id}] = time.Now().Add(l.cfg.MaxHold).UnixMilli()
			l.mu.Unlock()
			return nil, nil, err
		}
		return nil, e, nil
	}
	return &Reservation{l: l, key: key, id: id, usd: usd}, e, nil
}

// Settle replaces the reservation by the call's real cost. A hold that
// lapsed meanwhile was charged at its reservation: the difference is
// charged now. Only the first call counts.
func (r *Reservation) Settle(ctx context.Context, usd float64) error {
	if r == nil || r.done {
		return nil
	}
	r.done = true
	defer r.l.track(r.key, -1)
	usd = max(usd, 0)
	_, err := r.l.update(ctx, r.key, nil, func(e *Entry, _ int64) (bool, error) {
		i := slices.IndexFunc(e.Holds, func(h Hold) bool { return h.ID == r.id })
		if i >= 0 {
			e.Holds = slices.Delete(e.Holds, i, i+1)
			e.SpentUSD += usd
		} else {
			e.SpentUSD = max(e.SpentUSD+usd-r.usd, 0)
		}
		return true, nil
	})
	return err
}

// List reads every entry of the bucket; entries that do not decode are
// skipped.
func List(ctx context.Context, kv jetstream.KeyValue) ([]Entry, error) {
	return list(ctx, kv, false)
}

// ListLatest reads each tenant's newest entry only (its current period,
// or the last one it ran in): one read per tenant, whatever the history.
func ListLatest(ctx context.Context, kv jetstream.KeyValue) ([]Entry, error) {
	return list(ctx, kv, true)
}

func list(ctx context.Context, kv jetstream.KeyValue, latest bool) ([]Entry, error) {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var keys []string
	newest := map[string]int64{} // the tenant part of a key to its newest start
	for k := range lister.Keys() {
		keys = append(keys, k)
		start, tenant, ok := strings.Cut(k, ".")
		if s, err := strconv.ParseInt(start, 10, 64); ok && err == nil {
			if have, seen := newest[tenant]; !seen || s > have {
				newest[tenant] = s
			}
		}
	}
	var out []Entry
	for _, k := range keys {
		if latest {
			start, tenant, _ := strings.Cut(k, ".")
			if s, err := strconv.ParseInt(start, 10, 64); err == nil && s != newest[tenant] {
				continue
			}
		}
		got, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var e Entry
		if json.Unmarshal(got.Value(), &e) == nil {
			e.prune(time.Now().UnixMilli(), (10 * time.Minute).Milliseconds())
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if c := strings.Compare(a.Tenant, b.Tenant); c != 0 {
			return c
		}
		return cmp.Compare(b.Start, a.Start)
	})
	return out, nil
}

func newID() string {
	var b [9]byte
	for i := range b {
		b[i] = byte(rand.IntN(256))
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}
