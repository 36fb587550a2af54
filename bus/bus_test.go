package bus

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/internal/testpar"
)

func TestMain(m *testing.M) {
	testpar.Default(4) // the tests wait more than they compute
	goleak.VerifyTestMain(m)
}

func TestNames(t *testing.T) {
	t.Parallel()
	n := MustNames("")
	checks := map[string]string{
		n.RunsStream():           "AGENTS_RUNS",
		n.EventsStream():         "AGENTS_EVENTS",
		n.ControlStream():        "AGENTS_CONTROL",
		n.RecordsBucket():        "agents_runs",
		n.Consumer("default"):    "workers-default",
		n.Submit("default", "r"): "agents.submit.default.r",
		n.SubmitFilter("q"):      "agents.submit.q.*",
		n.QueueFilter("q"):       "agents.submit.q.>",
		n.Events("r"):            "agents.run.r.events",
		n.Control("r", "steer"):  "agents.run.r.steer",
		n.Republished():          "agents.ctl.*.*",
		n.Record("r"):            "$KV.agents_runs.r",
	}
	for got, want := range checks {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
	m := MustNames("acme.agents")
	if m.RunsStream() != "ACME_AGENTS_RUNS" || m.RecordsBucket() != "acme_agents_runs" || m.Events("x") != "acme.agents.run.x.events" {
		t.Errorf("dotted prefix: %s %s %s", m.RunsStream(), m.RecordsBucket(), m.Events("x"))
	}
	for _, bad := range []string{"a..b", "a.*", "a b", ">", "a.>"} {
		if _, err := NewNames(bad); err == nil {
			t.Errorf("prefix %q accepted", bad)
		}
	}
	q, r, err := n.ParseSubmit("agents.submit.default.run-1")
	if err != nil || q != "default" || r != "run-1" {
		t.Fatalf("ParseSubmit: %s %s %v", q, r, err)
	}
	for _, bad := range []string{"agents.submit.default", "agents.submit.default.a.b", "other.submit.q.r",
		"agents.submit.default." + strings.Repeat("x", 65), "agents.submit.q!.r",
		"agents.submit.default.>", "agents.submit.default.*", "agents.submit.*.r", "agents.submit.>.r"} {
		if _, _, err := n.ParseSubmit(bad); err == nil {
			t.Errorf("ParseSubmit(%q) accepted", bad)
		}
	}
}

func TestIDs(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "run_1-X", strings.Repeat("z", 64), NewRunID()} {
		if !ValidID(ok) {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"", "a.b", "a*", "a>", "a b", "ü", strings.Repeat("z", 65), "a\n"} {
		if ValidID(bad) || CheckID(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestDecodeRunRequest(t *testing.T) {
	t.Parallel()
	req, err := DecodeRunRequest([]byte(`{"id":"r1","model":"openai/meta-llama/Llama-3","prompt":"hi","tools":["calculator"],
		"limits":{"maxTurns":3},"metadata":{"k":"v"},"thinkingLevel":"high","temperature":0.5}`), "r1")
	if err != nil {
		t.Fatal(err)
	}
	if req.Model.Provider != "openai" || req.Model.ID != "meta-llama/Llama-3" || req.EffectiveLimits().MaxTurns != 3 ||
		req.EffectiveLimits().TimeoutSeconds != DefaultTimeoutSeconds {
		t.Fatalf("%+v", req)
	}
	req, err = DecodeRunRequest([]byte(`{"model":{"provider":"faux","id":"x"},"prompt":"hi","faux":{"responses":[{"content":[{"type":"text","text":"yo"}]}]}}`), "r2")
	if err != nil || req.ID != "r2" || len(req.Faux.Responses) != 1 || req.Faux.Responses[0].Content[0].Text != "yo" {
		t.Fatalf("%+v %v", req, err)
	}
	bad := map[string]string{
		``:                                   "empty request",
		`nope`:                               "malformed JSON",
		`{"prompt":1}`:                       `field "prompt"`,
		`{"prompt":"a"} {}`:                  "extra data",
		`{"prompt":"a","x":1}`:               `unknown field "x"`,
		`{}`:                                 `no "prompt"`,
		`{"id":"zz","prompt":"a"}`:           "differs from the subject",
		`{"id":"a.b","prompt":"a"}`:          "must match",
		`{"model":"gpt","prompt":"a"}`:       "provider/id",
		`{"model":{"id":"x"},"prompt":"a"}`:  "provider",
		`{"prompt":"a","thinkingLevel":"x"}`: "thinkingLevel",
		`{"prompt":"a","steeringMode":"x"}`:  "steeringMode",
		`{"prompt":"a","tools":["t","t"]}`:   "listed more than once",
		`{"prompt":"a","limits":{"timeoutSeconds":-1}}`:                       "timeoutSeconds",
		`{"prompt":"a","temperature":3}`:                                      "temperature",
		`{"prompt":"a","continueFrom":"r"}`:                                   "names the run itself",
		`{"messages":[{"role":"assistant","content":[]}]}`:                    "nothing to answer",
		`{"messages":[{"role":"wizard","content":"x"}],"prompt":"a"}`:         "role",
		`{"prompt":"a","model":"openai/x","faux":{"responses":[]}}`:           "only for the faux provider",
		`{"prompt":"a","images":[{"type":"text","text":"x"}]}`:                "images[0]",
		`{"prompt":"` + strings.Repeat("x", MaxPromptBytes+1) + `"}`:          "prompt is",
		`{"prompt":"a","metadata":{"k":"` + strings.Repeat("v", 2000) + `"}}`: "value is",
	}
	for body, want := range bad {
		_, err := DecodeRunRequest([]byte(body), "r")
		if err == nil || !IsBadRequest(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%.60s: got %v, want %q", body, err, want)
		}
	}
	if _, err := DecodeRunRequest(make([]byte, MaxRequestBytes+1), "r"); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("oversized: %v", err)
	}
}

// A body that is JSON but not an object, or a model that is neither a
// string nor an object, is told so in the request's terms, not in the
// decoder's Go types.
func TestDecodeRunRequestNotAnObject(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`[1]`:                            "the request must be a JSON object",
		`"x"`:                            "the request must be a JSON object",
		` null `:                         "the request must be a JSON object",
		`7`:                              "the request must be a JSON object",
		`{"prompt":"a","model":5}`:       `model must be "provider/id" or {"provider"`,
		`{"prompt":"a","model":5,"x":1}`: `model must be "provider/id" or {"provider"`,
		`{"prompt":"a","model":{"provider":1,"id":"x"}}`:        "model.provider must be a string, not JSON number",
		`{"prompt":"a","model":{"provider":"p","id":[]},"x":1}`: "model.id must be a string, not JSON array",
	} {
		_, err := DecodeRunRequest([]byte(body), "r")
		if err == nil || !IsBadRequest(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", body, err, want)
		}
		if err != nil && (strings.Contains(err.Error(), "struct") || strings.Contains(err.Error(), "bus.")) {
			t.Errorf("%s: the error names a Go type: %v", body, err)
		}
	}
}

// Many unknown fields do not push the problems of the known fields out of
// the error's first twenty: the first few are named, the rest counted.
func TestDecodeRunRequestManyUnknownFields(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString(`{"prompt":"a","temperature":3`)
	for i := range 30 {
		fmt.Fprintf(&b, `,"u%02d":1`, i)
	}
	b.WriteString("}")
	_, err := DecodeRunRequest([]byte(b.String()), "r")
	var re *RequestError
	if !errors.As(err, &re) {
		t.Fatalf("got %v, want a bad request", err)
	}
	for _, want := range []string{`unknown field "u00"`, `unknown field "u04"`, "25 more unknown fields", "temperature 3 is not in 0..2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("no %q in %v", want, err)
		}
	}
	if strings.Contains(err.Error(), `"u05"`) || len(re.Problems) != 7 {
		t.Errorf("%d problems, want 7 (five unknown fields named, the rest counted, temperature): %v", len(re.Problems), err)
	}
}

// A bad request carries what its body's known fields hold when it decodes
// leniently (an unknown field inside model too), for the worker's own
// checks; nil when it does not decode.
func TestDecodeRunRequestLenientRequest(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"prompt":"x","tools":["rm_rf"],"model":{"provider":"faux","id":"demo","zz":1}}`: "faux/demo rm_rf",
		`{"prompt":"x","tools":["t"],"model":"faux/demo","temperature":3}`:                "faux/demo t",
		`{"prompt":"x","tools":["t"],"temperature":3,"id":"other","x":1}`:                 "<nil> t",
		`{"prompt":"x","tools":["t"],"prompt":"y"}`:                                       "<nil> t",
		`{"prompt":"x","model":"nope","x":1}`:                                             "",
		`{"prompt":1,"x":1}`:                                                              "",
		`[1]`:                                                                             "",
	} {
		_, err := DecodeRunRequest([]byte(body), "r")
		var re *RequestError
		if !errors.As(err, &re) {
			t.Fatalf("%s: got %v, want a bad request", body, err)
		}
		got := ""
		if req := re.Request; req != nil {
			if req.ID != "r" {
				t.Errorf("%s: lenient request's id %q, want the subject's", body, req.ID)
			}
			m := "<nil>"
			if req.Model != nil {
				m = req.Model.String()
			}
			got = m + " " + strings.Join(req.Tools, ",")
		}
		if got != want {
			t.Errorf("%s: lenient request %q, want %q", body, got, want)
		}
	}
}

// An unknown field does not hide the request's other problems (docs/protocol.md
// §3, Bad requests): each unknown field is named as such, wherever it is,
// and the known fields are still validated.
func TestDecodeRunRequestUnknownFieldsAndEveryProblem(t *testing.T) {
	t.Parallel()
	body := `{"prompt":"a","bogus":1,"temperature":3,"limits":{"maxTurn":2,"timeoutSeconds":-1},
		"model":{"provider":"faux","id":"x","region":"eu"},"faux":{"responses":[{"content":[],"mood":"glum"}]},
		"approval":{"tools":["calculator"],"onTimeout":"later","escalate":true},"metadata":{"k":"v"},
		"messages":[{"role":"user","content":"hi","extra":1}]}`
	_, err := DecodeRunRequest([]byte(body), "r")
	var re *RequestError
	if !errors.As(err, &re) {
		t.Fatalf("got %v, want a bad request", err)
	}
	want := []string{
		`unknown field "approval.escalate"`,
		`unknown field "bogus"`,
		`unknown field "faux.responses[0].mood"`,
		`unknown field "limits.maxTurn"`,
		`unknown field "model.region"`,
		"limits.timeoutSeconds -1 is not in 1..",
		"temperature 3 is not in 0..2",
		`approval.onTimeout "later" is not deny or abort`,
	}
	if len(re.Problems) != len(want) {
		t.Errorf("%d problems, want %d:\n%s", len(re.Problems), len(want), strings.Join(re.Problems, "\n"))
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("no %q in %v", w, err)
		}
	}
	if strings.Contains(err.Error(), "malformed") {
		t.Errorf("unknown fields called malformed JSON: %v", err)
	}
	// A field in another case is the field (encoding/json's matching), and
	// a wrong type is still reported with the unknown fields.
	_, err = DecodeRunRequest([]byte(`{"Prompt":"a","x":1,"temperature":3}`), "r")
	if err == nil || !strings.Contains(err.Error(), `unknown field "x"`) || !strings.Contains(err.Error(), "temperature 3") ||
		strings.Contains(err.Error(), "Prompt") {
		t.Errorf("case-folded field: %v", err)
	}
	_, err = DecodeRunRequest([]byte(`{"prompt":1,"x":1}`), "r")
	if err == nil || !strings.Contains(err.Error(), `unknown field "x"`) || !strings.Contains(err.Error(), `malformed JSON: field "prompt"`) {
		t.Errorf("wrong type and unknown field: %v", err)
	}
}

func env(t *testing.T, run string, attempt int, seq uint64, ctl uint64, ev any) *Envelope {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	data := (&Envelope{Run: run, Seq: seq, Attempt: attempt, Worker: `w"1`, TS: 99, ControlSeq: ctl, Event: b}).AppendJSON(nil)
	e, err := DecodeEnvelope(data)
	if err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	return e
}

func TestEnvelopeAndTranscript(t *testing.T) {
	t.Parallel()
	user := agent.UserText("hi")
	head := agent.Message{Role: agent.RoleAssistant, Provider: "faux", Model: "m"}
	final := head
	final.Content = []agent.Content{agent.Text("hello")}
	final.StopReason = agent.StopReasonStop
	steer := agent.UserText("more")
	evs := []any{
		RunStarted{Type: EventRunStarted, Attempt: 1, Tools: []string{}},
		AgentEvent{Type: "agent_start"},
		AgentEvent{Type: "message_start", Message: &user},
		AgentEvent{Type: "message_end", Message: &user},
		AgentEvent{Type: "message_start", Message: &head},
		AgentEvent{Type: "message_update", AssistantMessageEvent: &agent.StreamEvent{Type: agent.StreamTextStart}},
		AgentEvent{Type: "message_update", AssistantMessageEvent: &agent.StreamEvent{Type: agent.StreamTextDelta, Delta: "hel"}},
	}
	tr := &Transcript{}
	for i, ev := range evs {
		if err := tr.Apply(env(t, "r", 1, uint64(i+1), 0, ev)); err != nil {
			t.Fatal(err)
		}
	}
	if p := tr.Partial(); p == nil || p.TextOf() != "hel" || len(tr.Messages) != 1 {
		t.Fatalf("partial %+v, %d messages", p, len(tr.Messages))
	}
	rest := []any{
		AgentEvent{Type: "message_update", AssistantMessageEvent: &agent.StreamEvent{Type: agent.StreamTextEnd, Content: "hello"}},
		AgentEvent{Type: "message_end", Message: &final},
		AgentEvent{Type: "message_start", Message: &steer},
	}
	for i, ev := range rest {
		if err := tr.Apply(env(t, "r", 1, uint64(len(evs)+i+1), 0, ev)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Apply(env(t, "r", 1, 11, 42, AgentEvent{Type: "message_end", Message: &steer})); err != nil {
		t.Fatal(err)
	}
	if tr.Partial() != nil || len(tr.Messages) != 3 || tr.FinalText() != "hello" || len(tr.ControlSeqs()) != 1 || tr.ControlSeqs()[0] != 42 {
		t.Fatalf("transcript %+v", tr.Messages)
	}
	// A second attempt starts over; a late event of the first is ignored.
	_ = tr.Apply(env(t, "r", 2, 1, 0, RunStarted{Type: EventRunStarted, Attempt: 2}))
	_ = tr.Apply(env(t, "r", 1, 12, 0, AgentEvent{Type: "message_end", Message: &final}))
	if tr.Attempt != 2 || len(tr.Messages) != 0 {
		t.Fatalf("after a new attempt: attempt %d, %d messages", tr.Attempt, len(tr.Messages))
	}
	// run_resumed restores the previous attempts' messages.
	_ = tr.Apply(env(t, "r", 2, 2, 0, RunResumed{Type: EventRunResumed, Attempt: 2, MessagesRestored: 2}))
	if len(tr.Messages) != 2 || len(tr.ControlSeqs()) != 0 {
		t.Fatalf("after run_resumed: %d messages", len(tr.Messages))
	}
	_ = tr.Apply(env(t, "r", 2, 3, 0, RunFinished{Type: EventRunFinished, Status: StatusSucceeded}))
	if !tr.Done() {
		t.Fatal("not done")
	}
	// The worker id is JSON-quoted in the envelope.
	e := env(t, "r", 1, 1, 0, AgentEvent{Type: "agent_start"})
	if e.Worker != `w"1` || e.TS != 99 || e.Type != "agent_start" {
		t.Fatalf("%+v", e)
	}
}

// Nothing belongs to a run after its run_finished (a rejected request that
// reused the id adds events after it).
func TestTranscriptStopsAtRunFinished(t *testing.T) {
	t.Parallel()
	tr := &Transcript{}
	for _, e := range []*Envelope{
		env(t, "r", 1, 1, 0, RunStarted{Type: EventRunStarted, Attempt: 1}),
		env(t, "r", 1, 2, 0, AgentEvent{Type: "message_end", Message: ptr(agent.UserText("q"))}),
		env(t, "r", 1, 3, 0, RunFinished{Type: EventRunFinished, Status: StatusSucceeded}),
		env(t, "r", 1, 1, 0, RunStarted{Type: EventRunStarted, Attempt: 1}),
		env(t, "r", 1, 2, 0, RunFinished{Type: EventRunFinished, Status: StatusFailed, Reason: ReasonBadRequest}),
	} {
		if err := tr.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	if tr.Finished.Status != StatusSucceeded || len(tr.Messages) != 1 {
		t.Fatalf("%+v %d", tr.Finished, len(tr.Messages))
	}
}

func ptr[T any](v T) *T { return &v }
