package lease

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
)

// flakyIndex fails its next fail writes, then writes the index; writes
// counts the writes asked for.
type flakyIndex struct {
	c      *bus.Client
	fail   int
	writes int
}

func (f *flakyIndex) PutWaiting(ctx context.Context, rec *bus.RunRecord, ifAbsent bool) error {
	f.writes++
	if f.fail > 0 {
		f.fail--
		return errors.New("index away")
	}
	return f.c.PutWaiting(ctx, rec, ifAbsent)
}

func (f *flakyIndex) DropWaiting(ctx context.Context, queue, run string) error {
	f.writes++
	if f.fail > 0 {
		f.fail--
		return errors.New("index away")
	}
	return f.c.DropWaiting(ctx, queue, run)
}

// TestWaitingIndexFollowsTheRecord: the lease keeps one index entry while
// the record it wrote says the run waits, written once (a heartbeat or a
// later attempt keeps its place), put again by the next attempt when a
// crash lost it, retried at the next write when it failed, rewritten when
// the wait's kind changes, and purged by the final record.
func TestWaitingIndexFollowsTheRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	idx := &flakyIndex{c: c}
	read := func(ctx context.Context, id string) (*bus.RunRecord, error) {
		e, err := kv.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		return bus.DecodeRecord(e)
	}
	env := &Env{KV: kv, Worker: "w1", Read: read, Index: idx}
	s, err := c.JetStream().Stream(ctx, c.Names().WaitingStream())
	if err != nil {
		t.Fatal(err)
	}
	subject := c.Names().WaitingEntry("default", "r1")
	// entry is the entry's sequence and kind; 0 when there is none.
	entry := func() (uint64, string) {
		t.Helper()
		m, err := s.GetLastMsgForSubject(ctx, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, ""
		}
		if err != nil {
			t.Fatal(err)
		}
		var e bus.WaitingIndexEntry
		if err := json.Unmarshal(m.Data, &e); err != nil {
			t.Fatal(err)
		}
		return m.Sequence, e.For
	}
	rec := func(attempt int, w string) *bus.RunRecord {
		r := &bus.RunRecord{ID: "r1", Queue: "default", State: bus.StateRunning, Attempt: attempt, Worker: "w1", RequestSeq: 7}
		if w != "" {
			r.Waiting = &bus.Waiting{For: w, Since: time.Now()}
		}
		return r
	}
	step := func(what string, err error, wantFor string) uint64 {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		seq, f := entry()
		if f != wantFor || (wantFor != "") != (seq != 0) {
			t.Fatalf("%s: entry %d %q, want %q", what, seq, f, wantFor)
		}
		return seq
	}
	take := func(l *Hold, r *bus.RunRecord) error {
		prev, err := read(ctx, "r1")
		if err != nil {
			return err
		}
		o, _, err := l.Take(ctx, prev, r)
		if err == nil && o != Taken {
			err = errors.New("not taken")
		}
		return err
	}

	l1 := New(env, "r1", 1, 7, nil)
	_, _, err = l1.Take(ctx, nil, rec(1, ""))
	step("a run that does not wait", err, "")
	first := step("it starts waiting", l1.Renew(ctx, rec(1, bus.WaitingApproval)), bus.WaitingApproval)
	if seq := step("a heartbeat", l1.Renew(ctx, rec(1, bus.WaitingApproval)), bus.WaitingApproval); seq != first {
		t.Fatalf("a heartbeat rewrote the entry (%d, was %d)", seq, first)
	}
	l2 := New(env, "r1", 2, 7, nil)
	if seq := step("the next attempt waits again", take(l2, rec(2, bus.WaitingApproval)), bus.WaitingApproval); seq != first {
		t.Fatalf("the next attempt moved the entry (%d, was %d)", seq, first)
	}
	// A crash between the record write and the put: the next attempt puts it.
	if err := c.DropWaiting(ctx, "default", "r1"); err != nil {
		t.Fatal(err)
	}
	l3 := New(env, "r1", 3, 7, nil)
	step("the attempt after a lost put", take(l3, rec(3, bus.WaitingApproval)), bus.WaitingApproval)
	// A failed write is retried at the next record write.
	idx.fail = 1
	step("a failed drop", l3.Renew(ctx, rec(3, "")), bus.WaitingApproval)
	step("the next heartbeat", l3.Renew(ctx, rec(3, "")), "")
	idx.fail = 1
	step("a failed put", l3.Renew(ctx, rec(3, bus.WaitingBudget)), "")
	step("the next heartbeat", l3.Renew(ctx, rec(3, bus.WaitingBudget)), bus.WaitingBudget)
	step("the wait's kind changes", l3.Renew(ctx, rec(3, bus.WaitingApproval)), bus.WaitingApproval)
	// A failed final drop is retried: no write comes after it.
	idx.fail = 1
	final := rec(3, "")
	final.State = bus.StatusSucceeded
	step("the final record", l3.WriteFinal(ctx, final), "")
}

// TestModelWaitsAreNotIndexed: a model call's rate-limit wait comes and
// goes with each call; the index lists neither it nor its end, so the
// heartbeats of a run whose calls wait write nothing to the index (they
// put and purged the entry at each heartbeat).
func TestModelWaitsAreNotIndexed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	idx := &flakyIndex{c: c}
	env := &Env{KV: kv, Worker: "w1", Index: idx}
	rec := func(w string) *bus.RunRecord {
		r := &bus.RunRecord{ID: "r2", Queue: "default", State: bus.StateRunning, Attempt: 1, Worker: "w1", RequestSeq: 3}
		if w != "" {
			r.Waiting = &bus.Waiting{For: w}
		}
		return r
	}
	l := New(env, "r2", 1, 3, nil)
	if _, _, err := l.Take(ctx, nil, rec("")); err != nil {
		t.Fatal(err)
	}
	taken := idx.writes
	for i := range 6 {
		w := ""
		if i%2 == 0 {
			w = bus.WaitingModel
		}
		if err := l.Renew(ctx, rec(w)); err != nil {
			t.Fatal(err)
		}
	}
	if n := idx.writes - taken; n != 0 {
		t.Fatalf("%d index writes for model waits, want none", n)
	}
	s, err := c.JetStream().Stream(ctx, c.Names().WaitingStream())
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.GetLastMsgForSubject(ctx, c.Names().WaitingEntry("default", "r2")); err == nil {
		t.Fatalf("a model wait's entry: %s", m.Data)
	}
}
