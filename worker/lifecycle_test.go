package worker_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/workerproto"
	"github.com/agentfleet/agentfleet/worker"
)

// A run much longer than AckWait finishes on its first attempt: the finish
// has its own deadline, counted from when the finish starts.
func TestLongRunFinishesOnFirstAttempt(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	ackWait := 2 * time.Second
	o := newObs()
	f.StartWorker(worker.Config{AckWait: ackWait, Observer: o})
	secs := (2*ackWait + time.Second).Seconds()
	id := f.Submit("", &bus.RunRequest{Prompt: "wait", Tools: []string{"sleep"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			fleettest.ToolCall("s1", "sleep", map[string]any{"seconds": secs}),
			fleettest.Text("done"),
		}}})
	envs := f.Follow(id)
	started, resumed := 0, 0
	for _, e := range envs {
		switch e.Type {
		case bus.EventRunStarted:
			started++
		case bus.EventRunResumed:
			resumed++
		}
	}
	tr := transcriptOf(t, envs)
	if started != 1 || resumed != 0 || tr.Attempt != 1 || tr.Finished == nil || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("run_started %d, run_resumed %d, attempt %d, finished %+v\n%s", started, resumed, tr.Attempt, tr.Finished, fleettest.Dump(envs))
	}
	rec, err := f.Client.Status(fleettest.Context(t), id)
	if err != nil || rec.State != bus.StatusSucceeded || rec.Attempt != 1 {
		t.Fatalf("record %+v %v", rec, err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.started != 1 {
		t.Fatalf("%d attempts started, want 1", o.started)
	}
}

// The user messages of a steer carry the control's stream sequence on
// their message_start and message_end; the prompt's carry none.
func TestControlSeqStamping(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newGate()
	o := newObs()
	f.StartWorker(worker.Config{Tools: []*agent.Tool{g.tool()}, Observer: o})
	id := f.Submit("", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.ToolCall("c1", "gate", map[string]any{"name": "x"}), fleettest.Text("done")}}})
	g.waitStarted(t)
	seq, err := f.Client.Steer(fleettest.Context(t), id, "steer")
	if err != nil {
		t.Fatal(err)
	}
	o.waitControl(t, bus.KindSteer)
	g.release <- struct{}{}
	envs := f.Follow(id)
	stamped := map[string][]uint64{}
	for _, e := range envs {
		if e.Type != string(agent.EventMessageStart) && e.Type != string(agent.EventMessageEnd) {
			continue
		}
		m := fleettest.Decode(t, e).Agent.Message
		if m.Role == agent.RoleUser {
			stamped[m.TextOf()] = append(stamped[m.TextOf()], e.ControlSeq)
		}
	}
	if got, want := fmt.Sprint(stamped), fmt.Sprintf("map[go:[0 0] steer:[%d %d]]", seq, seq); got != want {
		t.Fatalf("control seqs of user messages %s, want %s\n%s", got, want, fleettest.Dump(envs))
	}
}

// A bad request's error lists every problem: the decoder's and the
// worker's.
func TestBadRequestListsEveryProblem(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	res, err := f.Client.SubmitRaw(fleettest.Context(t), "", "bad-everywhere", []byte(`{"prompt":"x","tools":["rm_rf"],"temperature":9}`))
	if err != nil {
		t.Fatal(err)
	}
	tr := transcriptOf(t, f.Follow(res.ID))
	fin := tr.Finished
	if fin == nil || fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, "temperature 9") || !strings.Contains(fin.Error, `unknown tool "rm_rf"`) {
		t.Fatalf("run_finished %+v", fin)
	}
	// An unknown field is one problem among the others (since 1.8), not
	// "malformed JSON" hiding them.
	res, err = f.Client.SubmitRaw(fleettest.Context(t), "", "bad-unknown", []byte(`{"prompt":"x","tools":["rm_rf"],"temperature":9,"limits":{"maxTurn":2}}`))
	if err != nil {
		t.Fatal(err)
	}
	fin = transcriptOf(t, f.Follow(res.ID)).Finished
	if fin == nil || fin.Reason != bus.ReasonBadRequest || strings.Contains(fin.Error, "malformed") {
		t.Fatalf("run_finished %+v", fin)
	}
	for _, want := range []string{`unknown field "limits.maxTurn"`, "temperature 9", `unknown tool "rm_rf"`} {
		if !strings.Contains(fin.Error, want) {
			t.Errorf("no %q in %q", want, fin.Error)
		}
	}
	// An unknown field inside model does not hide the worker's own checks
	// either: they run on the decoder's lenient reading of the request.
	res, err = f.Client.SubmitRaw(fleettest.Context(t), "", "bad-model-field", []byte(`{"prompt":"x","tools":["rm_rf"],"model":{"provider":"faux","id":"demo","zz":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	fin = transcriptOf(t, f.Follow(res.ID)).Finished
	if fin == nil || fin.Reason != bus.ReasonBadRequest {
		t.Fatalf("run_finished %+v", fin)
	}
	for _, want := range []string{`unknown field "model.zz"`, `unknown tool "rm_rf"`} {
		if !strings.Contains(fin.Error, want) {
			t.Errorf("no %q in %q", want, fin.Error)
		}
	}
}

func TestRunRecordLifecycle(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newGate()
	id := f.Submit("", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"}, Model: fleettest.FauxModel(), Metadata: map[string]string{"team": "qa"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.ToolCall("c", "gate", map[string]any{"name": "x"}), fleettest.Text("ok")}}})
	rec, err := f.Client.Status(fleettest.Context(t), id)
	if err != nil || rec.State != bus.StateQueued {
		t.Fatalf("queued: %+v %v", rec, err)
	}
	f.StartWorker(worker.Config{Tools: []*agent.Tool{g.tool()}})
	g.waitStarted(t)
	rec, err = f.Client.Status(fleettest.Context(t), id)
	if err != nil || rec.State != bus.StateRunning || rec.Attempt != 1 || rec.Worker == "" || rec.StartedAt.IsZero() ||
		rec.SubmittedAt.IsZero() || rec.Model != "faux/scripted" || rec.Metadata["team"] != "qa" {
		t.Fatalf("running: %+v %v", rec, err)
	}
	list, err := f.Client.List(fleettest.Context(t), bus.ListOptions{State: bus.StateRunning})
	if err != nil || len(list) != 1 || list[0].ID != id {
		t.Fatalf("list running: %+v %v", list, err)
	}
	g.release <- struct{}{}
	envs := f.Follow(id)
	checkEnvelopes(t, id, envs)
	rec, err = f.Client.Status(fleettest.Context(t), id)
	if err != nil || rec.State != bus.StatusSucceeded || rec.Turns != 2 || rec.Usage.TotalTokens == 0 || rec.FinishedAt.IsZero() {
		t.Fatalf("finished: %+v %v", rec, err)
	}
	list, err = f.Client.List(fleettest.Context(t), bus.ListOptions{})
	if err != nil || len(list) != 1 || list[0].State != bus.StatusSucceeded {
		t.Fatalf("list: %+v %v", list, err)
	}
}

func TestDrainHandsRunsBack(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newGate()
	stop := f.StartWorker(worker.Config{Tools: []*agent.Tool{g.tool()}, DrainTimeout: 100 * time.Millisecond}).Stop
	id := f.Submit("", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.ToolCall("c", "gate", map[string]any{"name": "x"}), fleettest.Text("ok")}}})
	g.waitStarted(t)
	stop() // drain times out: the run is stopped and Nak'ed
	// The next worker resumes: the cancelled tool result (marked
	// interrupted) is replaced by an error result and the model goes on.
	f.StartWorker(worker.Config{Tools: []*agent.Tool{g.tool()}})
	envs := f.Follow(id)
	last := envs[len(envs)-1]
	if last.Attempt != 2 || fleettest.Decode(t, last).RunFinished.Status != bus.StatusSucceeded {
		t.Fatalf("after drain: %s", fleettest.Dump(envs))
	}
	tr := transcriptOf(t, envs)
	if tr.Attempt != 2 || tr.Resumed == nil || tr.Resumed.MessagesRestored != 2 ||
		roles(tr.Messages) != "user:go | assistant:call:gate | toolResult | assistant:ok" {
		t.Fatalf("transcript after restart: %s\n%s", roles(tr.Messages), fleettest.Dump(envs))
	}
	if res := tr.Messages[2]; !res.IsError || res.TextOf() != workerproto.InterruptedToolResult {
		t.Fatalf("tool result after resume: %+v", res)
	}
	interrupted := 0
	for _, e := range envs {
		if e.Interrupted {
			interrupted++
		}
	}
	if interrupted == 0 {
		t.Fatalf("%d interrupted envelopes:\n%s", interrupted, fleettest.Dump(envs))
	}
}

func TestHeartbeatKeepsALongRunOwned(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newGate()
	f.StartWorker(worker.Config{Tools: []*agent.Tool{g.tool()}, AckWait: time.Second, HeartbeatInterval: 200 * time.Millisecond})
	id := f.Submit("", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.ToolCall("c", "gate", map[string]any{"name": "x"}), fleettest.Text("ok")}}})
	g.waitStarted(t)
	// The run outlives its AckWait three times over.
	timer := time.AfterFunc(3*time.Second, func() { g.release <- struct{}{} })
	defer timer.Stop()
	envs := f.Follow(id)
	if fin := checkEnvelopes(t, id, envs); fin.Status != bus.StatusSucceeded {
		t.Fatalf("%+v", fin)
	}
	select {
	case n := <-g.started:
		t.Fatalf("the run was redelivered and started again (%s)", n)
	default:
	}
}
