package protocol_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/llm/faux"
	"github.com/agentfleet/agentfleet/protocol"
	"github.com/agentfleet/agentfleet/ratelimit"
	"github.com/agentfleet/agentfleet/worker"
)

var updateCorpus = flag.Bool("update-corpus", false, "write the runs of TestFleetRunsValidate to testdata/corpus")

const corpusDir = "testdata/corpus"

// fleetRun is one run of TestFleetRunsValidate: what its client sent and
// what the fleet stored, as stored.
type fleetRun struct {
	kind      string
	request   []byte   // as Submit stored it
	envelopes [][]byte // AGENTS_EVENTS, in order
	record    []byte   // the final record
	waiting   []byte   // the record while the run waited, if it did
	controls  []controlBody
}

// controlBody is a control message's kind and body, as stored in
// AGENTS_CONTROL (and a line of a corpus .controls.ndjson file).
type controlBody struct {
	Kind string          `json:"kind"`
	Body json.RawMessage `json:"body"`
}

// Real runs of every kind on an in-process fleet (faux models, the
// built-in tools and two test tools): every request, envelope, record,
// control body and presence entry they store validates against the
// schemas, strictly (no field the schema does not name). Together the
// runs publish every event type and every step of the assistant stream
// the schema defines; a type added to the schema without a run that
// makes it fails here. With -update-corpus the runs are written to
// testdata/corpus (TestCorpus validates the files).
func TestFleetRunsValidate(t *testing.T) {
	v, err := protocol.NewValidator(protocol.Strict())
	if err != nil {
		t.Fatal(err)
	}
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default", "resume", "parked"}}})
	h := newHarness()
	priced := &pricedProvider{FauxProvider: worker.FauxProvider{M: faux.New(faux.Options{})}}
	f.StartWorker(worker.Config{
		WorkerID: "worker-1", Queues: []string{"default"}, Version: "test", Tools: h.tools(), Observer: h,
		Providers: map[string]worker.Provider{"priced": priced},
		// A 400-token window: the compaction run compacts after one turn.
		ModelWindows: map[string]worker.ModelWindow{"faux/small": {ContextWindow: 400}},
		// One call per 2 s window: the model-wait run's second call comes
		// well within the window of its first, however loaded the machine.
		RateLimits: &worker.RateLimits{Window: 2 * time.Second, Liveness: 5 * time.Second, Models: map[string]worker.ModelLimit{
			"priced/m": {Group: "priced", Limits: ratelimit.Limits{RPM: 1}, MaxTokens: 50}}},
	})
	var runs []*fleetRun
	submit := func(kind, queue string, req *bus.RunRequest) *fleetRun {
		t.Helper()
		req.ID = kind
		f.Submit(queue, req)
		b, err := agent.MarshalJSON(req) // as Submit stored it
		if err != nil {
			t.Fatal(err)
		}
		r := &fleetRun{kind: kind, request: b}
		runs = append(runs, r)
		return r
	}
	finish := func(r *fleetRun, status, reason string) {
		t.Helper()
		fin := f.WaitFinished(r.kind)
		if fin.Status != status || fin.Reason != reason {
			t.Fatalf("%s: finished %s/%s (%s), want %s/%s", r.kind, fin.Status, fin.Reason, fin.Error, status, reason)
		}
	}
	text := func(s string) agent.ScriptedResponse { return fleettest.Text(s) }
	call := fleettest.ToolCall
	script := func(rs ...agent.ScriptedResponse) *bus.FauxScript { return &bus.FauxScript{Responses: rs} }

	// A text run: thinking and text, an image with the prompt, metadata.
	r := submit("text", "", &bus.RunRequest{Model: fleettest.FauxModel(), SystemPrompt: "You are terse.", Prompt: "What is in the picture?",
		Images: []agent.Content{agent.Image("iVBORw0KGgo=", "image/png")}, ThinkingLevel: agent.ThinkingLow, Metadata: map[string]string{"team": "docs"},
		Faux: script(agent.ScriptedResponse{Content: []agent.Content{{Type: agent.ContentThinking, Thinking: "A tiny PNG."}, agent.Text("One pixel.")}})})
	finish(r, bus.StatusSucceeded, "")

	// Tools: a parallel batch (one call without arguments), a failing
	// call, a call with progress updates.
	r = submit("tools", "", &bus.RunRequest{Model: fleettest.FauxModel(), Prompt: "What is 6*7, and the time?", Tools: []string{"calculator", "current_time", "progress"},
		Faux: script(
			agent.ScriptedResponse{Content: []agent.Content{agent.ToolCall("c1", "calculator", map[string]any{"expression": "6*7"}), agent.ToolCall("c2", "current_time", nil)}, StopReason: agent.StopReasonToolUse},
			call("c3", "calculator", map[string]any{"expression": "1/"}),
			call("c4", "progress", nil),
			text("42, at noon."))})
	finish(r, bus.StatusSucceeded, "")

	// Compaction (1.10): a turn past the window's threshold; the summary
	// call takes the script's second reply.
	long := agent.ScriptedResponse{Content: []agent.Content{agent.Text(strings.Repeat("word ", 180)), agent.ToolCall("c1", "calculator", map[string]any{"expression": "1+1"})},
		StopReason: agent.StopReasonToolUse}
	r = submit("compaction", "", &bus.RunRequest{Model: &bus.ModelRef{Provider: "faux", ID: "small"}, Prompt: strings.Repeat("read ", 120), Tools: []string{"calculator"},
		Compaction: &bus.Compaction{Instructions: "keep numbers"}, Faux: script(long, text("## Goal\nadd"), text("2"))})
	finish(r, bus.StatusSucceeded, "")
	// A compact control message, stored after the run finished (ignored).
	if _, err := f.Client.JetStream().Publish(fleettest.Context(t), f.Client.Names().Control(r.kind, bus.KindCompact), []byte(`{"text":"keep numbers"}`)); err != nil {
		t.Fatal(err)
	}

	// Approvals: an invalid edit (rejected), then an approval with an
	// edit; a denial; a timeout that aborts.
	gated := func(kind string, a *bus.Approval, rs ...agent.ScriptedResponse) *fleetRun {
		return submit(kind, "", &bus.RunRequest{Model: fleettest.FauxModel(), Prompt: "add", Tools: []string{"calculator"}, Approval: a,
			Faux: script(append([]agent.ScriptedResponse{call("c1", "calculator", map[string]any{"expression": "2+2"})}, rs...)...)})
	}
	r = gated("approval-approved", &bus.Approval{Tools: []string{"calculator"}}, text("It is 6."))
	waitEvent(t, f, r.kind, bus.EventToolApprovalRequested)
	r.waiting = waitingRecord(t, f, r.kind)
	answer(t, f, r.kind, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove, Arguments: map[string]any{"bogus": 1}})
	answer(t, f, r.kind, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove, By: "alice", Reason: "checked", Arguments: map[string]any{"expression": "3+3"}})
	finish(r, bus.StatusSucceeded, "")

	r = gated("approval-denied", &bus.Approval{Tools: []string{"calculator"}, OnTimeout: bus.OnTimeoutDeny}, text("Not run."))
	waitEvent(t, f, r.kind, bus.EventToolApprovalRequested)
	answer(t, f, r.kind, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionDeny, By: "bob", Reason: "not during the freeze"})
	finish(r, bus.StatusSucceeded, "")

	r = gated("approval-timeout", &bus.Approval{Tools: []string{"calculator"}, TimeoutSeconds: 1, OnTimeout: bus.OnTimeoutAbort})
	finish(r, bus.StatusAborted, bus.ReasonApprovalTimeout)

	// A run that parks while it waits (1.9), then its answer wakes it.
	f.StartWorker(worker.Config{WorkerID: "worker-4", Queues: []string{"parked"}, Tools: h.tools(), ParkAfter: 100 * time.Millisecond})
	r = submit("approval-parked", "parked", &bus.RunRequest{Model: fleettest.FauxModel(), Prompt: "add", Tools: []string{"calculator"},
		Approval: &bus.Approval{Tools: []string{"calculator"}}, Faux: script(call("c1", "calculator", map[string]any{"expression": "2+2"}), text("It is 4."))})
	waitEvent(t, f, r.kind, bus.EventRunParked)
	r.waiting = parkedRecord(t, f, r.kind)
	answer(t, f, r.kind, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove, By: "alice"})
	finish(r, bus.StatusSucceeded, "")

	// Steering (text) and a follow-up (a message) while a tool runs.
	r = submit("steer-followup", "", &bus.RunRequest{Model: fleettest.FauxModel(), Prompt: "go", Tools: []string{"gate"},
		Faux: script(call("c1", "gate", map[string]any{"name": "x"}), text("In metres."), text("In feet: 3.3."))})
	h.waitStarted(t)
	if _, err := f.Client.Steer(fleettest.Context(t), r.kind, "Use metric units."); err != nil {
		t.Fatal(err)
	}
	followUp := agent.Message{Role: agent.RoleUser, Content: []agent.Content{agent.Text("And in feet?")}}
	if _, err := f.Client.SendControl(fleettest.Context(t), r.kind, bus.KindFollowUp, bus.Control{Message: &followUp}); err != nil {
		t.Fatal(err)
	}
	h.waitControl(t, bus.KindSteer)
	h.waitControl(t, bus.KindFollowUp)
	// A malformed steer (a misspelt field) is refused on the run (1.8).
	if _, err := f.Client.JetStream().Publish(fleettest.Context(t), f.Client.Names().Control(r.kind, bus.KindSteer), []byte(malformedSteer)); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, f, r.kind, bus.EventControlRejected)
	h.release <- struct{}{}
	finish(r, bus.StatusSucceeded, "")

	r = submit("abort", "", &bus.RunRequest{Model: fleettest.FauxModel(), Prompt: "go", Tools: []string{"gate"},
		Faux: script(call("c1", "gate", map[string]any{"name": "x"}), text("never"))})
	h.waitStarted(t)
	if _, err := f.Client.Abort(fleettest.Context(t), r.kind, "wrong question"); err != nil {
		t.Fatal(err)
	}
	finish(r, bus.StatusAborted, bus.ReasonAbortedByUser)

	// Failures.
	r = submit("bad-request", "", &bus.RunRequest{Model: fleettest.FauxModel(), Prompt: "hi", Tools: []string{"no_such_tool"}, Faux: script(text("never"))})
	finish(r, bus.StatusFailed, bus.ReasonBadRequest)
	r = submit("model-error", "", &bus.RunRequest{Model: fleettest.FauxModel(), Prompt: "hi",
		Faux: script(agent.ScriptedResponse{Content: []agent.Content{agent.Text("Half an ans")}, StopReason: agent.StopReasonError, ErrorMessage: "upstream returned 500"})})
	finish(r, bus.StatusFailed, bus.ReasonModelError)
	r = submit("max-turns", "", &bus.RunRequest{Model: fleettest.FauxModel(), Prompt: "add", Tools: []string{"calculator"}, Limits: &bus.Limits{MaxTurns: 1},
		Faux: script(call("c1", "calculator", map[string]any{"expression": "2+2"}), text("never"))})
	finish(r, bus.StatusFailed, bus.ReasonMaxTurns)

	// A priced model: two calls at one a window (the second waits for
	// the shared limit), then a cost bound that refuses the first call.
	priced.M.Push(call("c1", "calculator", map[string]any{"expression": "2+2"}), text("4"))
	r = submit("model-wait", "", &bus.RunRequest{Model: &bus.ModelRef{Provider: "priced", ID: "m"}, Prompt: "add", Tools: []string{"calculator"}})
	finish(r, bus.StatusSucceeded, "")
	r = submit("budget-exceeded", "", &bus.RunRequest{Model: &bus.ModelRef{Provider: "priced", ID: "m"}, Prompt: "hi", Limits: &bus.Limits{MaxCostUsd: 0.0001}})
	finish(r, bus.StatusFailed, bus.ReasonBudgetExceeded)

	// The demo model (no model named), and a run that continues another.
	r = submit("demo", "", &bus.RunRequest{Prompt: "hello"})
	finish(r, bus.StatusSucceeded, "")
	r = submit("continue-from", "", &bus.RunRequest{Model: fleettest.FauxModel(), Prompt: "and then?", ContinueFrom: "text", Faux: script(text("Still one pixel."))})
	finish(r, bus.StatusSucceeded, "")

	// A worker stopped while a tool runs hands the run back (the call's
	// end is interrupted); the next worker resumes it.
	stopping := f.StartWorker(worker.Config{WorkerID: "worker-2", Queues: []string{"resume"}, Tools: h.tools(), DrainTimeout: 100 * time.Millisecond})
	r = submit("resumed", "resume", &bus.RunRequest{Model: fleettest.FauxModel(), Prompt: "go", Tools: []string{"gate"},
		Faux: script(call("c1", "gate", map[string]any{"name": "x"}), text("Done after all."))})
	h.waitStarted(t)
	stopping.Stop()
	f.StartWorker(worker.Config{WorkerID: "worker-3", Queues: []string{"resume"}, Tools: h.tools()})
	finish(r, bus.StatusSucceeded, "")

	// What was stored: events, records, control bodies.
	for _, r := range runs {
		r.envelopes = storedEnvelopes(t, f, r.kind)
		r.record = storedRecord(t, f, r.kind)
	}
	byKind := map[string]*fleetRun{}
	for _, r := range runs {
		byKind[r.kind] = r
	}
	for _, c := range storedControls(t, f) {
		if string(c.body.Body) == malformedSteer {
			continue // invalid on purpose: testdata/invalid has such bodies
		}
		r := byKind[c.run]
		if r == nil {
			t.Fatalf("a control message for run %s, which the test did not submit", c.run)
		}
		r.controls = append(r.controls, c.body)
	}
	presence := storedPresence(t, f, "worker-1")

	seen := validateRuns(t, v, runs)
	n := 0
	for _, r := range runs {
		n += len(r.envelopes) + len(r.controls) + 2
	}
	t.Logf("validated %d documents of %d runs and a presence entry", n, len(runs))
	if err := v.Validate(protocol.Presence, presence); err != nil {
		t.Errorf("presence: %v\n%s", err, presence)
	}
	checkCoverage(t, seen)
	for _, want := range []string{"approval-approved", "steer-followup", "abort"} {
		if len(byKind[want].controls) == 0 {
			t.Errorf("%s: no control message stored", want)
		}
	}
	if *updateCorpus {
		writeCorpus(t, runs, presence)
	}
}

// seen is what a set of runs covered.
type seen struct {
	events, steps, roles, blocks, decisions, states map[string]bool
}

// validateRuns validates every document of the runs and returns what
// they covered.
func validateRuns(t *testing.T, v *protocol.Validator, runs []*fleetRun) *seen {
	t.Helper()
	s := &seen{events: map[string]bool{}, steps: map[string]bool{}, roles: map[string]bool{}, blocks: map[string]bool{},
		decisions: map[string]bool{}, states: map[string]bool{}}
	check := func(kind, what string, d protocol.Doc, b []byte) {
		t.Helper()
		if err := v.Validate(d, b); err != nil {
			t.Errorf("%s: %s: %v\n%s", kind, what, err, b)
		}
	}
	for _, r := range runs {
		check(r.kind, "request", protocol.RunRequest, r.request)
		if len(r.envelopes) == 0 {
			t.Errorf("%s: no events", r.kind)
		}
		for i, e := range r.envelopes {
			check(r.kind, fmt.Sprintf("envelope %d", i+1), protocol.Envelope, e)
			s.add(t, e)
		}
		check(r.kind, "record", protocol.Record, r.record)
		s.addState(t, r.record)
		if r.waiting != nil {
			check(r.kind, "waiting record", protocol.Record, r.waiting)
			s.addState(t, r.waiting)
		}
		for i, c := range r.controls {
			check(r.kind, fmt.Sprintf("control %d (%s)", i+1, c.Kind), protocol.Doc(c.Kind), c.Body)
		}
	}
	return s
}

// add notes what an envelope shows.
func (s *seen) add(t *testing.T, raw []byte) {
	t.Helper()
	env, err := bus.DecodeEnvelope(raw)
	if err != nil {
		t.Errorf("%v: %s", err, raw)
		return
	}
	s.events[env.Type] = true
	ev, err := env.Decode()
	if err != nil {
		t.Errorf("%v: %s", err, raw)
		return
	}
	switch {
	case ev.Agent != nil && ev.Agent.AssistantMessageEvent != nil:
		s.steps[string(ev.Agent.AssistantMessageEvent.Type)] = true
	case ev.Agent != nil && ev.Agent.Message != nil:
		s.roles[ev.Agent.Message.Role] = true
		for _, c := range ev.Agent.Message.Content {
			s.blocks[c.Type] = true
		}
	case ev.Approval != nil && ev.Approval.Decision != "":
		s.decisions[ev.Approval.Decision] = true
	}
}

func (s *seen) addState(t *testing.T, raw []byte) {
	t.Helper()
	var r bus.RunRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Errorf("%v: %s", err, raw)
		return
	}
	s.states[r.State] = true
}

// checkCoverage fails when the runs left out an event type or a step of
// the assistant stream that the schema defines, or one of the values
// below.
func checkCoverage(t *testing.T, s *seen) {
	t.Helper()
	missing := func(what string, want []string, have map[string]bool) {
		t.Helper()
		for _, w := range want {
			if !have[w] {
				t.Errorf("no %s %q: the runs must make every one the schema defines", what, w)
			}
		}
	}
	missing("event of type", slices.Sorted(mapKeys(variants(t, protocol.EventFile, "Event"))), s.events)
	missing("message_update step", slices.Sorted(mapKeys(variants(t, protocol.EventFile, "AssistantMessageEvent"))), s.steps)
	missing("message role", []string{agent.RoleUser, agent.RoleAssistant, agent.RoleToolResult}, s.roles)
	missing("content block", []string{agent.ContentText, agent.ContentThinking, agent.ContentImage, agent.ContentToolCall}, s.blocks)
	missing("approval decision", []string{bus.DecisionApprove, bus.DecisionDeny, bus.DecisionTimeout}, s.decisions)
	missing("record state", []string{bus.StateRunning, bus.StatusSucceeded, bus.StatusFailed, bus.StatusAborted}, s.states)
}

func mapKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// harness has the test tools and waits on what the worker reports.
type harness struct {
	worker.NopObserver
	started  chan string
	release  chan struct{}
	controls chan string
}

func newHarness() *harness {
	return &harness{started: make(chan string, 16), release: make(chan struct{}, 16), controls: make(chan string, 64)}
}

// ControlReceived never blocks the worker (the buffer outlasts the test's
// control messages).
func (h *harness) ControlReceived(kind string) {
	select {
	case h.controls <- kind:
	default:
	}
}

type gateArgs struct {
	Name string `json:"name"`
}

// tools: gate waits until the test releases it (or its run stops);
// progress reports two partial results.
func (h *harness) tools() []*agent.Tool {
	gate := agent.NewTool("gate", "waits until the test opens it", func(ctx context.Context, a gateArgs, _ agent.UpdateFunc) (agent.ToolResult, error) {
		h.started <- a.Name
		select {
		case <-h.release:
			return agent.TextResult("opened " + a.Name), nil
		case <-ctx.Done():
			return agent.ToolResult{}, ctx.Err()
		}
	})
	progress := agent.NewTool("progress", "reports progress", func(ctx context.Context, _ struct{}, update agent.UpdateFunc) (agent.ToolResult, error) {
		update(agent.ToolResult{Content: []agent.Content{agent.Text("progress 1/2")}, Details: map[string]any{"progress": 1, "total": 2}})
		update(agent.ToolResult{Content: []agent.Content{agent.Text("progress 2/2")}, Details: map[string]any{"progress": 2, "total": 2}})
		return agent.ToolResult{Content: []agent.Content{agent.Text("done")}, Details: map[string]any{"steps": 2}}, nil
	})
	return []*agent.Tool{gate, progress}
}

func (h *harness) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-h.started:
	case <-time.After(15 * time.Second):
		t.Fatal("the gate tool never started")
	}
}

func (h *harness) waitControl(t *testing.T, kind string) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		select {
		case k := <-h.controls:
			if k == kind {
				return
			}
		case <-deadline:
			t.Fatalf("no %s reached the agent", kind)
		}
	}
}

// pricedProvider is a faux model with prices, so that cost bounds and
// shared rate limits apply to it.
type pricedProvider struct{ worker.FauxProvider }

func (p *pricedProvider) Model(id string) agent.Model {
	m := p.FauxProvider.Model(id)
	m.Cost = agent.ModelCost{Input: 1000, Output: 1000}
	return m
}

// waitEvent follows a run until an event of a type.
func waitEvent(t *testing.T, f *fleettest.Fleet, id, typ string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for env, err := range f.Client.Follow(ctx, id) {
		if err != nil {
			t.Fatalf("%s: waiting for %s: %v", id, typ, err)
		}
		if env.Type == typ {
			return
		}
	}
	t.Fatalf("%s: finished without %s", id, typ)
}

// waitingRecord returns the record of a run once it says it waits.
func waitingRecord(t *testing.T, f *fleettest.Fleet, id string) []byte {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b := storedRecord(t, f, id)
		var r bus.RunRecord
		if err := json.Unmarshal(b, &r); err == nil && r.Waiting != nil {
			return b
		}
	}
	t.Fatalf("%s: the record never said the run waits", id)
	return nil
}

// parkedRecord returns the record of a run once it says it is parked.
func parkedRecord(t *testing.T, f *fleettest.Fleet, id string) []byte {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b := storedRecord(t, f, id)
		var r bus.RunRecord
		if err := json.Unmarshal(b, &r); err == nil && r.Parked != nil {
			return b
		}
	}
	t.Fatalf("%s: the record never said the run is parked", id)
	return nil
}

func answer(t *testing.T, f *fleettest.Fleet, id string, a bus.ApprovalAnswer) {
	t.Helper()
	if _, err := f.Client.Answer(fleettest.Context(t), id, a); err != nil {
		t.Fatal(err)
	}
}

// storedEnvelopes reads a run's events as stored, up to its first
// run_finished.
func storedEnvelopes(t *testing.T, f *fleettest.Fleet, id string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, m := range storedMsgs(t, f, f.Client.Names().EventsStream(), f.Client.Names().Events(id)) {
		out = append(out, m.Data)
		if env, err := bus.DecodeEnvelope(m.Data); err == nil && env.Type == bus.EventRunFinished {
			break
		}
	}
	return out
}

// storedMsgs reads the messages of a subject from a stream, in order.
func storedMsgs(t *testing.T, f *fleettest.Fleet, stream, subject string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := fleettest.Context(t)
	s, err := f.Client.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := uint64(1); ; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
		seq = m.Sequence + 1
	}
}

func storedRecord(t *testing.T, f *fleettest.Fleet, id string) []byte {
	t.Helper()
	kv, err := f.Client.Records(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(fleettest.Context(t), id)
	if err != nil {
		t.Fatalf("record %s: %v", id, err)
	}
	return e.Value()
}

func storedPresence(t *testing.T, f *fleettest.Fleet, worker string) []byte {
	t.Helper()
	kv, err := f.Client.Workers(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(fleettest.Context(t), worker)
	if err != nil {
		t.Fatalf("presence of %s: %v", worker, err)
	}
	return e.Value()
}

type storedControl struct {
	run  string
	body controlBody
}

// malformedSteer is the steer the steer-followup run gets refused.
const malformedSteer = `{"txt":"typo"}`

// storedControls reads every control message of AGENTS_CONTROL.
func storedControls(t *testing.T, f *fleettest.Fleet) []storedControl {
	t.Helper()
	n := f.Client.Names()
	var out []storedControl
	for _, m := range storedMsgs(t, f, n.ControlStream(), n.Prefix()+".run.>") {
		rest := strings.TrimPrefix(m.Subject, n.Prefix()+".run.")
		run, kind, ok := strings.Cut(rest, ".")
		if !ok {
			t.Fatalf("control subject %s", m.Subject)
		}
		out = append(out, storedControl{run, controlBody{Kind: kind, Body: m.Data}})
	}
	return out
}

// writeCorpus writes the runs as testdata/corpus: per run
// <kind>.request.json, <kind>.events.ndjson (the envelopes as `submit
// follow --json` prints them), <kind>.record.json (the final record),
// <kind>.waiting-record.json and <kind>.controls.ndjson when there are
// any; and presence.json.
func writeCorpus(t *testing.T, runs []*fleetRun, presence []byte) {
	t.Helper()
	old, _ := filepath.Glob(filepath.Join(corpusDir, "*.json*"))
	for _, name := range old {
		if filepath.Base(name) == "schedule.json" {
			continue // no run writes it: TestScheduleStoredValidates checks one stored
		}
		if err := os.Remove(name); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(corpusDir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(corpusDir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	line := func(b []byte) []byte { return append(bytes.TrimSpace(b), '\n') }
	for _, r := range runs {
		write(r.kind+".request.json", line(r.request))
		var events bytes.Buffer
		enc := json.NewEncoder(&events) // as cmd/submit's follow --json
		for _, raw := range r.envelopes {
			env, err := bus.DecodeEnvelope(raw)
			if err != nil {
				t.Fatal(err)
			}
			if err := enc.Encode(env); err != nil {
				t.Fatal(err)
			}
		}
		write(r.kind+".events.ndjson", events.Bytes())
		write(r.kind+".record.json", line(r.record))
		if r.waiting != nil {
			write(r.kind+".waiting-record.json", line(r.waiting))
		}
		if len(r.controls) > 0 {
			var controls bytes.Buffer
			for _, c := range r.controls {
				b, err := json.Marshal(c)
				if err != nil {
					t.Fatal(err)
				}
				controls.Write(line(b))
			}
			write(r.kind+".controls.ndjson", controls.Bytes())
		}
	}
	write("presence.json", line(presence))
	t.Logf("wrote %d runs to %s", len(runs), corpusDir)
}
