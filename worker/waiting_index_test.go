package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
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
