package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// Widening AGENTS_RUNS' subjects when workers start together (since 1.10).
//
// A stream update has no compare-and-set: two workers that read the
// stream's config, add their queues and update it each write their own
// union, and the later one drops the other's subjects. Re-reading after
// one's own update does not help: a slower worker's stale update can come
// after the check. The entry declaredEntry of agents_keys, written only
// by compare-and-set, is the witness instead:
//
//  1. A worker adds its queues to the entry (compare-and-set), then
//  2. repeats: read the stream's config, then the entry; done when the
//     subjects cover every queue the entry names, else update the stream
//     to the union and repeat.
//
// Invariant: once every starting worker is done, the stream covers every
// queue added to the entry. The last update W made was followed by W's
// reads (stream, then entry), which found it covering: so every queue
// added before that entry read is covered. A queue added after it was
// added before its worker's own stream read, which saw W's update (the
// last), so that worker found it covered too or updated after W (then W
// was not last). A 1.9 worker starting at the same time does not take
// part and can still drop subjects.

// declaredEntry is the declared queues' entry in the keys bucket
// (concurrency keys' entries are k<32 hex>: no clash).
const declaredEntry = "queues"

// declaredQueues is the entry's value.
type declaredQueues struct {
	Queues []string `json:"queues"`
}

// maxDeclareTries bounds both loops; each try of the stream loop only
// adds subjects, so it ends once the fleet's workers stop starting.
const maxDeclareTries = 50

// declareQueues adds queues to the entry (step 1).
func declareQueues(ctx context.Context, kv jetstream.KeyValue, queues []string) error {
	for range maxDeclareTries {
		have, rev, err := readDeclared(ctx, kv)
		if err != nil {
			return err
		}
		out := have
		for _, q := range queues {
			if !slices.Contains(out, q) {
				out = append(out, q)
			}
		}
		if len(out) == len(have) && rev != 0 {
			return nil
		}
		slices.Sort(out)
		b, _ := json.Marshal(declaredQueues{Queues: out})
		if rev == 0 {
			_, err = kv.Create(ctx, declaredEntry, b)
		} else {
			_, err = kv.Update(ctx, declaredEntry, b, rev)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("declared queues: %w", err)
		}
		// Another worker wrote first: add to theirs.
	}
	return errors.New("declared queues: the entry keeps changing")
}

// readDeclared returns the entry's queues and revision (0: no entry).
func readDeclared(ctx context.Context, kv jetstream.KeyValue) ([]string, uint64, error) {
	e, err := kv.Get(ctx, declaredEntry)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("declared queues: %w", err)
	}
	var d declaredQueues
	if err := json.Unmarshal(e.Value(), &d); err != nil {
		return nil, 0, fmt.Errorf("declared queues: entry %s: %w", declaredEntry, err)
	}
	// An entry with a queue name that is not one is not used.
	d.Queues = slices.DeleteFunc(d.Queues, func(q string) bool { return CheckQueue(q) != nil })
	return d.Queues, e.Revision(), nil
}

// ensureRunsStream creates or widens AGENTS_RUNS to take the queues of
// every worker that declared its own (step 2). want's subjects are
// replaced by those of own and the entry's queues.
func (c *Client) ensureRunsStream(ctx context.Context, want jetstream.StreamConfig, own []string) error {
	kv, err := c.js.KeyValue(ctx, c.names.KeysBucket())
	if err != nil {
		return fmt.Errorf("kv bucket %s: %w", c.names.KeysBucket(), err)
	}
	if err := declareQueues(ctx, kv, own); err != nil {
		return err
	}
	for try := range maxDeclareTries {
		// The stream first, then the entry (the invariant's order).
		s, serr := c.js.Stream(ctx, want.Name)
		if serr != nil && !errors.Is(serr, jetstream.ErrStreamNotFound) {
			return serr
		}
		declared, _, err := readDeclared(ctx, kv)
		if err != nil {
			return err
		}
		w := want
		w.Subjects = queueSubjects(c.names, union(own, declared))
		if serr != nil { // not found
			_, err = c.js.CreateStream(ctx, w)
			if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				return err
			}
			continue // check it as any other
		}
		have := s.CachedInfo().Config
		widened := widenStream(have, w, false)
		// After an update, only the subjects are checked again: the server
		// may write back a limit in its own form.
		if reflect.DeepEqual(widened, have) || (try > 0 && slices.Equal(widened.Subjects, have.Subjects)) {
			return nil
		}
		if _, err := c.js.UpdateStream(ctx, widened); err != nil {
			return err
		}
	}
	return errors.New("the subjects keep changing")
}

// union returns a's queues, then b's that a lacks.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, q := range b {
		if !slices.Contains(out, q) {
			out = append(out, q)
		}
	}
	return out
}
