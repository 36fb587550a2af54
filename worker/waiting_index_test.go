package worker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/logbuf"
)

// indexSeq is the stream sequence of run's waiting-index entry (0: none).
func indexSeq(t *testing.T, c *bus.Client, run string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.JetStream().Stream(ctx, c.Names().WaitingStream())
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, c.Names().WaitingEntry("default", run))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return m.Sequence
}

// A run that waits keeps its place in the waiting index (the time its
// wait began) when the next attempt takes it over and waits on: the take's
// record keeps the earlier attempt's wait until the resume knows whether
// it goes on. Before, the take's record (not waiting yet) purged the
// entry and the resumed wait put it again at the end, behind runs that
// began to wait later.
func TestAReTakeKeepsTheRunsPlaceInTheWaitingIndex(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	d := &deployTool{}
	cfg := Config{Tools: []*agent.Tool{d.tool()}, DrainTimeout: time.Minute, HeartbeatInterval: time.Second}
	_, stopA := startOn(t, c, cfg)
	var runs []string
	var seqs []uint64
	for range 2 {
		run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
		waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
		seq := indexSeq(t, c, run)
		if seq == 0 {
			t.Fatalf("run %s waits with no index entry", run)
		}
		runs, seqs = append(runs, run), append(seqs, seq)
	}
	stopA() // hands both back, still waiting
	wB, _ := startOn(t, c, cfg)
	// Both wait on B (their resumes found c1 still waiting), and a record
	// written since says so: the entries are checked after B's own waits'
	// writes (the take's record alone would not tell the fix).
	for deadline := time.Now().Add(20 * time.Second); wB.OffSlot() != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d runs wait on the next worker, want 2", wB.OffSlot())
		}
	}
	waited := time.Now()
	for i, run := range runs {
		rec := waitRecord(t, c, run, "a heartbeat of the waiting attempt", func(r *bus.RunRecord) bool {
			return r.Attempt >= 2 && r.HeartbeatAt.After(waited) && waitingFor(r, "c1")
		})
		if got := indexSeq(t, c, run); got != seqs[i] {
			t.Fatalf("run %d's entry is at %d after the re-take (record %+v), was %d: it lost its place", i, got, rec.Waiting, seqs[i])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	page, err := c.ListPage(ctx, bus.ListOptions{State: bus.StateWaiting, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Records) != 2 || page.Records[0].ID != runs[0] || page.Records[1].ID != runs[1] {
		t.Fatalf("listed %d, want %v oldest wait first", len(page.Records), runs)
	}
}

// A worker started on a fleet with no AGENTS_WAITING (its streams predate
// 1.9; the worker skips EnsureStreams) says so once at its start and
// writes no index: before, each heartbeat of a waiting run sent an index
// write that failed, unlogged. The listing walks the records.
func TestNoWaitingIndexStreamIsSaidOnceAndNotWritten(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := c.JetStream().DeleteStream(ctx, c.Names().WaitingStream()); err != nil {
		t.Fatal(err)
	}
	// Every index write: a put on an entry's subject, a purge or a look
	// at the stream.
	var writes atomic.Int64
	for _, subj := range []string{c.Names().Prefix() + ".waiting.>", "$JS.API.STREAM.*." + c.Names().WaitingStream()} {
		sub, err := c.Conn().Subscribe(subj, func(*nats.Msg) { writes.Add(1) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := c.Conn().FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	logs := &logbuf.Buffer{}
	d := &deployTool{}
	w, _ := startOn(t, c, Config{Tools: []*agent.Tool{d.tool()}, SkipEnsureStreams: true, HeartbeatInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	started := writes.Load() // the start's one look
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	rec := waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	// Five heartbeats of the waiting run.
	waitRecord(t, c, run, "heartbeats", func(r *bus.RunRecord) bool { return r.HeartbeatAt.After(rec.HeartbeatAt.Add(time.Second)) })
	if n := writes.Load() - started; n != 0 {
		t.Errorf("%d index requests with no index stream, want none", n)
	}
	if n := strings.Count(logs.String(), "waiting-run index off"); n != 1 {
		t.Errorf("the missing index said %d times, want once:\n%s", n, logs.String())
	}
	listed, err := c.List(ctx, bus.ListOptions{State: bus.StateWaiting})
	if err != nil || len(listed) != 1 || listed[0].ID != run {
		t.Fatalf("listed %d waiting (%v), want the run from the records", len(listed), err)
	}
	started = writes.Load() // the listing's look
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	waitRecord(t, c, run, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
	if n := writes.Load() - started; n != 0 {
		t.Errorf("%d index requests with no index stream, want none", n)
	}
	if w.OffSlot() != 0 {
		t.Errorf("%d runs still off their slot", w.OffSlot())
	}
}

// A worker sweeps the waiting-run index: the entry of a run that finished
// while its final drop failed (here: put after its final record) goes
// within a few passes; a waiting run's entry stays.
func TestTheWorkerSweepsStaleIndexEntries(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	d := &deployTool{}
	startOn(t, c, Config{Tools: []*agent.Tool{d.tool()}, WaitingSweep: 100 * time.Millisecond})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	waits := indexSeq(t, c, run)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	final := &bus.RunRecord{ID: "r-stale", Queue: "default", State: bus.StatusSucceeded}
	if _, err := kv.Put(ctx, final.ID, []byte(`{"id":"r-stale","queue":"default","state":"succeeded"}`)); err != nil {
		t.Fatal(err)
	}
	final.State, final.Waiting = bus.StateRunning, &bus.Waiting{For: bus.WaitingApproval}
	if err := c.PutWaiting(ctx, final, false); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); indexSeq(t, c, "r-stale") != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stale entry is still there after 20 s of sweeps")
		}
	}
	if got := indexSeq(t, c, run); got != waits {
		t.Fatalf("the waiting run's entry is at %d, was %d", got, waits)
	}
}
