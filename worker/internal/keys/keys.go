// Package keys holds concurrency keys' places across the fleet (since
// protocol 1.10): one KV entry per key in agents_keys, changed only by
// compare-and-set, naming the runs that hold a place and the runs that
// wait for one, oldest first.
package keys

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Invariants:
//  1. An entry changes only by compare-and-set on the revision read, so
//     two workers never both take the last place.
//  2. A place names its run. A place is live while its run is (Alive: the
//     run's record, its lease, says it runs or is about to), so the taker
//     that finds a key full removes dead places in the same
//     compare-and-set: a killed worker's places go with its lease, they
//     are not forgotten; a run whose request is redelivered finds its own
//     place and keeps it.
//  3. A run waits (parked, holding nothing on a worker) only while it is in
//     the entry's waiting list. A release hands its place to the oldest
//     waiter in the same compare-and-set (the waiter's place is granted,
//     At the grant) and the releaser then wakes it: a woken run finds its
//     place already held. A granted place whose run did not start within
//     Grace is dead and its run waits first in line again (a lost wake).
//  4. Taking never waits for a place and never holds a slot: Take says
//     full, and the caller parks the run.
//  5. The line never depends on a later taker: Sweep (run by every
//     worker, docs/architecture.md) drops dead places and grants the
//     freed ones, so a line behind a killed worker, a lost wake or a
//     failed release moves within a few graces.
//  6. One limit per key: the smallest limit asked by the runs that hold
//     or wait for a place (each place keeps its run's), and the taker's.
//     Grants never pass it, and places free under it are granted to the
//     line at once (not only when a taker finds the key full).

// Place is one run's place in a key.
type Place struct {
	Run string    `json:"run"`
	At  time.Time `json:"at"`
	// Granted: handed over by a release to a waiting run, not yet taken
	// by it (invariant 3).
	Granted bool `json:"granted,omitempty"`
	// Limit is the limit the run asked (invariant 6; 0: an entry from
	// before it was kept).
	Limit int `json:"limit,omitempty"`
}

// Entry is a key's value in agents_keys.
type Entry struct {
	Key     string  `json:"key"`
	Limit   int     `json:"limit"`
	Holds   []Place `json:"holds"`
	Waiting []Place `json:"waiting,omitempty"`
}

func (e *Entry) holds(run string) int {
	return slices.IndexFunc(e.Holds, func(p Place) bool { return p.Run == run })
}

func (e *Entry) waits(run string) int {
	return slices.IndexFunc(e.Waiting, func(p Place) bool { return p.Run == run })
}

// limit is the key's limit in force with a taker asking asked (0: none),
// invariant 6; at least 1.
func (e *Entry) limit(asked int) int {
	lim := asked
	for _, ps := range [][]Place{e.Holds, e.Waiting} {
		for _, p := range ps {
			if p.Limit > 0 && (lim <= 0 || p.Limit < lim) {
				lim = p.Limit
			}
		}
	}
	if lim <= 0 {
		lim = e.Limit // places written before their limits were kept
	}
	return max(lim, 1)
}

// grant hands the free places to the line, oldest first, but not to
// skip (a taker that takes its own); it returns the runs granted.
func (e *Entry) grant(now time.Time, lim int, skip string) []string {
	var granted []string
	for len(e.Holds) < lim && len(e.Waiting) > 0 && e.Waiting[0].Run != skip {
		p := e.Waiting[0]
		granted = append(granted, p.Run)
		e.Holds = append(e.Holds, Place{Run: p.Run, At: now, Granted: true, Limit: p.Limit})
		e.Waiting = e.Waiting[1:]
	}
	return granted
}

// Env is what places need of the worker.
type Env struct {
	KV jetstream.KeyValue // agents_keys
	// Alive reports whether run still runs or is about to (its record):
	// false for a finished run, one parked, or one whose lease ran out.
	// A run without a record is alive (taking a place comes before the
	// lease); Grace bounds that.
	Alive func(ctx context.Context, run string) (bool, error)
	// Grace is how long a place may exist without a live record (a run
	// about to take its lease, a granted place whose wake is under way).
	Grace time.Duration
	Now   func() time.Time
}

// Name is the KV key of a concurrency key: any text a request may send
// becomes a valid KV token of fixed length.
func Name(key string) string {
	h := sha256.Sum256([]byte(key))
	return "k" + hex.EncodeToString(h[:16])
}

// Result is what Take did.
type Result int

const (
	Took    Result = iota + 1 // the run holds a place
	Waits                     // the key is full: the run is in the waiting list
	Granted                   // the run was in line and a place was free: it holds it now
)

// MaxPlaces bounds a key's places and line together: the entry is one KV
// value, and this many places stay well under the servers' 1 MiB payload
// (about 90 bytes each), so joining the line never fails on its size.
const MaxPlaces = 8000

// ErrLineFull: the key is full and its line has MaxPlaces runs with its
// holders; the run cannot wait for it.
var ErrLineFull = fmt.Errorf("concurrency key: its line is full (%d runs hold or wait)", MaxPlaces)

// maxTries bounds a compare-and-set loop: every round one writer of the
// key succeeds, so it is the writers of one key at once that it bounds.
const maxTries = 256

// Take gives run a place in key, limit places at most (invariant 6), or,
// when the key is full, puts it in the waiting list (if wait) and says
// so. Places free go to the runs waiting first, which it returns: the
// caller wakes them.
func (e *Env) Take(ctx context.Context, key string, limit int, run string, wait bool) (Result, []string, error) {
	name := Name(key)
	for range maxTries {
		cur, rev, err := e.get(ctx, name)
		if err != nil {
			return 0, nil, err
		}
		if cur.Key == "" {
			cur.Key = key
		}
		if i := cur.holds(run); i >= 0 { // a redelivery, or a granted place
			if !cur.Holds[i].Granted {
				return Took, nil, nil
			}
			cur.Holds[i] = Place{Run: run, At: e.Now(), Limit: limit}
			cur.Limit = cur.limit(0)
			if err := e.put(ctx, name, cur, rev); err != nil {
				if conflict(err) {
					continue
				}
				return 0, nil, err
			}
			return Took, nil, nil
		}
		lim := cur.limit(limit)
		if len(cur.Holds) >= lim {
			if err := e.sweep(ctx, &cur); err != nil {
				return 0, nil, err
			}
		}
		// Places free go to those in line first (invariant 3), but not
		// to this run: it takes its own below.
		wake := cur.grant(e.Now(), lim, run)
		res := Took
		w := cur.waits(run)
		switch {
		case len(cur.Holds) < lim && (len(cur.Waiting) == 0 || w == 0):
			// Free, and nobody waits before it (first come, first served).
			if w == 0 {
				cur.Waiting, res = cur.Waiting[1:], Granted
			}
			cur.Holds = append(cur.Holds, Place{Run: run, At: e.Now(), Limit: limit})
		case w < 0 && len(wake) == 0 && len(cur.Holds)+len(cur.Waiting) >= MaxPlaces:
			// Refused before the caller parks the run (takeKey asks
			// first without waiting); a join refused after the park is
			// handed back, and its redelivery refused here.
			return 0, nil, ErrLineFull
		case !wait && len(wake) == 0, w >= 0 && len(wake) == 0:
			return Waits, nil, nil
		case !wait, w >= 0:
			res = Waits // the wakes still need writing
		default:
			cur.Waiting = append(cur.Waiting, Place{Run: run, At: e.Now(), Limit: limit})
			res = Waits
		}
		cur.Limit = cur.limit(0)
		if err := e.put(ctx, name, cur, rev); err != nil {
			if conflict(err) {
				continue
			}
			return 0, nil, err
		}
		return res, wake, nil
	}
	return 0, nil, errors.New("concurrency key: too many concurrent writers")
}

// Release gives up run's place in key, or its place in line, and hands
// the places free to the oldest waiters, whose runs it returns: the
// caller wakes them.
func (e *Env) Release(ctx context.Context, key, run string) ([]string, error) {
	name := Name(key)
	for range maxTries {
		cur, rev, err := e.get(ctx, name)
		if err != nil {
			return nil, err
		}
		i, w := cur.holds(run), cur.waits(run)
		switch {
		case i >= 0:
			cur.Holds = slices.Delete(cur.Holds, i, i+1)
		case w >= 0:
			cur.Waiting = slices.Delete(cur.Waiting, w, w+1)
		default:
			return nil, nil // released already (a retried finish)
		}
		next := cur.grant(e.Now(), cur.limit(0), "")
		cur.Limit = cur.limit(0)
		if err := e.put(ctx, name, cur, rev); err != nil {
			if conflict(err) {
				continue
			}
			return nil, err
		}
		return next, nil
	}
	return nil, errors.New("concurrency key: too many concurrent writers")
}

// Sweep drops the dead places of the key whose KV name is name and grants
// the places free to its line (invariant 5); it returns the runs granted:
// the caller wakes them. A key nobody waits for is left alone (its dead
// places go when a taker finds it full).
func (e *Env) Sweep(ctx context.Context, name string) ([]string, error) {
	for range maxTries {
		cur, rev, err := e.get(ctx, name)
		if err != nil || len(cur.Waiting) == 0 || rev == 0 {
			return nil, err
		}
		if err := e.sweep(ctx, &cur); err != nil {
			return nil, err
		}
		wake := cur.grant(e.Now(), cur.limit(0), "")
		if len(wake) == 0 {
			return nil, nil
		}
		cur.Limit = cur.limit(0)
		if err := e.put(ctx, name, cur, rev); err != nil {
			if conflict(err) {
				continue
			}
			return nil, err
		}
		return wake, nil
	}
	return nil, errors.New("concurrency key: too many concurrent writers")
}

// Names lists the KV names of the keys in the bucket.
func (e *Env) Names(ctx context.Context) ([]string, error) {
	l, err := e.KV.ListKeys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("concurrency keys: %w", err)
	}
	var names []string
	for k := range l.Keys() {
		if len(k) == 33 && k[0] == 'k' { // Name's form; the bucket holds others (childkey)
			names = append(names, k)
		}
	}
	return names, nil
}

// sweep drops the dead places of a key (invariant 2); a granted
// place whose run never came back goes first in line again (invariant 3).
func (e *Env) sweep(ctx context.Context, cur *Entry) error {
	now := e.Now()
	kept := cur.Holds[:0:0]
	var again []Place
	for _, p := range cur.Holds {
		if now.Sub(p.At) < e.Grace {
			kept = append(kept, p)
			continue
		}
		if p.Granted {
			again = append(again, Place{Run: p.Run, At: p.At, Limit: p.Limit})
			continue
		}
		alive, err := e.Alive(ctx, p.Run)
		if err != nil {
			return err
		}
		if alive {
			kept = append(kept, p)
		}
	}
	cur.Holds = kept
	cur.Waiting = append(again, cur.Waiting...)
	return nil
}

// Read returns key's entry (zero when it has none).
func (e *Env) Read(ctx context.Context, key string) (Entry, error) {
	cur, _, err := e.get(ctx, Name(key))
	return cur, err
}

func (e *Env) get(ctx context.Context, name string) (Entry, uint64, error) {
	kv, err := e.KV.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Entry{}, 0, nil
	}
	if err != nil {
		return Entry{}, 0, fmt.Errorf("concurrency key: %w", err)
	}
	var cur Entry
	if err := json.Unmarshal(kv.Value(), &cur); err != nil {
		return Entry{}, 0, fmt.Errorf("concurrency key %s: %w", name, err)
	}
	return cur, kv.Revision(), nil
}

func (e *Env) put(ctx context.Context, name string, cur Entry, rev uint64) error {
	b, err := json.Marshal(cur)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = e.KV.Create(ctx, name, b)
	} else {
		_, err = e.KV.Update(ctx, name, b, rev)
	}
	return err
}

func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}
