package worker

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// parkedRun submits a gated run to a worker that parks after 200 ms and
// returns once its record says parked.
func parkedRun(t *testing.T) (*Worker, *bus.Client, *deployTool, string, *runEvents, *bus.RunRecord) {
	t.Helper()
	w, c, d := approvalWorker(t, Config{ParkAfter: 200 * time.Millisecond, HeartbeatInterval: time.Second})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	parked := re.waitFor(t, bus.EventRunParked, 1).RunParked
	if parked.Attempt != 1 || parked.Waiting == nil || len(parked.Waiting.Approvals) != 1 || parked.Waiting.Approvals[0].ToolCallID != "c1" {
		t.Fatalf("run_parked %+v", parked)
	}
	rec := waitRecord(t, c, run, "parked", func(r *bus.RunRecord) bool { return r.Parked != nil && waitingFor(r, "c1") })
	return w, c, d, run, re, rec
}

// waitGone waits until nothing of run is on w (its goroutine returned).
func waitGone(t *testing.T, w *Worker, run string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.mu.Lock()
		_, on := w.runs[run]
		w.mu.Unlock()
		if !on && w.OffSlot() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s still on the worker", run)
		}
		time.Sleep(10 * time.Millisecond) // polls the worker's own state; nothing to wait on
	}
}

// A run waiting for an approval parks: its request is acknowledged and
// nothing of it stays on the worker, its record still lists it waiting;
// the answer wakes it on a new request and the call runs once.
func TestParkedRunWokenByItsAnswer(t *testing.T) {
	t.Parallel()
	w, c, d, run, re, rec := parkedRun(t)
	waitGone(t, w, run)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.runsStream.GetMsg(ctx, rec.RequestSeq); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("parked run's request still stored: %v", err)
	}
	// The record carries the kept copy's digest (1.10): the wake's pickup
	// checks it instead of reading the copy.
	if kept, err := w.parking.Parked.GetMsg(ctx, rec.Parked.Seq); err != nil || rec.Parked.Digest != bus.RequestDigest(kept.Header.Get(bus.HeaderWakeKey), kept.Data) {
		t.Fatalf("parked.digest %q of the kept copy (%v)", rec.Parked.Digest, err)
	}
	listed, err := c.List(ctx, bus.ListOptions{State: bus.StateWaiting})
	if err != nil || len(listed) != 1 || listed[0].ID != run || listed[0].Stale {
		t.Fatalf("list waiting: %v %+v", err, listed)
	}
	// The parked run keeps its waiting-index entry (the listing above read
	// it); the final record of the woken attempt purges it.
	idx, err := c.JetStream().Stream(ctx, c.Names().WaitingStream())
	if err != nil {
		t.Fatal(err)
	}
	entry, err := idx.GetLastMsgForSubject(ctx, c.Names().WaitingEntry(rec.Queue, run))
	if err != nil {
		t.Fatalf("the parked run's index entry: %v", err)
	}
	seq := sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "alice"})
	if res := re.waitFor(t, bus.EventToolApprovalResolved, 1).Approval; res.ControlSeq != seq || res.Decision != bus.DecisionApprove {
		t.Fatalf("resolved %+v, want approve at %d", res, seq)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v; events %s", fin, re.types())
	}
	if d.targets() != "prod" || re.count(bus.EventToolApprovalRequested) != 1 || re.count(bus.EventRunStarted) != 2 {
		t.Fatalf("deploy %q; events %s", d.targets(), re.types())
	}
	final := waitRecord(t, c, run, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
	if final.Parked != nil || final.Attempt != 2 {
		t.Fatalf("final record %+v", final)
	}
	if m, err := idx.GetLastMsgForSubject(ctx, c.Names().WaitingEntry(rec.Queue, run)); err == nil {
		t.Fatalf("the finished run's index entry is left (seq %d; parked at %d)", m.Sequence, entry.Sequence)
	}
	// The kept copy is removed once the wake holds the run.
	for {
		if _, err := w.parking.Parked.GetMsg(ctx, rec.Parked.Seq); errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		} else if ctx.Err() != nil {
			t.Fatal("parked request copy never removed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An abort of a parked run wakes it and it finishes aborted at once; the
// gated call never runs.
func TestParkedRunAborted(t *testing.T) {
	t.Parallel()
	_, c, d, run, re, _ := parkedRun(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Abort(ctx, run, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	if fin := re.finished(t); fin.Status != bus.StatusAborted || fin.Reason != bus.ReasonAbortedByUser {
		t.Fatalf("finished %+v; events %s", fin, re.types())
	}
	if d.targets() != "" {
		t.Fatalf("deploy ran: %q", d.targets())
	}
}

// publishWake publishes a request for run with the wake headers, as a
// submitter could.
func publishWake(t *testing.T, c *bus.Client, queue, run string, data []byte, from uint64, base int) {
	t.Helper()
	m := &nats.Msg{Subject: c.Names().Submit(queue, run), Data: data, Header: nats.Header{}}
	m.Header.Set(bus.HeaderWokenFrom, strconv.FormatUint(from, 10))
	m.Header.Set(bus.HeaderAttemptBase, strconv.Itoa(base))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.JetStream().PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
}

// A wake with another request's body (a forged one) is dropped: the run
// stays parked; a duplicate wake after the run was woken is dropped too
// and adds nothing to its events.
func TestForgedAndDuplicateWakesAreDropped(t *testing.T) {
	t.Parallel()
	w, c, d, run, re, rec := parkedRun(t)
	forged := []byte(`{"prompt":"x","tools":["deploy"],"model":{"provider":"faux","id":"s"}}`)
	publishWake(t, c, rec.Queue, run, forged, rec.Parked.Seq, rec.Parked.Attempt)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The forged wake is taken and dropped: the queue empties with the
	// run still parked.
	cons, err := c.JetStream().Consumer(ctx, c.Names().RunsStream(), c.Names().Consumer(rec.Queue))
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if cur, err := w.getRecord(ctx, run); err != nil || cur.Parked == nil || cur.Revision != rec.Revision {
		t.Fatalf("record after a forged wake: %v %+v (parked at revision %d)", err, cur, rec.Revision)
	}
	if re.count(bus.EventRunStarted) != 1 {
		t.Fatalf("forged wake ran: %s", re.types())
	}
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	// The wake again, as a waker past the dedupe window would publish it.
	rec.Revision = 0
	if err := w.parking.Wake(ctx, rec); err != nil {
		t.Fatal(err)
	}
	kept, err := w.parking.Parked.GetMsg(ctx, rec.Parked.Seq)
	if err == nil { // not removed yet: a forged body is not needed
		publishWake(t, c, rec.Queue, run, kept.Data, rec.Parked.Seq, rec.Parked.Attempt)
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := re.count(bus.EventRunStarted); n != 2 || d.targets() != "prod" {
		t.Fatalf("%d run_started (want 2), deploy %q; events %s", n, d.targets(), re.types())
	}
}

// A parked run's approval still times out at its expiry: the timer wakes
// it and the call is timed out (here the run aborts, as onTimeout says).
func TestParkedRunApprovalTimesOut(t *testing.T) {
	t.Parallel()
	_, c, d := approvalWorker(t, Config{ParkAfter: 200 * time.Millisecond, HeartbeatInterval: time.Second})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}, TimeoutSeconds: 3, OnTimeout: bus.OnTimeoutAbort}, "prod"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventRunParked, 1)
	if fin := re.finished(t); fin.Status != bus.StatusAborted || fin.Reason != bus.ReasonApprovalTimeout {
		t.Fatalf("finished %+v; events %s", fin, re.types())
	}
	if d.targets() != "" || re.count(bus.EventRunStarted) != 2 {
		t.Fatalf("deploy %q; events %s", d.targets(), re.types())
	}
}

// An answer stored while the run parks is not lost: here the run's
// attempt never sees it (its live control subscription is gone, and no
// heartbeat reads the stream before the park), and the wake consumer
// takes it while the record does not say parked yet, so wakes nothing.
// Once parked, the parking attempt finds the answer after what it took
// and wakes the run itself, before it acknowledges its request (after
// the ack, a crash would leave the answer to the timer): a subscriber of
// both sees the wake before the request's ack.
func TestAnswerWhileParkingWakesTheRun(t *testing.T) {
	t.Parallel()
	w, c, d := approvalWorker(t, Config{ParkAfter: 3 * time.Second, AckWait: 5 * time.Minute, HeartbeatInterval: time.Minute})
	// One channel for both subscriptions: the connection's read loop puts
	// the messages in it in the server's order.
	wire := make(chan *nats.Msg, 1<<16)
	for _, subj := range []string{c.Names().Submit("default", "*"), "$JS.ACK.>"} {
		sub, err := c.Conn().ChanSubscribe(subj, wire)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventToolApprovalRequested, 1)
	first, err := w.getRecord(context.Background(), run)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.ctlSub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	seq := sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "alice"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cons, err := c.JetStream().Consumer(ctx, c.Names().ControlStream(), c.Names().WakeConsumer())
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.AckFloor.Stream >= seq && info.NumAckPending == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond) // the consumer's state is all there is to wait on
	}
	if rec, err := w.getRecord(ctx, run); err != nil || rec.Parked != nil {
		t.Skipf("the run parked before the wake consumer took the answer (a loaded machine): %v", err)
	}
	re.waitFor(t, bus.EventRunParked, 1)
	if res := re.waitFor(t, bus.EventToolApprovalResolved, 1).Approval; res.ControlSeq != seq {
		t.Fatalf("resolved %+v, want the answer at %d", res, seq)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded || d.targets() != "prod" {
		t.Fatalf("finished %+v, deploy %q; events %s", fin, d.targets(), re.types())
	}
	woken := false
	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-wire:
			if m.Header.Get(bus.HeaderWokenFrom) != "" {
				woken = true
				continue
			}
			if stream, sseq, ok := ackedMsg(m.Subject); ok && stream == c.Names().RunsStream() && sseq == first.RequestSeq && string(m.Data) == "+ACK" {
				if !woken {
					t.Fatal("the parked run's request was acknowledged before its wake was published")
				}
				return
			}
		case <-deadline:
			t.Fatal("the parked run's request's ack not seen")
		}
	}
}

// ackedMsg parses an ack subject ($JS.ACK.…): the stream and the stream
// sequence of the message it acknowledges.
func ackedMsg(subject string) (stream string, seq uint64, ok bool) {
	tok := strings.Split(subject, ".")
	var err error
	switch {
	case len(tok) == 9 && tok[1] == "ACK":
		stream = tok[2]
		seq, err = strconv.ParseUint(tok[5], 10, 64)
	case len(tok) >= 11 && tok[1] == "ACK":
		stream = tok[4]
		seq, err = strconv.ParseUint(tok[7], 10, 64)
	default:
		return "", 0, false
	}
	return stream, seq, err == nil
}

// A run whose approval expires after AGENTS_PARKED's max age does not
// park (its copy and timer would age out first: it could never be woken
// or aborted, and its record would say parked for ever): it keeps
// waiting off its slot, and its answer applies there. A run whose
// approval expires within it parks.
func TestRunDoesNotParkPastTheParkedStreamsMaxAge(t *testing.T) {
	t.Parallel()
	_, c, d := approvalWorker(t, Config{ParkAfter: 200 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond,
		Streams: bus.StreamsConfig{RequestsMaxAge: time.Hour}})
	long := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}, TimeoutSeconds: 7200}, "prod"))
	short := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}, TimeoutSeconds: 600}, "staging"))
	rl, rs := followRun(t, c, long), followRun(t, c, short)
	rs.waitFor(t, bus.EventRunParked, 1)
	rec := waitRecord(t, c, long, "waiting well past --park-after", func(r *bus.RunRecord) bool {
		return r.Parked != nil || waitingFor(r, "c1") && r.HeartbeatAt.Sub(r.Waiting.Since) > 2*time.Second
	})
	if rec.Parked != nil || rl.count(bus.EventRunParked) != 0 {
		t.Fatalf("a run whose approval outlives AGENTS_PARKED parked: record parked %+v, events %s", rec.Parked, rl.types())
	}
	sendAnswer(t, c, long, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "alice"})
	if fin := rl.finished(t); fin.Status != bus.StatusSucceeded || d.targets() != "prod" || rl.count(bus.EventRunStarted) != 1 {
		t.Fatalf("finished %+v, deploy %q; events %s", fin, d.targets(), rl.types())
	}
}

// A woken run's control catch-ups (its pickup's, its idle check's) read
// each kind's literal subject: nats-server scans every message after the
// sequence asked for a wildcard next_by_subj (docs/benchmarks/2026-12.md,
// 2026-12-07).
func TestWokenRunReadsControlsByLiteralSubject(t *testing.T) {
	t.Parallel()
	w, c, _, run, re, _ := parkedRun(t)
	waitGone(t, w, run)
	var mu sync.Mutex
	var reads []string
	sub, err := c.Conn().Subscribe("$JS.API.STREAM.MSG.GET."+c.Names().ControlStream(), func(m *nats.Msg) {
		var req struct {
			NextBySubj string `json:"next_by_subj"`
		}
		if json.Unmarshal(m.Data, &req) == nil && strings.Contains(req.NextBySubj, "."+run+".") {
			mu.Lock()
			reads = append(reads, req.NextBySubj)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "alice"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v; events %s", fin, re.types())
	}
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, subj := range reads {
		if strings.ContainsAny(subj, "*>") {
			t.Errorf("control read with a wildcard subject %q", subj)
		}
	}
	if len(reads) == 0 {
		t.Fatal("no control read seen")
	}
}

// A run parked by its first attempt keeps its events on the kept copy
// (Agentfleet-Parked-State, its digest in parked.state): the woken attempt
// resumes from them without reading the run's events, and runs the
// answered call once.
func TestWokenRunResumesFromItsParkedState(t *testing.T) {
	t.Parallel()
	w, c, d, run, re, rec := parkedRun(t)
	waitGone(t, w, run)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kept, err := w.parking.Parked.GetMsg(ctx, rec.Parked.Seq)
	if err != nil {
		t.Fatal(err)
	}
	st := kept.Header.Get(bus.HeaderParkedState)
	if st == "" || rec.Parked.State != bus.StateDigest(st) {
		t.Fatalf("parked.state %q, kept state of %d bytes", rec.Parked.State, len(st))
	}
	// Every event to the park's: run_started first, run_parked last.
	envs, err := decodeParkState(st)
	got := stateEvents(envs)
	if err != nil || len(got) < 3 || got[0].Type != bus.EventRunStarted || got[len(got)-1].Type != bus.EventRunParked {
		t.Fatalf("state: %d envelopes (%v)", len(got), err)
	}
	var mu sync.Mutex
	var reads []string
	events := c.Names().EventsStream()
	for _, subj := range []string{"$JS.API.DIRECT.GET." + events, "$JS.API.DIRECT.GET." + events + ".>", "$JS.API.STREAM.MSG.GET." + events, "$JS.API.CONSUMER.CREATE." + events + ".>"} {
		sub, err := c.Conn().Subscribe(subj, func(m *nats.Msg) {
			if strings.Contains(m.Subject+string(m.Data), run) {
				mu.Lock()
				reads = append(reads, m.Subject)
				mu.Unlock()
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "alice"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v; events %s", fin, re.types())
	}
	if d.targets() != "prod" || re.count(bus.EventToolApprovalResolved) != 1 || re.count(bus.EventRunStarted) != 2 {
		t.Fatalf("deploy %q; events %s", d.targets(), re.types())
	}
	if r := re.waitFor(t, bus.EventRunResumed, 1).RunResumed; r == nil || r.MessagesRestored < 2 {
		t.Fatalf("run_resumed %+v", r)
	}
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reads) != 0 {
		t.Fatalf("the woken attempt read the run's events: %v", reads)
	}
}

// A run woken from its parked state that parks again keeps both attempts'
// events in its new state (the earlier state, then its own): its second
// wake resumes from it too, each gated call runs once.
func TestRunParkedAgainKeepsBothAttemptsInItsState(t *testing.T) {
	t.Parallel()
	w, c, d := approvalWorker(t, Config{ParkAfter: 200 * time.Millisecond, HeartbeatInterval: time.Second})
	req := gatedRequest(&bus.Approval{Tools: []string{"deploy"}})
	req.Faux = &bus.FauxScript{Responses: []agent.ScriptedResponse{
		{Content: []agent.Content{agent.ToolCall("c1", "deploy", map[string]any{"target": "prod"})}, StopReason: agent.StopReasonToolUse},
		{Content: []agent.Content{agent.ToolCall("c2", "deploy", map[string]any{"target": "staging"})}, StopReason: agent.StopReasonToolUse},
		{Content: []agent.Content{agent.Text("done")}}}}
	run := submitRun(t, c, req)
	re := followRun(t, c, run)
	re.waitFor(t, bus.EventRunParked, 1)
	waitRecord(t, c, run, "parked", func(r *bus.RunRecord) bool { return r.Parked != nil && r.Parked.State != "" && waitingFor(r, "c1") })
	waitGone(t, w, run)
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "alice"})
	re.waitFor(t, bus.EventRunParked, 2)
	rec := waitRecord(t, c, run, "parked again", func(r *bus.RunRecord) bool {
		return r.Parked != nil && r.Parked.Attempt == 2 && r.Parked.State != "" && waitingFor(r, "c2")
	})
	waitGone(t, w, run)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kept, err := w.parking.Parked.GetMsg(ctx, rec.Parked.Seq)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := decodeParkState(kept.Header.Get(bus.HeaderParkedState))
	if err != nil {
		t.Fatal(err)
	}
	started, parked := 0, 0
	for _, e := range stateEvents(raw) {
		switch e.Type {
		case bus.EventRunStarted:
			started++
		case bus.EventRunParked:
			parked++
		}
	}
	if started != 2 || parked != 2 {
		t.Fatalf("state of the second park: %d run_started, %d run_parked", started, parked)
	}
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c2", "decision": "approve", "by": "alice"})
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v; events %s", fin, re.types())
	}
	if d.targets() != "prod,staging" || re.count(bus.EventRunStarted) != 3 || re.count(bus.EventToolApprovalRequested) != 2 {
		t.Fatalf("deploy %q; events %s", d.targets(), re.types())
	}
}
