package worker

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/lease"
	"github.com/agentfleet/agentfleet/worker/internal/runtrace"
)

// A requeued copy whose deliveries then all time out is given up with an
// attempt above every attempt the copy used, so readers (which drop
// envelopes of a lower attempt) see the run's end.
func TestRequeuedCopyGivenUpKeepsAttemptsRising(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	d := &deployTool{}
	spans, tp := spanRecorder(t)
	cfg := Config{Tools: []*agent.Tool{d.tool()}, MaxDeliver: 2, HeartbeatInterval: time.Second, TracerProvider: tp}
	_, stop := startOn(t, c, cfg)
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	handBackTwice(t, c, cfg, run, stop)
	// The copy's deliveries all time out (no heartbeat within AckWait).
	bad := cfg
	bad.AckWait, bad.HeartbeatInterval, bad.DrainTimeout = time.Second, time.Hour, 50*time.Millisecond
	startOn(t, c, bad)
	var highest, fell int // fell: an attempt written after a higher one
	rec := waitRecord(t, c, run, "given up", func(r *bus.RunRecord) bool {
		if r.Attempt < highest && fell == 0 {
			fell = r.Attempt
		}
		highest = max(highest, r.Attempt)
		return r.Finished()
	})
	if rec.Reason != bus.ReasonGaveUp || highest < 5 || fell != 0 || rec.Attempt != highest {
		t.Fatalf("final record attempt %d %s/%s; attempts up to %d, attempt %d written after a higher one: want gave_up above the copy's attempts",
			rec.Attempt, rec.State, rec.Reason, highest, fell)
	}
	if fin := re.finished(t); fin.Reason != bus.ReasonGaveUp {
		t.Fatalf("readers see %+v", fin)
	}
	// The give-up is an attempt in the trace too.
	endedSpans(t, spans, 1, func(sp sdktrace.ReadOnlySpan) bool {
		for _, a := range sp.Attributes() {
			if a.Key == runtrace.AttrGiveUp && a.Value.AsBool() {
				return sp.Name() == runtrace.SpanInvoke
			}
		}
		return false
	})
}

// A submitter setting the requeue headers on a request of its own for a
// live run's id does not take the run over: the run's record has no
// requeue marker for the request named, so it is a plain request reusing
// the id, and it is refused.
func TestForgedRequeueHeadersDoNotTakeOverARun(t *testing.T) {
	t.Parallel()
	_, c, d := approvalWorker(t, Config{HeartbeatInterval: time.Second})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	rec := waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	forged := &bus.RunRequest{Prompt: "other", Model: fauxModel, Faux: fauxTexts("hijacked")}
	body, _ := json.Marshal(forged)
	m := &nats.Msg{Subject: c.Names().Submit(rec.Queue, run), Data: body, Header: nats.Header{}}
	m.Header.Set(bus.HeaderRequeuedFrom, strconv.FormatUint(rec.RequestSeq, 10))
	m.Header.Set(bus.HeaderAttemptBase, "100")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ack, err := c.JetStream().PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := c.JetStream().Stream(ctx, c.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	// The forged request is settled (refused, or run) once it leaves the
	// work queue.
	for {
		if _, err := runs.GetMsg(ctx, ack.Sequence); errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("the forged request was never settled: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	after := waitRecord(t, c, run, "read", func(*bus.RunRecord) bool { return true })
	if after.Attempt != 1 || after.RequestSeq != rec.RequestSeq || !waitingFor(after, "c1") {
		t.Fatalf("after the forged request the record is %+v (was attempt 1 of request %d, waiting)", after, rec.RequestSeq)
	}
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded || d.targets() != "prod" {
		t.Fatalf("finished %+v, deploy %q; events %s", fin, d.targets(), re.types())
	}
}

// giveUpFixture is a request on a queue no worker pulls (any more), and a
// worker (pulling another queue) whose give-up the test calls itself.
type giveUpFixture struct {
	w          *Worker
	c          *bus.Client
	run, queue string
	seq        uint64 // the request's stream sequence
}

func newGiveUpFixture(t *testing.T, cfg Config) *giveUpFixture {
	cfg.Queues = []string{"idle"}
	w, c := startInternal(t, cfg, nil)
	f := &giveUpFixture{w: w, c: c, queue: "held", run: "rqrun1"}
	// A worker declares the queue (its subjects) and is gone.
	_, stop := startOn(t, c, Config{Queues: []string{f.queue}})
	stop()
	body, _ := json.Marshal(gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := c.JetStream().Publish(ctx, w.names.Submit(f.queue, f.run), body)
	if err != nil {
		t.Fatal(err)
	}
	f.seq = ack.Sequence
	return f
}

func (f *giveUpFixture) lastRequest(t *testing.T) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := f.w.runsStream.GetLastMsgForSubject(ctx, f.w.names.Submit(f.queue, f.run))
	if err != nil {
		t.Fatal(err)
	}
	return m.Sequence
}

func (f *giveUpFixture) putRecord(t *testing.T, rec *bus.RunRecord) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec.ID, rec.Queue, rec.StartedAt, rec.HeartbeatAt = f.run, f.queue, time.Now(), time.Now()
	data, _ := json.Marshal(rec)
	rev, err := f.w.kv.Put(ctx, f.run, data)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func (f *giveUpFixture) giveUp(t *testing.T, seq uint64, deliveries int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.w.giveUp(ctx, maxDeliveriesAdvisory{Stream: f.w.names.RunsStream(), StreamSeq: seq, Deliveries: deliveries}); err != nil {
		t.Fatalf("give-up: %v", err)
	}
}

func (f *giveUpFixture) deadLetter(t *testing.T) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dead, err := f.c.JetStream().Stream(ctx, f.w.names.DeadStream())
	if err != nil {
		t.Fatal(err)
	}
	_, err = dead.GetLastMsgForSubject(ctx, f.w.names.Dead(f.queue, f.run))
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// Only deliveries that were not waiting hand-backs count against
// MaxDeliver, over every requeue: a copy whose earlier requests already
// crashed, and that crashed again with one drain between, is given up
// (with its attempts rising from the marker's base), not requeued again.
func TestRequeueStopsWhenCrashesReachMaxDeliver(t *testing.T) {
	t.Parallel()
	f := newGiveUpFixture(t, Config{MaxDeliver: 2})
	// This request is a copy of an earlier one whose deliveries were one
	// drain and one crash; its own two were one drain and one crash.
	f.putRecord(t, &bus.RunRecord{State: bus.StateRunning, Attempt: 4, Worker: "gone", RequestSeq: f.seq,
		WaitingHandBacks: 1, Requeue: &bus.Requeue{From: f.seq + 100, AttemptBase: 2, Crashes: 1}})
	f.giveUp(t, f.seq, 2)
	rec := waitRecord(t, f.c, f.run, "read", func(*bus.RunRecord) bool { return true })
	if rec.State != bus.StatusFailed || rec.Reason != bus.ReasonGaveUp || rec.Attempt != 5 {
		t.Fatalf("record %s/%s attempt %d (requeue %+v): want failed/gave_up as attempt 5", rec.State, rec.Reason, rec.Attempt, rec.Requeue)
	}
	if !f.deadLetter(t) {
		t.Fatal("no dead letter")
	}
}

// The give-up retried after its requeued copy took the run over (removing
// the old request had failed) only removes the old request: no dead
// letter, and the live run is left alone.
func TestRequeueRetryAfterTheCopyTookOverLeavesTheRunAlone(t *testing.T) {
	t.Parallel()
	f := newGiveUpFixture(t, Config{MaxDeliver: 2})
	old := f.seq
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := f.w.runsStream.GetMsg(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	cp := &nats.Msg{Subject: req.Subject, Data: req.Data, Header: nats.Header{}}
	cp.Header.Set(bus.HeaderRequeuedFrom, strconv.FormatUint(old, 10))
	cp.Header.Set(bus.HeaderAttemptBase, "2")
	if _, err := f.c.JetStream().PublishMsg(ctx, cp); err != nil {
		t.Fatal(err)
	}
	copySeq := f.lastRequest(t)
	rev := f.putRecord(t, &bus.RunRecord{State: bus.StateRunning, Attempt: 3, Worker: "live", RequestSeq: copySeq,
		Requeue: &bus.Requeue{From: old, AttemptBase: 2}})
	f.giveUp(t, old, 2)
	if f.deadLetter(t) {
		t.Fatal("a dead letter for a live run")
	}
	if _, err := f.w.runsStream.GetMsg(ctx, old); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("old request: %v, want removed", err)
	}
	if rec, err := f.w.getRecord(ctx, f.run); err != nil || rec.Revision != rev {
		t.Fatalf("the live run's record was rewritten: %+v %v", rec, err)
	}
}

// Between the give-up's requeue marker and its copy, a request naming the
// replaced request in forged requeue headers still takes nothing over: the
// marker is bound to the copy's stream sequence, and only the copy resumes
// the run.
func TestRequeueMarkerAcceptsOnlyTheCopy(t *testing.T) {
	t.Parallel()
	w, c, d := approvalWorker(t, Config{HeartbeatInterval: time.Second})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	rec := waitRecord(t, c, run, "waiting", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The give-up's first step: the marker, not yet bound to a copy (the
	// running attempt's heartbeat may write in between: read again).
	for {
		cur, err := w.getRecord(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		marked := *cur
		marked.Requeue = &bus.Requeue{From: rec.RequestSeq, AttemptBase: 1}
		data, _ := json.Marshal(&marked)
		if _, err = w.kv.Update(ctx, run, data, cur.Revision); err == nil {
			break
		} else if !lease.IsConflict(err) {
			t.Fatal(err)
		}
	}
	body, _ := json.Marshal(&bus.RunRequest{Prompt: "other", Model: fauxModel, Faux: fauxTexts("hijacked")})
	m := &nats.Msg{Subject: c.Names().Submit(rec.Queue, run), Data: body, Header: nats.Header{}}
	m.Header.Set(bus.HeaderRequeuedFrom, strconv.FormatUint(rec.RequestSeq, 10))
	m.Header.Set(bus.HeaderAttemptBase, "1")
	forged, err := c.JetStream().PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	// The give-up goes on: the copy, bound, and the old request removed.
	if err := w.giveUp(ctx, maxDeliveriesAdvisory{Stream: w.names.RunsStream(), StreamSeq: rec.RequestSeq, Deliveries: 1}); err != nil {
		t.Fatal(err)
	}
	after := waitRecord(t, c, run, "taken by a request after the marker", func(r *bus.RunRecord) bool {
		return r.RequestSeq != rec.RequestSeq || r.Finished()
	})
	if after.Finished() || after.Requeue == nil || after.RequestSeq != after.Requeue.Copy || after.RequestSeq == forged.Sequence || after.Attempt != 2 {
		t.Fatalf("record %+v requeue %+v: want the copy (not request %d) as attempt 2", after, after.Requeue, forged.Sequence)
	}
	waitRecord(t, c, run, "waiting again", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") || r.Finished() })
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded || d.targets() != "prod" {
		t.Fatalf("finished %+v, deploy %q; events %s", fin, d.targets(), re.types())
	}
}
