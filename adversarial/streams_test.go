//go:build adversarial

package adversarial

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/worker"
)

// The streams abused by a submitter (issue 50, items 4 and 6): junk
// control messages for a run id that does not exist yet, and requests on
// literal wildcard tokens.

// junkControls publishes count messages of kind for run through js (an
// attacker's own connection, with its role's permissions); it returns how
// many the stream refused.
func junkControls(ctx context.Context, t *testing.T, js jetstream.JetStream, n bus.Names, run, kind string, count int, body string) int {
	t.Helper()
	refused := 0
	for range count {
		if _, err := js.Publish(ctx, n.Control(run, kind), []byte(body)); err != nil {
			if ctx.Err() != nil {
				t.Fatal(err)
			}
			refused++
		}
	}
	return refused
}

// waitEventType follows a run until an event of typ, as role c.
func waitEventType(ctx context.Context, t *testing.T, c *bus.Client, run, typ string) {
	t.Helper()
	for env, err := range c.Follow(ctx, run) {
		if err != nil {
			t.Fatalf("follow %s: %v", run, err)
		}
		if env.Type == typ {
			return
		}
		if env.Type == bus.EventRunFinished {
			t.Fatalf("run %s finished before %s", run, typ)
		}
	}
	t.Fatalf("run %s: no %s", run, typ)
}

// sleepingRun waits in the sleep tool for a minute: a run alive when its
// owner aborts it.
func sleepingRun(id string) *bus.RunRequest {
	return &bus.RunRequest{ID: id, Prompt: "wait", Tools: []string{"sleep"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("s1", "sleep", map[string]any{"seconds": 60}), fleettest.Text("done")}}}
}

// Junk aborts, steers and follow-ups published by a submitter for a run id
// before the run exists (past the stream's per-subject cap) keep neither
// the owner's abort nor the console's out: the abort is stored and ends the
// run aborted. Before 1.8 the abort was refused (10077) for 7 days.
func TestControlJunkBeforeTheRunLocksNoAborterOut(t *testing.T) {
	for _, aborter := range []string{"submitter", "console"} {
		t.Run(aborter, func(t *testing.T) {
			f := startFleet(t, &worker.Config{})
			sub := f.Connect(t, "submitter")
			ab := sub
			if aborter != "submitter" {
				ab = f.Connect(t, aborter)
			}
			nc, _ := f.NATS(t, "submitter")
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			c := ctx(t, 2*time.Minute)
			id := "guessable-" + aborter
			junk := bus.MaxControlsPerSubject + 100
			for _, kind := range []string{bus.KindAbort, bus.KindSteer, bus.KindFollowUp} {
				refused := junkControls(c, t, js, sub.Names(), id, kind, junk, `{"reason":"junk","text":"junk"}`)
				t.Logf("junk %s for %s: %d sent, %d refused", kind, id, junk, refused)
			}
			if _, err := sub.Submit(c, "", sleepingRun(id)); err != nil {
				t.Fatal(err)
			}
			waitEventType(c, t, sub.Client, id, string(agent.EventToolExecutionStart))
			seq, err := ab.Abort(c, id, "the owner's abort")
			if err != nil {
				t.Fatalf("the %s's abort after %d junk aborts for the run id: %v", aborter, junk, err)
			}
			s, err := sub.JetStream().Stream(c, sub.Names().ControlStream())
			if err != nil {
				t.Fatal(err)
			}
			if last, err := s.GetLastMsgForSubject(c, sub.Names().Control(id, bus.KindAbort)); err != nil || last.Sequence != seq {
				t.Fatalf("the abort (sequence %d) is not the subject's last stored message: %v", seq, err)
			}
			tr, err := sub.LoadTranscript(c, id)
			if err != nil || !tr.Done() {
				t.Fatalf("transcript: %v", err)
			}
			if tr.Finished.Status != bus.StatusAborted || tr.Finished.Reason != bus.ReasonAbortedByUser {
				t.Fatalf("run ended %s/%s: %s", tr.Finished.Status, tr.Finished.Reason, tr.Finished.Error)
			}
			if !strings.Contains(f.WorkerLog.String(), "control message stored before the run's request; ignored") {
				t.Error("the worker did not log the junk it ignored")
			}
		})
	}
}

// Junk answers published by an approver for a run id before the run exists
// keep no approver out: the answer to the run's gated call is stored and
// the call runs.
func TestControlJunkAnswersBeforeTheRunKeepNoApproverOut(t *testing.T) {
	f := startFleet(t, &worker.Config{})
	sub := f.Connect(t, "submitter")
	appr := f.Connect(t, "approver")
	nc, _ := f.NATS(t, "approver")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t, 2*time.Minute)
	id := "guessable-gated"
	junk := bus.MaxControlsPerSubject + 100
	refused := junkControls(c, t, js, sub.Names(), id, bus.KindApprove, junk, `{"toolCallId":"c1","decision":"deny","reason":"junk"}`)
	t.Logf("junk answers for %s: %d sent, %d refused", id, junk, refused)
	req := fauxRun(id, "What is 6*7?",
		fleettest.ToolCall("c1", "calculator", map[string]any{"expression": "6*7"}), fleettest.Text("42"))
	req.Approval = &bus.Approval{Tools: []string{"calculator"}, TimeoutSeconds: 120}
	if _, err := sub.Submit(c, "", req); err != nil {
		t.Fatal(err)
	}
	waitEventType(c, t, appr.Client, id, bus.EventToolApprovalRequested)
	if _, err := appr.Answer(c, id, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove, By: "alice"}); err != nil {
		t.Fatalf("the approver's answer after %d junk answers for the run id: %v", junk, err)
	}
	tr, err := sub.LoadTranscript(c, id)
	if err != nil || !tr.Done() {
		t.Fatalf("transcript: %v", err)
	}
	if tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("run ended %s/%s: %s", tr.Finished.Status, tr.Finished.Reason, tr.Finished.Error)
	}
	ran := false
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult && !m.IsError && len(m.Content) > 0 && m.Content[0].Text == "42" {
			ran = true
		}
	}
	if !ran {
		t.Fatal("the approved calculator call did not run")
	}
}

// runsState reads AGENTS_RUNS and a queue's consumer as the worker role
// (the submitter may not read consumers).
func runsState(ctx context.Context, t *testing.T, f *fleet, queue string) (stored, lastSeq uint64, pending, unacked int) {
	t.Helper()
	n := f.Worker.Names()
	s, err := f.Worker.JetStream().Stream(ctx, n.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	si, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := f.Worker.JetStream().Consumer(ctx, n.RunsStream(), n.Consumer(queue))
	if err != nil {
		t.Fatal(err)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return si.State.Msgs, si.State.LastSeq, int(ci.NumPending), ci.NumAckPending
}

// waitRunsEmpty waits, up to d, until AGENTS_RUNS stores nothing and the
// queue's consumer has nothing pending or unacknowledged.
func waitRunsEmpty(t *testing.T, f *fleet, queue string, d time.Duration) {
	t.Helper()
	c := ctx(t, d+10*time.Second)
	for deadline := time.Now().Add(d); ; {
		stored, _, pending, unacked := runsState(c, t, f, queue)
		if stored == 0 && pending == 0 && unacked == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s AGENTS_RUNS keeps %d requests; the consumer has %d pending, %d unacknowledged",
				d, stored, pending, unacked)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// 10,000 requests a submitter publishes on literal wildcard tokens
// (agents.submit.default.>, agents.submit.*.* and agents.submit.default.*,
// which its permissions allow: their wildcards match a literal token; the
// stream stores all but agents.submit.*.*, a queue no one declared) leave nothing in
// AGENTS_RUNS 10 s later, and the worker's log says why each went. A real
// run among them runs. Before 1.8 the '>' ones were stored and never
// delivered nor removed.
func TestQueueLiteralWildcardFloodLeavesNothingPending(t *testing.T) {
	f := startFleet(t, &worker.Config{})
	sub := f.Connect(t, "submitter")
	nc, log := f.NATS(t, "submitter")
	c := ctx(t, 2*time.Minute)
	_, before, _, _ := runsState(c, t, f, bus.DefaultQueue)
	n := sub.Names()
	for i := range 10_000 {
		subj := n.Submit(bus.DefaultQueue, ">")
		switch i % 3 {
		case 1:
			subj = n.Submit("*", "*")
		case 2:
			subj = n.Submit(bus.DefaultQueue, "*")
		}
		if err := nc.Publish(subj, []byte(`{"prompt":"junk"}`)); err != nil {
			t.Fatal(err)
		}
		if i == 5_000 {
			if _, err := sub.Submit(c, "", fauxRun("amid-the-junk", "hi", fleettest.Text("hello"))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := nc.FlushWithContext(c); err != nil {
		t.Fatal(err)
	}
	flooded := time.Now()
	waitRunsEmpty(t, f, bus.DefaultQueue, 10*time.Second)
	emptied := time.Since(flooded)
	if f.Log.Violation("submitter", "agents.submit") {
		t.Fatalf("permissions refused the publishes; client log: %s", log.String())
	}
	_, after, _, _ := runsState(c, t, f, bus.DefaultQueue)
	junk := int(after - before - 1)
	if junk < 4_000 {
		t.Fatalf("the stream stored only %d junk requests: the attack did not happen", junk)
	}
	tr, err := sub.LoadTranscript(c, "amid-the-junk")
	if err != nil || !tr.Done() || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("the run amid the junk: %v %+v", err, tr.Finished)
	}
	// Not a line each (a flood of junk is no log flood): the first of each
	// 10 s, then a count, the last one when the worker stops.
	f.StopWorker()
	lines, logged := 0, 0
	for _, line := range strings.Split(f.WorkerLog.String(), "\n") {
		switch {
		case strings.Contains(line, "msg=\"request with an invalid subject terminated\""):
			lines++
			logged++
		case strings.Contains(line, "msg=\"more requests with an invalid subject terminated\""):
			_, count, _ := strings.Cut(line, " count=")
			k, err := strconv.Atoi(strings.Fields(count)[0])
			if err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			lines++
			logged += k
		}
	}
	if logged != junk || lines > 6 {
		t.Fatalf("the worker logged %d terminations in %d lines for %d junk requests stored", logged, lines, junk)
	}
	t.Logf("%d junk requests stored and terminated, the stream empty %s after the flood", junk, emptied.Round(time.Millisecond))
}

// What a 1.7 queue consumer (filter agents.submit.<queue>.*) passed over
// stays behind it for good (5,003 of them through two worker restarts in
// the report); a 1.8 worker starting removes it, with a logged reason.
func TestQueueJunkAnOlderWorkerPassedOverIsRemoved(t *testing.T) {
	f := startFleet(t, nil)
	sub := f.Connect(t, "submitter")
	nc, _ := f.NATS(t, "submitter")
	c := ctx(t, 2*time.Minute)
	n := f.Worker.Names()
	// The streams as a 1.7 worker leaves them: its consumer's filter.
	if err := f.Worker.EnsureStreams(c, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	cons, err := f.Worker.JetStream().CreateOrUpdateConsumer(c, n.RunsStream(), jetstream.ConsumerConfig{
		Durable: n.Consumer(bus.DefaultQueue), FilterSubject: n.SubmitFilter(bus.DefaultQueue),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxDeliver: 5, MaxAckPending: 10_000,
	})
	if err != nil {
		t.Fatal(err)
	}
	const runs, junkEach = 4, 1000
	for i := range runs {
		if i > 0 {
			for range junkEach {
				if err := nc.Publish(n.Submit(bus.DefaultQueue, ">"), []byte(`{"prompt":"junk"}`)); err != nil {
					t.Fatal(err)
				}
			}
			if err := nc.FlushWithContext(c); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := sub.SubmitRaw(c, bus.DefaultQueue, "real-"+string(rune('a'+i)), []byte(`{"prompt":"x"}`)); err != nil {
			t.Fatal(err)
		}
	}
	// The 1.7 worker takes the real requests; its consumer moves past the
	// junk between them.
	for taken := 0; taken < runs; {
		b, err := cons.Fetch(runs, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range b.Messages() {
			got++
			// A junk request delivered now and then (the filter passes
			// most over, not all) goes too.
			if err := m.DoubleAck(c); err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(m.Subject(), ">") {
				taken++
			}
		}
		if got == 0 {
			t.Fatalf("the 1.7 consumer delivered %d of %d real requests", taken, runs)
		}
	}
	stored, _, pending, unacked := runsState(c, t, f, bus.DefaultQueue)
	if stored < (runs-1)*junkEach-10 || pending != 0 || unacked != 0 {
		t.Fatalf("before the 1.8 worker: %d stored, %d pending, %d unacknowledged", stored, pending, unacked)
	}
	t.Logf("the 1.7 consumer left %d junk requests stored with nothing pending", stored)
	// A 1.8 worker starts on the same streams.
	logs := &logbuf.Buffer{}
	fleettest.RunWorker(t, worker.Config{Client: f.Worker.Client, WorkerID: "worker-1.8", DrainTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	waitRunsEmpty(t, f, bus.DefaultQueue, 10*time.Second)
	if !strings.Contains(logs.String(), "requests with an invalid subject removed") {
		t.Fatalf("the worker's log gives no reason:\n%s", logs.String())
	}
}
