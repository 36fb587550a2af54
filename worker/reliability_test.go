package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/workerproto"
	"github.com/agentfleet/agentfleet/ratelimit"
	"github.com/agentfleet/agentfleet/worker"
)

// killable starts a worker that the test kills as if its process died
// (fleettest.Worker.Kill); it drains only briefly if the test ends first.
func killable(f *fleettest.Fleet, cfg worker.Config) (kill func()) {
	f.T.Helper()
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 50 * time.Millisecond
	}
	return f.StartWorker(cfg).Kill
}

// cancelGate is a gate tool that also reports its cancellation.
type cancelGate struct {
	*gate
	cancelled chan string
}

func newCancelGate() *cancelGate {
	return &cancelGate{gate: newGate(), cancelled: make(chan string, 100)}
}

func (g *cancelGate) tool() *agent.Tool {
	return agent.NewTool("gate", "waits until the test opens it", func(ctx context.Context, a gateArgs, _ agent.UpdateFunc) (agent.ToolResult, error) {
		g.started <- a.Name
		select {
		case <-g.release:
			return agent.TextResult("opened " + a.Name), nil
		case <-ctx.Done():
			g.cancelled <- a.Name
			return agent.ToolResult{}, ctx.Err()
		}
	})
}

func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

func allEvents(t *testing.T, f *fleettest.Fleet, id string) []*bus.Envelope {
	t.Helper()
	envs, err := f.Client.ReadEvents(fleettest.Context(t), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	return envs
}

// waitGone polls until get finds no message: a request leaves its stream
// after its run_finished, and no event marks that.
func waitGone(t *testing.T, what string, get func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := get()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the stream: no event to wait on
	}
}

func count(msgs []agent.Message, role, text string) int {
	n := 0
	for _, m := range msgs {
		if m.Role == role && m.TextOf() == text {
			n++
		}
	}
	return n
}

// A worker dies mid-run (in a tool call, with one steer in the transcript
// and one still queued): the redelivered request resumes on another worker
// from the events; the steer already in the transcript is not delivered
// again, the queued one is; the tool call gets an error result; the
// model is called only for what is missing.
func TestResumeAfterWorkerKilled(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newCancelGate()
	first := newObs()
	cfg := worker.Config{Tools: []*agent.Tool{g.tool()}, AckWait: time.Second, HeartbeatInterval: 250 * time.Millisecond, Observer: first}
	kill := killable(f, cfg)
	id := f.Submit("", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("c1", "gate", map[string]any{"name": "x"}),
			fleettest.ToolCall("c2", "gate", map[string]any{"name": "y"}),
			fleettest.Text("done"),
		}}})
	waitFor(t, g.started, "gate x")
	if _, err := f.Client.Steer(fleettest.Context(t), id, "first steer"); err != nil {
		t.Fatal(err)
	}
	// Wait until the worker has the steer queued, then let the tool end:
	// the steer goes into the transcript before the next model call.
	first.waitControl(t, bus.KindSteer)
	g.release <- struct{}{}
	waitFor(t, g.started, "gate y")
	if _, err := f.Client.Steer(fleettest.Context(t), id, "second steer"); err != nil {
		t.Fatal(err)
	}
	first.waitControl(t, bus.KindSteer)
	kill() // gate y runs: its start is stored before it ran (tools.go), the kill cannot lose it
	waitFor(t, g.cancelled, "gate y cancelled")

	o := newObs()
	cfg.Observer = o
	f.StartWorker(cfg)
	envs := f.Follow(id)
	tr := transcriptOf(t, envs)
	fin := tr.Finished
	if fin == nil || fin.Status != bus.StatusSucceeded || tr.Attempt != 2 || tr.Resumed == nil {
		t.Fatalf("resumed run: %+v\n%s", fin, fleettest.Dump(envs))
	}
	want := "user:go | assistant:call:gate | toolResult | user:first steer | assistant:call:gate | toolResult | user:second steer | assistant:done"
	if got := roles(tr.Messages); got != want {
		t.Fatalf("transcript\n got %s\nwant %s\n%s", got, want, fleettest.Dump(envs))
	}
	if tr.Resumed.MessagesRestored != 5 {
		t.Fatalf("restored %d messages", tr.Resumed.MessagesRestored)
	}
	if r := tr.Messages[5]; !r.IsError || r.TextOf() != workerproto.InterruptedToolResult || r.ToolCallID != "c2" {
		t.Fatalf("synthetic result %+v", r)
	}
	if tr.Messages[2].TextOf() != "opened x" {
		t.Fatalf("first tool result %q", tr.Messages[2].TextOf())
	}
	if fin.Turns != 3 {
		t.Fatalf("turns %d, want 3 (two restored, one run)", fin.Turns)
	}
	seqs := tr.ControlSeqs()
	if len(seqs) != 2 || seqs[0] >= seqs[1] {
		t.Fatalf("control seqs %v", seqs)
	}
	rec, err := f.Client.Status(fleettest.Context(t), id)
	if err != nil || rec.State != bus.StatusSucceeded || rec.Attempt != 2 || rec.Turns != 3 {
		t.Fatalf("record %+v %v", rec, err)
	}
}

// A worker that stalls past AckWait loses its run to another worker: the
// other resumes it and finishes it once; the stalled one, at its next
// lease renewal, stops its copy and publishes nothing after.
func TestLeaseLoss(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newCancelGate()
	// Worker A heartbeats later than AckWait: its request is redelivered.
	stopA := f.StartWorker(worker.Config{Tools: []*agent.Tool{g.tool()}, AckWait: time.Second,
		HeartbeatInterval: 1500 * time.Millisecond, WorkerID: "stalled", Concurrency: 1}).Stop
	id := f.Submit("", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.ToolCall("c1", "gate", map[string]any{"name": "x"}), fleettest.Text("done")}}})
	waitFor(t, g.started, "gate x")
	f.StartWorker(worker.Config{Tools: []*agent.Tool{g.tool()}, AckWait: time.Second, HeartbeatInterval: 250 * time.Millisecond, WorkerID: "healthy"})
	envs := f.Follow(id)
	tr := transcriptOf(t, envs)
	if tr.Finished == nil || tr.Finished.Status != bus.StatusSucceeded || tr.Attempt != 2 || envs[len(envs)-1].Worker != "healthy" {
		t.Fatalf("run: %s", fleettest.Dump(envs))
	}
	if got := roles(tr.Messages); got != "user:go | assistant:call:gate | toolResult | assistant:done" {
		t.Fatalf("transcript %s", got)
	}
	// The stalled worker learns at its renewal: its tool call is cancelled.
	waitFor(t, g.cancelled, "the stalled run's tool cancelled")
	stopA()
	finished := 0
	for _, e := range allEvents(t, f, id) {
		if e.Type == bus.EventRunFinished {
			finished++
		}
		if e.Worker == "stalled" && e.Type == string(agent.EventMessageEnd) {
			if m := fleettest.Decode(t, e).Agent.Message; m.Role == agent.RoleToolResult {
				t.Fatalf("the stalled worker published its cancelled tool result after losing the lease: %s", fleettest.Dump([]*bus.Envelope{e}))
			}
		}
	}
	if finished != 1 {
		t.Fatalf("%d run_finished", finished)
	}
	rec, err := f.Client.Status(fleettest.Context(t), id)
	if err != nil || rec.State != bus.StatusSucceeded || rec.Worker != "healthy" {
		t.Fatalf("record %+v %v", rec, err)
	}
}

// A request whose deliveries all end without finishing is given up: the
// record says failed/gave_up, the run gets its run_finished, the request
// leaves the work queue and a copy is on the dead-letter subject.
func TestGiveUp(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newCancelGate()
	// Heartbeats never come in time: every delivery times out.
	stop := f.StartWorker(worker.Config{Tools: []*agent.Tool{g.tool()}, AckWait: 500 * time.Millisecond,
		HeartbeatInterval: time.Hour, MaxDeliver: 2, DrainTimeout: 50 * time.Millisecond}).Stop
	id := f.Submit("", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("c1", "gate", map[string]any{"name": "x"}),
			fleettest.ToolCall("c2", "gate", map[string]any{"name": "y"}),
			fleettest.Text("never"),
		}}})
	envs := f.Follow(id)
	last := envs[len(envs)-1]
	fin := fleettest.Decode(t, last).RunFinished
	if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonGaveUp || last.Attempt != 3 || !strings.Contains(fin.Error, "agents.dead.default."+id) {
		t.Fatalf("given up run: %s", fleettest.Dump(envs))
	}
	tr := transcriptOf(t, envs)
	if tr.Resumed == nil || len(tr.Messages) < 2 {
		t.Fatalf("transcript of the given-up run: %s", roles(tr.Messages))
	}
	rec, err := f.Client.Status(fleettest.Context(t), id)
	if err != nil || rec.State != bus.StatusFailed || rec.Reason != bus.ReasonGaveUp {
		t.Fatalf("record %+v %v", rec, err)
	}
	runs, err := f.Client.Stream(fleettest.Context(t), f.Client.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	// The give-up removes the request after run_finished.
	waitGone(t, "request still queued", func() error {
		_, err := runs.GetMsg(fleettest.Context(t), 1, jetstream.WithGetMsgSubject(f.Client.Names().Submit("*", id)))
		return err
	})
	dead, err := f.Client.Stream(fleettest.Context(t), f.Client.Names().DeadStream())
	if err != nil {
		t.Fatal(err)
	}
	m, err := dead.GetLastMsgForSubject(fleettest.Context(t), "agents.dead.default."+id)
	if err != nil {
		t.Fatal(err)
	}
	var req bus.RunRequest
	if err := json.Unmarshal(m.Data, &req); err != nil || req.Prompt != "go" || m.Header.Get(bus.HeaderDeadReason) != bus.ReasonGaveUp ||
		m.Header.Get(bus.HeaderDeadDeliveries) != "2" {
		t.Fatalf("dead letter %s %v %v", m.Data, m.Header, err)
	}
	stop()
}

// Status and List report a running record whose heartbeat is too old as
// stale.
func TestStaleRecord(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	kv, err := f.Client.Records(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	for id, hb := range map[string]time.Time{"old": old, "fresh": time.Now()} {
		b, _ := json.Marshal(bus.RunRecord{ID: id, Queue: "default", State: bus.StateRunning, Attempt: 1, StartedAt: old, HeartbeatAt: hb})
		if _, err := kv.Put(fleettest.Context(t), id, b); err != nil {
			t.Fatal(err)
		}
	}
	f.Client.SetStaleAfter(time.Minute)
	if r, err := f.Client.Status(fleettest.Context(t), "old"); err != nil || !r.Stale || r.State != bus.StateRunning {
		t.Fatalf("old: %+v %v", r, err)
	}
	if r, err := f.Client.Status(fleettest.Context(t), "fresh"); err != nil || r.Stale {
		t.Fatalf("fresh: %+v %v", r, err)
	}
	recs, err := f.Client.List(fleettest.Context(t), bus.ListOptions{State: bus.StateStale})
	if err != nil || len(recs) != 1 || recs[0].ID != "old" {
		t.Fatalf("stale list %+v %v", recs, err)
	}
}

// A new request reusing a finished run's id is a bad request: terminated,
// run_started + run_finished(bad_request) after the original's end, the
// original's record untouched. Readers of the run still see the original.
func TestReusedRunID(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	id := f.Submit("", &bus.RunRequest{Prompt: "hi", Model: fleettest.FauxModel(), Faux: fleettest.Texts("hello")})
	f.Follow(id)
	before, err := f.Client.Status(fleettest.Context(t), id)
	if err != nil {
		t.Fatal(err)
	}
	advisories := make(chan *nats.Msg, 10)
	sub, err := f.Client.Conn().ChanSubscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.>", advisories)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// No Nats-Msg-Id: the stream does not dedupe it.
	if _, err := f.Client.JetStream().Publish(fleettest.Context(t), f.Client.Names().Submit("default", id), []byte(`{"prompt":"again"}`)); err != nil {
		t.Fatal(err)
	}
	waitTerminated(t, advisories)
	after, err := f.Client.Status(fleettest.Context(t), id)
	if err != nil || after.Revision != before.Revision || after.State != bus.StatusSucceeded {
		t.Fatalf("record changed: %+v -> %+v (%v)", before, after, err)
	}
	envs := allEvents(t, f, id)
	n := len(envs)
	if n < 4 || envs[n-2].Type != bus.EventRunStarted || envs[n-1].Type != bus.EventRunFinished {
		t.Fatalf("events: %s", fleettest.Dump(envs))
	}
	fin := fleettest.Decode(t, envs[n-1]).RunFinished
	if fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, id) {
		t.Fatalf("reused id: %+v", fin)
	}
	tr, err := f.Client.LoadTranscript(fleettest.Context(t), id)
	if err != nil || tr.Finished.Status != bus.StatusSucceeded || tr.FinalText() != "hello" {
		t.Fatalf("original transcript: %+v %v", tr.Finished, err)
	}
	tr2 := transcriptOf(t, envs)
	if tr2.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("reducer over all events: %+v", tr2.Finished)
	}
}

// A redelivered request whose run already finished is acked without
// running; if its run_finished is missing (a crash between the final
// record and run_finished), it is published from the record, with the
// record's lastControlSeq (here 9: an abort the lost attempt took, which
// the transcript does not show), or for a record of a worker before 1.6
// (none kept) the transcript's highest controlSeq.
func TestRedeliveryOfFinishedRun(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		kept, want uint64
	}{{"record of 1.6", 9, 9}, {"record before 1.6", 0, 7}} {
		t.Run(c.name, func(t *testing.T) { redeliverFinishedRun(t, c.kept, c.want) })
	}
}

func redeliverFinishedRun(t *testing.T, kept, want uint64) {
	f := newFleet(t)
	res, err := f.Client.Submit(fleettest.Context(t), "", &bus.RunRequest{Prompt: "hi", Model: fleettest.FauxModel(), Faux: fleettest.Texts("hello")})
	if err != nil {
		t.Fatal(err)
	}
	id := res.ID
	kv, err := f.Client.Records(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	b, _ := json.Marshal(bus.RunRecord{ID: id, Queue: "default", State: bus.StatusSucceeded, Attempt: 1, Worker: "gone",
		RequestSeq: res.Seq, StartedAt: now, FinishedAt: now, HeartbeatAt: now, Turns: 1, LastControlSeq: kept})
	if _, err := kv.Put(fleettest.Context(t), id, b); err != nil {
		t.Fatal(err)
	}
	started, _ := json.Marshal(bus.RunStarted{Type: bus.EventRunStarted, Queue: "default", Worker: "gone", Attempt: 1, Tools: []string{}})
	if _, err := f.Client.JetStream().Publish(fleettest.Context(t), f.Client.Names().Events(id), (&bus.Envelope{Run: id, Seq: 1, Attempt: 1, Worker: "gone", TS: now.UnixMilli(), Event: started}).AppendJSON(nil)); err != nil {
		t.Fatal(err)
	}
	// A steer the crashed attempt took (control seq 7).
	steer, _ := json.Marshal(map[string]any{"type": "message_end", "message": agent.Message{Role: agent.RoleUser, Content: []agent.Content{agent.Text("steer")}, Timestamp: 1}})
	if _, err := f.Client.JetStream().Publish(fleettest.Context(t), f.Client.Names().Events(id), (&bus.Envelope{Run: id, Seq: 2, Attempt: 1, Worker: "gone", TS: now.UnixMilli(), ControlSeq: 7, Event: steer}).AppendJSON(nil)); err != nil {
		t.Fatal(err)
	}
	o := newObs()
	f.StartWorker(worker.Config{Observer: o})
	envs := f.Follow(id)
	if len(envs) != 3 || envs[2].Type != bus.EventRunFinished || envs[2].Attempt != 1 || envs[2].Seq != 3 {
		t.Fatalf("events: %s", fleettest.Dump(envs))
	}
	if fin := fleettest.Decode(t, envs[2]).RunFinished; fin.Status != bus.StatusSucceeded || fin.Turns != 1 || fin.LastControlSeq != want {
		t.Fatalf("run_finished from the record: %+v, want lastControlSeq %d", fin, want)
	}
	runs, err := f.Client.Stream(fleettest.Context(t), f.Client.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, "request not acked", func() error {
		_, err := runs.GetMsg(fleettest.Context(t), res.Seq)
		return err
	})
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.started != 0 {
		t.Fatalf("the finished run ran again (%d starts)", o.started)
	}
}

// countObs signals once n events were stored.
type countObs struct {
	worker.NopObserver
	mu      sync.Mutex
	n, at   int
	reached chan struct{}
}

func (o *countObs) EventPublished() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n++
	if o.n == o.at {
		close(o.reached)
	}
}

// The NATS server restarts (same store) in the middle of a streaming run:
// the worker reconnects, re-sends what was not acknowledged, and the run
// finishes in its first attempt with gapless events.
func TestNATSServerRestartKeepsTheRun(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	o := &countObs{at: 15, reached: make(chan struct{})}
	f.StartWorker(worker.Config{AckWait: 10 * time.Second, Observer: o})
	text := strings.Repeat("word ", 60)
	id := f.Submit("", &bus.RunRequest{Prompt: "talk", Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.Text(text)}, TokenSize: 1, TokensPerSecond: 40}})
	waitFor(t, o.reached, "the run streaming")
	f.Restart()
	envs := f.Follow(id)
	fin := checkEnvelopes(t, id, envs) // attempt 1, seq 1..n without gaps
	tr := transcriptOf(t, envs)
	if fin.Status != bus.StatusSucceeded || tr.FinalText() != text {
		t.Fatalf("after the restart: %+v %q", fin, tr.FinalText())
	}
}

// A NATS restart loses the memory buckets (presence, shared rate limits):
// the worker creates them again and its presence comes back.
func TestPresenceComesBackAfterNATSRestart(t *testing.T) {
	t.Parallel()
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	prov := modelAt(t, srv.URL)
	f := fleettest.Start(t, fleettest.Options{})
	w := f.StartWorker(worker.Config{DefaultModel: "openai/m", Providers: map[string]worker.Provider{"openai": prov},
		RateLimits: &worker.RateLimits{Models: map[string]worker.ModelLimit{"openai/m": {Group: "main", Limits: ratelimit.Limits{Concurrency: 1}}}}})
	listed := func() bool {
		ws, err := f.Client.ListWorkers(fleettest.Context(t))
		return err == nil && len(ws) == 1 && ws[0].Worker == w.ID()
	}
	waitState(t, "the worker's presence", listed)
	f.Restart()
	if _, err := f.Client.Workers(fleettest.Context(t)); err == nil {
		t.Fatal("the presence bucket outlived the restart: this test tests nothing")
	}
	waitState(t, "the worker's presence after the restart", listed)
	// The shared rate limits work again.
	for range 2 {
		if fin := f.WaitFinished(f.Submit("", &bus.RunRequest{Prompt: "hi"})); fin.Status != bus.StatusSucceeded {
			t.Fatalf("run after the restart: %s/%s: %s", fin.Status, fin.Reason, fin.Error)
		}
	}
}

// After a NATS restart the shared limits' watch follows the bucket that
// was created again, whoever created it (here another client, first): a
// call waiting for a slot starts when the slot is settled, not when its
// timer fires (a minute here: the test allows 30 s). The runs before the
// restart put the old bucket's sequence ahead of the new one's.
func TestLimitsWatchFollowsNATSRestart(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var gate atomic.Bool // the next call waits for release
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if gate.CompareAndSwap(true, false) {
			entered <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`+"\n\n")
		fmt.Fprint(w, `data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`+"\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(srv.CloseClientConnections) // before Close: a gated call must not hold it
	prov := modelAt(t, srv.URL)
	f := fleettest.Start(t, fleettest.Options{})
	w := f.StartWorker(worker.Config{DefaultModel: "openai/m", Providers: map[string]worker.Provider{"openai": prov},
		RateLimits: &worker.RateLimits{Window: 2 * time.Minute, Liveness: 2 * time.Minute,
			Models: map[string]worker.ModelLimit{"openai/m": {Group: "main", Limits: ratelimit.Limits{Concurrency: 1}}}}})
	listed := func() bool {
		ws, err := f.Client.ListWorkers(fleettest.Context(t))
		return err == nil && len(ws) == 1 && ws[0].Worker == w.ID()
	}
	waitState(t, "the worker's presence", listed)
	for range 3 {
		if fin := f.WaitFinished(f.Submit("", &bus.RunRequest{Prompt: "before"})); fin.Status != bus.StatusSucceeded {
			t.Fatalf("run before the restart: %s/%s: %s", fin.Status, fin.Reason, fin.Error)
		}
	}
	f.Restart()
	// Another worker creates the buckets first: this one's writes find
	// them, so nothing tells it that its watch is on a bucket gone.
	if _, err := f.Client.EnsureMemoryBuckets(fleettest.Context(t), bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, "the worker's presence after the restart", listed)

	gate.Store(true)
	first := f.Submit("", &bus.RunRequest{Prompt: "first"})
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the first run's model call never came")
	}
	second := f.Submit("", &bus.RunRequest{Prompt: "second"})
	kv, err := f.Client.Limits(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, "the second call queued for the slot", func() bool {
		e, err := kv.Get(fleettest.Context(t), ratelimit.Key("main"))
		var s struct{ Queue []json.RawMessage }
		return err == nil && json.Unmarshal(e.Value(), &s) == nil && len(s.Queue) == 1
	})
	close(release)
	if fin := f.WaitFinished(first); fin.Status != bus.StatusSucceeded {
		t.Fatalf("first run: %s/%s: %s", fin.Status, fin.Reason, fin.Error)
	}
	// The slot is free now; the waiting call's timer is a minute away.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for env, err := range f.Client.Follow(ctx, second) {
		if err != nil {
			t.Fatalf("the waiting call did not see the slot settle (the limits watch is blind after the restart): %v", err)
		}
		if fin := fleettest.Decode(t, env).RunFinished; fin != nil {
			if fin.Status != bus.StatusSucceeded {
				t.Fatalf("second run: %s/%s: %s", fin.Status, fin.Reason, fin.Error)
			}
			return
		}
	}
	t.Fatal("the second run's events ended without run_finished")
}

// waitState polls ok until it holds (at most a minute).
func waitState(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A run whose deadline passed while it waited for redelivery is finished
// failed/timeout by the next attempt, not handed back until it gives up.
func TestRedeliveredAfterDeadlineTimesOut(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newCancelGate()
	cfg := worker.Config{Tools: []*agent.Tool{g.tool()}, AckWait: time.Second, HeartbeatInterval: 250 * time.Millisecond}
	kill := killable(f, cfg)
	id := f.Submit("", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"}, Model: fleettest.FauxModel(),
		Limits: &bus.Limits{TimeoutSeconds: 1},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("c1", "gate", map[string]any{"name": "x"}),
			fleettest.Text("done"),
		}}})
	waitFor(t, g.started, "gate x")
	kill()
	waitFor(t, g.cancelled, "gate x cancelled")
	// The redelivery comes after AckWait (1 s), past the run's 1 s budget.
	f.StartWorker(cfg)
	envs := f.Follow(id)
	tr := transcriptOf(t, envs)
	if fin := tr.Finished; fin == nil || fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonTimeout || tr.Attempt != 2 {
		t.Fatalf("run_finished %+v attempt %d\n%s", tr.Finished, tr.Attempt, fleettest.Dump(envs))
	}
}
