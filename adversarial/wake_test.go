//go:build adversarial

package adversarial

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// Issue 54: a run parked on one queue is woken neither through another
// queue's subjects nor by a role that may not answer or abort it. The
// attacker has the best a submitter can have: the owner's own request
// bytes (identical to the kept copy), the park's sequence and attempt from
// the record, and the wake's Nats-Msg-Id. It publishes the wake on a
// queue the worker also serves (the copy would run the run there), and on
// the run's own queue (1.9 woke the run: only the bytes were checked); a
// submitter publishes an approval and an observer an abort, which their
// permissions refuse (the wake consumer would wake on either). The run
// stays parked, with its waiting-index entry where it was; the approver's
// answer wakes it once.
func TestAParkedRunIsNotWokenThroughAnotherQueueOrRole(t *testing.T) {
	f := startFleet(t, &worker.Config{ParkAfter: 300 * time.Millisecond, Queues: []string{"default", "other"}})
	owner, approver := f.Connect(t, "submitter"), f.Connect(t, "approver")
	req := fauxRun("parked-cross-queue", "compute", calc("6*7"), fleettest.Text("done"))
	req.Approval = &bus.Approval{Tools: []string{"calculator"}}
	submit(t, owner, req)
	ev := follow(t, approver, req.ID)
	ev.wait(t, "run_parked", func(e *bus.Event) bool { return e.RunParked != nil })
	rec := waitRecord(t, owner, req.ID, func(r *bus.RunRecord) bool { return r.Parked != nil })
	if rec.Queue != "default" {
		t.Fatalf("parked on %q, want default", rec.Queue)
	}
	entry := entrySeq(t, f, "default", req.ID)
	if entry == 0 {
		t.Fatal("the parked run has no waiting-index entry")
	}
	n := owner.Names()

	// The owner's own bytes (the kept copy's), with the park's headers, on
	// the other queue, then on the run's own (1.9 confirmed this one: the
	// owner woke its parked run with no answer; the wake key refuses it).
	body, err := agent.MarshalJSON(req)
	if err != nil {
		t.Fatal(err)
	}
	seq := strconv.FormatUint(rec.Parked.Seq, 10)
	for i, queue := range []string{"other", "default"} {
		m := &nats.Msg{Subject: n.Submit(queue, req.ID), Data: body, Header: nats.Header{}}
		m.Header.Set(bus.HeaderWokenFrom, seq)
		m.Header.Set(bus.HeaderAttemptBase, strconv.Itoa(rec.Parked.Attempt))
		m.Header.Set(bus.HeaderWakeKey, "guessed")
		if i == 0 {
			m.Header.Set(jetstream.MsgIDHeader, req.ID+":wake:"+seq)
		}
		if _, err := owner.JetStream().PublishMsg(ctx(t, 10*time.Second), m); err != nil {
			t.Fatalf("the submitter may publish requests on any queue: %v", err)
		}
		waitRunsEmpty(t, f, queue, 30*time.Second)
		if n := strings.Count(f.WorkerLog.String(), "wake the run's record does not confirm"); n != i+1 {
			t.Fatalf("the wake on queue %s was not dropped as unconfirmed (%d drops); events %s; worker log:\n%s", queue, n, ev.summary(), f.WorkerLog.String())
		}
	}

	// Roles that may not answer or abort: their control messages are
	// refused by their permissions, so the wake consumer never sees them.
	for _, c := range []struct{ role, kind, body string }{
		{"submitter", "approve", `{"toolCallId":"c1","decision":"approve","by":"mallory"}`},
		{"observer", "abort", `{"reason":"mallory"}`},
		{"toolservice", "approve", `{"toolCallId":"c1","decision":"approve","by":"mallory"}`},
	} {
		nc, _ := f.NATS(t, c.role)
		subj := n.Control(req.ID, c.kind)
		if err := nc.Publish(subj, []byte(c.body)); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		if !f.Log.Violation(c.role, subj) {
			t.Errorf("a %s published %s with no permissions violation", c.role, subj)
		}
	}

	cur := waitRecord(t, owner, req.ID, func(*bus.RunRecord) bool { return true })
	if cur.Parked == nil || cur.Revision != rec.Revision || cur.Queue != "default" {
		t.Fatalf("after the attacks the record is %+v (parked at revision %d)", cur, rec.Revision)
	}
	if got := entrySeq(t, f, "default", req.ID); got != entry {
		t.Fatalf("the waiting-index entry is at %d, was %d", got, entry)
	}
	if entrySeq(t, f, "other", req.ID) != 0 {
		t.Fatal("the run got an index entry on the other queue")
	}

	answer(t, approver, req.ID, "c1", bus.DecisionApprove, "alice")
	if fin := ev.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v; events %s", fin, ev.summary())
	}
	if s := ev.summary(); strings.Count(s, "run_started") != 2 {
		t.Fatalf("events %s: want the parked attempt and one woken attempt", s)
	}
}

// entrySeq is the sequence of run's waiting-index entry on queue (0:
// none), by a direct get as the worker role may.
func entrySeq(t *testing.T, f *fleet, queue, run string) uint64 {
	t.Helper()
	n := f.Worker.Names()
	m, err := f.Worker.Conn().RequestWithContext(ctx(t, 5*time.Second), "$JS.API.DIRECT.GET."+n.WaitingStream(),
		[]byte(`{"last_by_subj":"`+n.WaitingEntry(queue, run)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get("Status") == "404" {
		return 0
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		t.Fatalf("direct get: %v (%v)", err, m.Header)
	}
	return seq
}
