package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/llm/faux"
	"github.com/agentfleet/agentfleet/worker"
)

// gate is a test tool that blocks until the test opens it.
type gate struct {
	started chan string
	release chan struct{}
}

func newGate() *gate {
	return &gate{started: make(chan string, 100), release: make(chan struct{}, 100)}
}

type gateArgs struct {
	Name string `json:"name"`
}

func (g *gate) tool() *agent.Tool {
	return agent.NewTool("gate", "waits until the test opens it", func(ctx context.Context, a gateArgs, _ agent.UpdateFunc) (agent.ToolResult, error) {
		g.started <- a.Name
		select {
		case <-g.release:
			return agent.TextResult("opened " + a.Name), nil
		case <-ctx.Done():
			return agent.ToolResult{}, ctx.Err()
		}
	})
}

func (g *gate) waitStarted(t *testing.T) string {
	t.Helper()
	select {
	case n := <-g.started:
		return n
	case <-time.After(15 * time.Second):
		t.Fatal("gate tool never started")
		return ""
	}
}

// obs records what tests wait on.
type obs struct {
	worker.NopObserver
	controls chan string
	mu       sync.Mutex
	maxBusy  int
	started  int
}

func newObs() *obs { return &obs{controls: make(chan string, 100)} }

func (o *obs) ControlReceived(kind string) { o.controls <- kind }
func (o *obs) Slots(busy, total int) {
	o.mu.Lock()
	o.maxBusy = max(o.maxBusy, busy)
	o.mu.Unlock()
}
func (o *obs) RunStarted(worker.RunInfo) {
	o.mu.Lock()
	o.started++
	o.mu.Unlock()
}

func (o *obs) waitControl(t *testing.T, kind string) {
	t.Helper()
	select {
	case k := <-o.controls:
		if k != kind {
			t.Fatalf("control %s received, want %s", k, kind)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("control %s never received", kind)
	}
}

// localTrace runs the same script on a local Agent and returns its event
// types (with the stream event type for message_update).
func localTrace(t *testing.T, prompt string, tools []*agent.Tool, resps []agent.ScriptedResponse) []string {
	t.Helper()
	var fr []faux.Response
	for _, r := range resps {
		fr = append(fr, faux.Response{Content: r.Content, StopReason: r.StopReason, ErrorMessage: r.ErrorMessage})
	}
	m := faux.New(faux.Options{}, fr...)
	a := agent.New(agent.Options{StreamFn: m.Stream, Tools: tools, Model: agent.Model{ID: "scripted", Provider: "faux", API: "faux"}})
	var out []string
	a.Subscribe(func(_ context.Context, ev agent.Event) error {
		s := string(ev.Type)
		if ev.Type == agent.EventMessageUpdate {
			s += ":" + string(ev.StreamEvent.Type)
		}
		out = append(out, s)
		return nil
	})
	if err := a.Prompt(context.Background(), prompt); err != nil {
		t.Fatal(err)
	}
	return out
}

func wireTrace(t *testing.T, envs []*bus.Envelope) []string {
	var out []string
	for _, e := range envs {
		if e.Type == bus.EventRunStarted || e.Type == bus.EventRunFinished {
			continue
		}
		s := e.Type
		if e.Type == string(agent.EventMessageUpdate) {
			s += ":" + string(fleettest.Decode(t, e).Agent.AssistantMessageEvent.Type)
		}
		out = append(out, s)
	}
	return out
}

// checkEnvelopes checks the invariants of a run's envelopes
// (fleettest.CheckEnvelopes) and that the run had one attempt, with
// every envelope stamped.
func checkEnvelopes(t *testing.T, id string, envs []*bus.Envelope) *bus.RunFinished {
	t.Helper()
	fleettest.CheckEnvelopes(t, envs)
	if len(envs) < 2 {
		t.Fatalf("only %d envelopes", len(envs))
	}
	for i, e := range envs {
		if e.Run != id || e.Attempt != 1 || e.Worker == "" || e.TS == 0 {
			t.Fatalf("envelope %d: run=%s attempt=%d seq=%d worker=%q ts=%d", i, e.Run, e.Attempt, e.Seq, e.Worker, e.TS)
		}
	}
	return fleettest.Decode(t, envs[len(envs)-1]).RunFinished
}

func transcriptOf(t *testing.T, envs []*bus.Envelope) *bus.Transcript {
	tr := &bus.Transcript{}
	for _, e := range envs {
		if err := tr.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	return tr
}

func roles(msgs []agent.Message) string {
	var s []string
	for _, m := range msgs {
		switch m.Role {
		case agent.RoleUser:
			s = append(s, "user:"+m.TextOf())
		case agent.RoleAssistant:
			if calls := m.ToolCalls(); len(calls) > 0 {
				s = append(s, "assistant:call:"+calls[0].Name)
			} else {
				s = append(s, "assistant:"+m.TextOf())
			}
		default:
			s = append(s, m.Role)
		}
	}
	return strings.Join(s, " | ")
}

func TestTextRun(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	resps := []agent.ScriptedResponse{fleettest.Text("The answer is forty-two, as everyone knows.")}
	id := f.Submit("", &bus.RunRequest{Prompt: "what is the answer?", Model: fleettest.FauxModel(), Faux: &bus.FauxScript{Responses: resps}})
	envs := f.Follow(id)
	fin := checkEnvelopes(t, id, envs)
	if fin.Status != bus.StatusSucceeded || fin.Turns != 1 || fin.Usage.TotalTokens == 0 {
		t.Fatalf("run_finished = %+v", fin)
	}
	want := localTrace(t, "what is the answer?", nil, resps)
	if got := wireTrace(t, envs); !slices.Equal(got, want) {
		t.Fatalf("event order differs from the agent's own trace:\n got %v\nwant %v", got, want)
	}
	started := fleettest.Decode(t, envs[0]).RunStarted
	if started.Queue != "default" || started.Attempt != 1 || started.Model.String() != "faux/scripted" || started.Worker != envs[0].Worker {
		t.Fatalf("run_started = %+v", started)
	}
	tr := transcriptOf(t, envs)
	if got := roles(tr.Messages); got != "user:what is the answer? | assistant:The answer is forty-two, as everyone knows." {
		t.Fatalf("transcript: %s", got)
	}
	// message_update carries a delta, never the partial message.
	for _, e := range envs {
		if e.Type == "message_update" && strings.Contains(string(e.Event), `"message"`) {
			t.Fatalf("message_update with a message: %s", e.Event)
		}
	}
	// agent_end refers to message_end seqs.
	end := fleettest.Decode(t, envs[len(envs)-2]).Agent
	if end.Type != "agent_end" || *end.MessageCount != 2 || len(end.MessageSeqs) != 2 {
		t.Fatalf("agent_end = %+v", end)
	}
	for _, s := range end.MessageSeqs {
		if envs[s-1].Type != "message_end" {
			t.Fatalf("agent_end refers to seq %d, a %s", s, envs[s-1].Type)
		}
	}
}

func TestToolRun(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	resps := []agent.ScriptedResponse{
		fleettest.ToolCall("c1", "calculator", map[string]any{"expression": "(2+3)*4^2"}),
		fleettest.Text("It is 80."),
	}
	id := f.Submit("", &bus.RunRequest{Prompt: "compute", Tools: []string{"calculator"}, Model: fleettest.FauxModel(), Faux: &bus.FauxScript{Responses: resps}})
	envs := f.Follow(id)
	fin := checkEnvelopes(t, id, envs)
	if fin.Status != bus.StatusSucceeded || fin.Turns != 2 {
		t.Fatalf("run_finished = %+v\n%s", fin, fleettest.Dump(envs))
	}
	want := localTrace(t, "compute", worker.BuiltinTools()[:1], resps)
	if got := wireTrace(t, envs); !slices.Equal(got, want) {
		t.Fatalf("event order differs from the agent's own trace:\n got %v\nwant %v", got, want)
	}
	tr := transcriptOf(t, envs)
	if got := roles(tr.Messages); got != "user:compute | assistant:call:calculator | toolResult | assistant:It is 80." {
		t.Fatalf("transcript: %s", got)
	}
	if res := tr.Messages[2]; res.TextOf() != "80" || res.IsError {
		t.Fatalf("tool result %+v", res)
	}
	for _, e := range envs {
		ev := fleettest.Decode(t, e)
		if ev.Type == "turn_end" && len(ev.Agent.ToolResultSeqs) == 1 {
			if s := ev.Agent.ToolResultSeqs[0]; envs[s-1].Type != "message_end" || !strings.Contains(string(envs[s-1].Event), `"toolResult"`) {
				t.Fatalf("turn_end refers to %s", envs[s-1].Event)
			}
		}
		if ev.Type == "tool_execution_end" && (ev.Agent.IsError == nil || *ev.Agent.IsError) {
			t.Fatalf("tool_execution_end %s", e.Event)
		}
	}
}

func TestSteerDuringToolsAndFollowUp(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newGate()
	o := newObs()
	f.StartWorker(worker.Config{Tools: []*agent.Tool{g.tool()}, Observer: o})
	resps := []agent.ScriptedResponse{
		fleettest.ToolCall("c1", "gate", map[string]any{"name": "one"}),
		fleettest.Text("steered answer"),
		fleettest.Text("follow-up answer"),
	}
	id := f.Submit("", &bus.RunRequest{Prompt: "start", Tools: []string{"gate"}, Model: fleettest.FauxModel(), Faux: &bus.FauxScript{Responses: resps}})
	g.waitStarted(t)
	steerSeq, err := f.Client.Steer(fleettest.Context(t), id, "change course")
	if err != nil {
		t.Fatal(err)
	}
	o.waitControl(t, bus.KindSteer)
	fuSeq, err := f.Client.FollowUp(fleettest.Context(t), id, "and then?")
	if err != nil {
		t.Fatal(err)
	}
	o.waitControl(t, bus.KindFollowUp)
	g.release <- struct{}{}
	envs := f.Follow(id)
	fin := checkEnvelopes(t, id, envs)
	if fin.Status != bus.StatusSucceeded || fin.LastControlSeq != fuSeq {
		t.Fatalf("run_finished = %+v", fin)
	}
	// The final record keeps it, for a run_finished published from it.
	if rec, err := f.Client.Status(fleettest.Context(t), id); err != nil || rec.LastControlSeq != fuSeq {
		t.Fatalf("final record: %+v (%v), want lastControlSeq %d", rec, err, fuSeq)
	}
	tr := transcriptOf(t, envs)
	want := "user:start | assistant:call:gate | toolResult | user:change course | assistant:steered answer | user:and then? | assistant:follow-up answer"
	if got := roles(tr.Messages); got != want {
		t.Fatalf("transcript:\n got %s\nwant %s", got, want)
	}
	if got := tr.ControlSeqs(); !slices.Equal(got, []uint64{steerSeq, fuSeq}) {
		t.Fatalf("controlSeqs %v, want %v", got, []uint64{steerSeq, fuSeq})
	}
	// Both message_start and message_end of a control message carry controlSeq.
	n := 0
	for _, e := range envs {
		if e.ControlSeq != 0 {
			n++
		}
	}
	if n != 4 {
		t.Fatalf("%d envelopes with controlSeq, want 4", n)
	}
	// The run has finished: further messages are refused.
	if _, err := f.Client.Steer(fleettest.Context(t), id, "too late"); !errors.Is(err, bus.ErrRunFinished) {
		t.Fatalf("steer after the end: %v", err)
	}
}

func TestSteerAndAbortBeforePickup(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	steered := f.Submit("", &bus.RunRequest{Prompt: "first", Model: fleettest.FauxModel(), Faux: fleettest.Texts("one", "two")})
	if _, err := f.Client.Steer(fleettest.Context(t), steered, "also this"); err != nil {
		t.Fatal(err)
	}
	aborted := f.Submit("", &bus.RunRequest{Prompt: "never", Model: fleettest.FauxModel(), Faux: fleettest.Texts("nope")})
	if _, err := f.Client.Abort(fleettest.Context(t), aborted, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	rec, err := f.Client.Status(fleettest.Context(t), aborted)
	if err != nil || rec.State != bus.StateQueued || rec.Queue != "default" {
		t.Fatalf("status before pickup: %+v %v", rec, err)
	}
	f.StartWorker(worker.Config{})

	envs := f.Follow(steered)
	checkEnvelopes(t, steered, envs)
	tr := transcriptOf(t, envs)
	if got := roles(tr.Messages); got != "user:first | user:also this | assistant:one" {
		t.Fatalf("steered transcript: %s", got)
	}

	envs = f.Follow(aborted)
	fin := checkEnvelopes(t, aborted, envs)
	if fin.Status != bus.StatusAborted || fin.Reason != bus.ReasonAbortedByUser || fin.Error != "changed my mind" {
		t.Fatalf("run_finished %+v", fin)
	}
	if got := fleettest.Types(envs); !slices.Equal(got, []string{"run_started", "run_finished"}) {
		t.Fatalf("aborted before pickup: %v", got)
	}
	rec, err = f.Client.Status(fleettest.Context(t), aborted)
	if err != nil || rec.State != bus.StatusAborted {
		t.Fatalf("record %+v %v", rec, err)
	}
}

func TestAbortMidStream(t *testing.T) {
	// Not parallel: it bounds the abort's latency (1 s).
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	long := strings.Repeat("word ", 2000)
	id := f.Submit("", &bus.RunRequest{Prompt: "talk", Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.Text(long)}, TokenSize: 1, TokensPerSecond: 50}})
	var sent time.Time
	var fin *bus.RunFinished
	for env, err := range f.Client.Follow(fleettest.Context(t), id) {
		if err != nil {
			t.Fatal(err)
		}
		if env.Type == "message_update" && sent.IsZero() {
			if _, err := f.Client.Abort(fleettest.Context(t), id, ""); err != nil {
				t.Fatal(err)
			}
			sent = time.Now()
		}
		if env.Type == bus.EventRunFinished {
			fin = fleettest.Decode(t, env).RunFinished
		}
	}
	took := time.Since(sent)
	if fin == nil || fin.Status != bus.StatusAborted || fin.Reason != bus.ReasonAbortedByUser {
		t.Fatalf("run_finished %+v", fin)
	}
	if took > time.Second {
		t.Fatalf("abort took %s from publish to run_finished", took)
	}
	t.Logf("abort to run_finished: %s", took)
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	cases := []struct {
		name, body, want string
	}{
		{"malformed", `{"prompt": "hi"`, "malformed JSON"},
		{"unknown field", `{"prompt": "hi", "bogus": 1}`, `unknown field "bogus"`},
		{"no prompt", `{}`, `no "prompt"`},
		{"unknown tool", `{"prompt":"hi","tools":["rm_rf"]}`, `unknown tool "rm_rf"`},
		{"unknown provider", `{"prompt":"hi","model":"nowhere/x"}`, `unknown model provider "nowhere"`},
		{"id mismatch", `{"id":"other","prompt":"hi"}`, "differs from the subject"},
		{"oversized", `{"prompt":"` + strings.Repeat("x", bus.MaxPromptBytes+1) + `"}`, "prompt is"},
		{"bad limits", `{"prompt":"hi","limits":{"maxTurns":-1}}`, "limits.maxTurns"},
	}
	for i, c := range cases {
		id := fmt.Sprintf("bad-%d", i)
		if _, err := f.Client.SubmitRaw(fleettest.Context(t), "", id, []byte(c.body)); err != nil {
			t.Fatal(err)
		}
		envs := f.Follow(id)
		fin := checkEnvelopes(t, id, envs)
		if len(envs) != 2 || fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, c.want) {
			t.Errorf("%s: %d events, %+v", c.name, len(envs), fin)
		}
		rec, err := f.Client.Status(fleettest.Context(t), id)
		if err != nil || rec.State != bus.StatusFailed || rec.Reason != bus.ReasonBadRequest || !strings.Contains(rec.Error, c.want) {
			t.Errorf("%s: record %+v %v\n%s", c.name, rec, err, fleettest.Dump(envs))
		}
	}

	// A finished run's id reused by a new request (past the dedupe window,
	// simulated by another Nats-Msg-Id): terminated, the run untouched.
	id := f.Submit("", &bus.RunRequest{Prompt: "hi", Model: fleettest.FauxModel(), Faux: fleettest.Texts("done")})
	before := f.Follow(id)
	advisories := make(chan *nats.Msg, 10)
	sub, err := f.Client.Conn().ChanSubscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.>", advisories)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	m := nats.NewMsg(f.Client.Names().Submit("default", id))
	m.Data = []byte(`{"prompt":"again"}`)
	m.Header.Set("Nats-Msg-Id", id+"-again")
	if _, err := f.Client.JetStream().PublishMsg(fleettest.Context(t), m); err != nil {
		t.Fatal(err)
	}
	waitTerminated(t, advisories)
	after := f.Follow(id)
	if len(after) != len(before) {
		t.Fatalf("reused id changed the run's events: %d -> %d", len(before), len(after))
	}
	rec, err := f.Client.Status(fleettest.Context(t), id)
	if err != nil || rec.State != bus.StatusSucceeded {
		t.Fatalf("reused id changed the record: %+v %v", rec, err)
	}

	// A subject whose run token fails the id pattern: terminated, no events.
	bad := strings.Repeat("x", 65)
	if _, err := f.Client.JetStream().Publish(fleettest.Context(t), "agents.submit.default."+bad, []byte(`{"prompt":"hi"}`)); err != nil {
		t.Fatal(err)
	}
	waitTerminated(t, advisories)
	s, err := f.Client.JetStream().Stream(fleettest.Context(t), f.Client.Names().EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLastMsgForSubject(fleettest.Context(t), "agents.run."+bad+".events"); err == nil {
		t.Fatal("events published for an invalid run id")
	}
	// The worker is still up.
	id2 := f.Submit("", &bus.RunRequest{Prompt: "still there?", Model: fleettest.FauxModel(), Faux: fleettest.Texts("yes")})
	if fin := checkEnvelopes(t, id2, f.Follow(id2)); fin.Status != bus.StatusSucceeded {
		t.Fatalf("after bad requests: %+v", fin)
	}
}

func waitTerminated(t *testing.T, ch chan *nats.Msg) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(15 * time.Second):
		t.Fatal("no MSG_TERMINATED advisory")
	}
}

func TestTwoWorkersOneQueue(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	o1, o2 := newObs(), newObs()
	f.StartWorker(worker.Config{Concurrency: 4, Observer: o1})
	f.StartWorker(worker.Config{Concurrency: 4, Observer: o2})
	const n = 40
	ids := make([]string, n)
	for i := range ids {
		ids[i] = f.Submit("", &bus.RunRequest{Prompt: fmt.Sprint("run ", i), Model: fleettest.FauxModel(), Faux: fleettest.Texts(fmt.Sprint("answer ", i))})
	}
	workers := map[string]int{}
	for i, id := range ids {
		envs := f.Follow(id)
		fin := checkEnvelopes(t, id, envs)
		if fin.Status != bus.StatusSucceeded {
			t.Fatalf("%s: %+v", id, fin)
		}
		starts := 0
		for _, e := range envs {
			if e.Type == bus.EventRunStarted {
				starts++
			}
		}
		if starts != 1 {
			t.Fatalf("%s started %d times", id, starts)
		}
		if got := transcriptOf(t, envs).FinalText(); got != fmt.Sprint("answer ", i) {
			t.Fatalf("%s: %q", id, got)
		}
		workers[envs[0].Worker]++
	}
	o1.mu.Lock()
	o2.mu.Lock()
	total := o1.started + o2.started
	o2.mu.Unlock()
	o1.mu.Unlock()
	if total != n {
		t.Fatalf("%d runs started for %d requests", total, n)
	}
	t.Logf("runs per worker: %v", workers)
}

// No request is fetched without a slot for it: with one pull loop (2
// slots) and with three competing for the slots (24).
func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		slots, runs int
		queues      []string
	}{
		{2, 5, []string{"default"}},
		{24, 40, []string{"default"}},          // three pull loops
		{48, 70, []string{"default", "batch"}}, // three loops per queue, one set of slots
	} {
		t.Run(fmt.Sprint(c.slots, "slots", len(c.queues), "queues"), func(t *testing.T) {
			testConcurrencyBound(t, c.slots, c.runs, c.queues)
		})
	}
}

func testConcurrencyBound(t *testing.T, slots, runs int, queues []string) {
	f := newFleet(t)
	g := newGate()
	f.StartWorker(worker.Config{Concurrency: slots, Queues: queues, Tools: []*agent.Tool{g.tool()}})
	var ids []string
	for i := range runs {
		ids = append(ids, f.Submit(queues[i%len(queues)], &bus.RunRequest{Prompt: "go", Tools: []string{"gate"}, Model: fleettest.FauxModel(),
			Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.ToolCall("c", "gate", map[string]any{"name": fmt.Sprint(i)}), fleettest.Text("ok")}}}))
	}
	for range slots {
		g.waitStarted(t)
	}
	var cons []jetstream.Consumer
	for _, q := range queues {
		c, err := f.Client.JetStream().Consumer(fleettest.Context(t), f.Client.Names().RunsStream(), "workers-"+q)
		if err != nil {
			t.Fatal(err)
		}
		cons = append(cons, c)
	}
	// The server counts pending messages as its stream signals the
	// consumer, after the publish acks: under load the count comes late.
	for deadline := time.Now().Add(20 * time.Second); ; {
		ackPending, pending := 0, uint64(0)
		for _, c := range cons {
			info, err := c.Info(fleettest.Context(t))
			if err != nil {
				t.Fatal(err)
			}
			ackPending += info.NumAckPending
			pending += info.NumPending
		}
		if ackPending > slots {
			t.Fatalf("ack pending %d, concurrency is %d", ackPending, slots)
		}
		if ackPending == slots && pending == uint64(runs-slots) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ack pending %d, pending %d; want %d and %d", ackPending, pending, slots, runs-slots)
		}
		time.Sleep(10 * time.Millisecond) // polls the server's count itself
	}
	if n := len(g.started); n > 0 {
		t.Fatalf("%d more runs started than the %d slots", n, slots)
	}
	// Let them all through.
	for range runs {
		g.release <- struct{}{}
	}
	for _, id := range ids {
		if fin := checkEnvelopes(t, id, f.Follow(id)); fin.Status != bus.StatusSucceeded {
			t.Fatalf("%s: %+v", id, fin)
		}
	}
}

func TestLateFollowerSeesTheSame(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	id := f.Submit("", &bus.RunRequest{Prompt: "compute", Tools: []string{"calculator"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.ToolCall("c1", "calculator", map[string]any{"expression": "1+1"}), fleettest.Text("two")}}})
	live := f.Follow(id)
	late := f.Follow(id)
	if len(live) != len(late) {
		t.Fatalf("live %d envelopes, late %d", len(live), len(late))
	}
	for i := range live {
		a, _ := json.Marshal(live[i])
		b, _ := json.Marshal(late[i])
		if string(a) != string(b) {
			t.Fatalf("envelope %d differs:\n%s\n%s", i, a, b)
		}
	}
}

func TestLimits(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newGate()
	f.StartWorker(worker.Config{Tools: []*agent.Tool{g.tool()}})
	loop := []agent.ScriptedResponse{
		fleettest.ToolCall("a", "calculator", map[string]any{"expression": "1"}),
		fleettest.ToolCall("b", "calculator", map[string]any{"expression": "2"}),
		fleettest.ToolCall("c", "calculator", map[string]any{"expression": "3"}),
	}
	turns := f.Submit("", &bus.RunRequest{Prompt: "loop", Tools: []string{"calculator"}, Model: fleettest.FauxModel(),
		Limits: &bus.Limits{MaxTurns: 2}, Faux: &bus.FauxScript{Responses: loop}})
	fin := checkEnvelopes(t, turns, f.Follow(turns))
	if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonMaxTurns || fin.Turns != 2 {
		t.Fatalf("max turns: %+v", fin)
	}
	// Reaching maxTurns with a final answer is a success.
	ok := f.Submit("", &bus.RunRequest{Prompt: "loop", Tools: []string{"calculator"}, Model: fleettest.FauxModel(),
		Limits: &bus.Limits{MaxTurns: 2}, Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{loop[0], fleettest.Text("done")}}})
	if fin := checkEnvelopes(t, ok, f.Follow(ok)); fin.Status != bus.StatusSucceeded {
		t.Fatalf("max turns with an answer: %+v", fin)
	}
	budget := f.Submit("", &bus.RunRequest{Prompt: "loop", Tools: []string{"calculator"}, Model: fleettest.FauxModel(),
		Limits: &bus.Limits{MaxTotalTokens: 1}, Faux: &bus.FauxScript{Responses: loop}})
	if fin := checkEnvelopes(t, budget, f.Follow(budget)); fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonTokenBudget {
		t.Fatalf("token budget: %+v", fin)
	}
	timeout := f.Submit("", &bus.RunRequest{Prompt: "wait", Tools: []string{"gate"}, Model: fleettest.FauxModel(),
		Limits: &bus.Limits{TimeoutSeconds: 1}, Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.ToolCall("g", "gate", map[string]any{"name": "t"}), fleettest.Text("late")}}})
	if fin := checkEnvelopes(t, timeout, f.Follow(timeout)); fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonTimeout {
		t.Fatalf("timeout: %+v", fin)
	}
	modelErr := f.Submit("", &bus.RunRequest{Prompt: "fail", Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{{StopReason: agent.StopReasonError, ErrorMessage: "upstream 500"}}}})
	if fin := checkEnvelopes(t, modelErr, f.Follow(modelErr)); fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonModelError || fin.Error != "upstream 500" {
		t.Fatalf("model error: %+v", fin)
	}
}

func TestDemoModelAndContinueFrom(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	first := f.Submit("", &bus.RunRequest{Prompt: "hello demo"})
	envs := f.Follow(first)
	checkEnvelopes(t, first, envs)
	if n := fleettest.Decode(t, envs[0]).RunStarted.Notice; !strings.Contains(n, "DEMO") {
		t.Fatalf("run_started notice %q", n)
	}
	if got := transcriptOf(t, envs).FinalText(); !strings.Contains(got, "You said: hello demo") {
		t.Fatalf("demo reply %q", got)
	}
	second := f.Submit("", &bus.RunRequest{Prompt: "and again", ContinueFrom: first, Model: fleettest.FauxModel(), Faux: fleettest.Texts("second answer")})
	tr := transcriptOf(t, f.Follow(second))
	if got := roles(tr.Messages); got != "user:and again | assistant:second answer" || tr.Restored == nil || tr.Restored.From != first {
		t.Fatalf("continued transcript %s, restored %+v", got, tr.Restored)
	}
	if got, _ := snapshotRoles(t, f, second); !strings.HasPrefix(got, "user:hello demo | assistant:Hello from") || !strings.HasSuffix(got, "user:and again | assistant:second answer") {
		t.Fatalf("continued transcript's snapshot %s", got)
	}
}
