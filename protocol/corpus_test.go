package protocol_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/protocol"
)

// The checked-in corpus (one run of each kind, as TestFleetRunsValidate
// -update-corpus wrote it) validates, strictly, and covers every event
// type, assistant stream step, approval decision and record state.
func TestCorpus(t *testing.T) {
	v, err := protocol.NewValidator(protocol.Strict())
	if err != nil {
		t.Fatal(err)
	}
	names, err := filepath.Glob(filepath.Join(corpusDir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	s := &seen{events: map[string]bool{}, steps: map[string]bool{}, roles: map[string]bool{}, blocks: map[string]bool{},
		decisions: map[string]bool{}, states: map[string]bool{}}
	counts := map[string]int{}
	for _, name := range names {
		base := filepath.Base(name)
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		check := func(what string, d protocol.Doc, doc []byte) {
			t.Helper()
			counts[string(d)]++
			if err := v.Validate(d, doc); err != nil {
				t.Errorf("%s: %s: %v", base, what, err)
			}
		}
		switch {
		case strings.HasSuffix(base, ".events.ndjson"):
			for i, line := range ndjson(t, name, b) {
				check("line "+itoa(i+1), protocol.Envelope, line)
				s.add(t, line)
			}
		case strings.HasSuffix(base, ".controls.ndjson"):
			for i, line := range ndjson(t, name, b) {
				var c controlBody
				if err := json.Unmarshal(line, &c); err != nil {
					t.Fatalf("%s: line %d: %v", base, i+1, err)
				}
				check("line "+itoa(i+1), protocol.Doc(c.Kind), c.Body)
			}
		case strings.HasSuffix(base, ".record.json"), strings.HasSuffix(base, ".waiting-record.json"):
			check("record", protocol.Record, b)
			s.addState(t, b)
		case strings.HasSuffix(base, ".request.json"):
			check("request", protocol.RunRequest, b)
		case base == "presence.json":
			check("presence", protocol.Presence, b)
		case base == "schedule.json":
			check("schedule", protocol.Schedule, b)
		case base == "README.md":
		default:
			t.Errorf("%s: not a corpus file (README.md says which are)", base)
		}
	}
	for _, d := range protocol.Docs() {
		if counts[string(d)] == 0 {
			t.Errorf("the corpus has no %s document", d)
		}
	}
	checkCoverage(t, s)
	t.Logf("%d files, documents by kind: %v", len(names), counts)
}

func ndjson(t *testing.T, name string, b []byte) [][]byte {
	t.Helper()
	var out [][]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		out = append(out, bytes.Clone(sc.Bytes()))
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if len(out) == 0 {
		t.Fatalf("%s: empty", name)
	}
	return out
}

// invalidCases are the documents of testdata/invalid, each a corpus
// document (or a body a client might send) with one thing wrong, and a
// part of the error that says it is that thing: a document refused for
// another reason fails the test too.
var invalidCases = map[string]string{
	"envelope.missing-seq.json":             "missing property 'seq'",
	"envelope.seq-not-integer.json":         "at '/seq': got string, want integer",
	"envelope.unknown-event-type.json":      `event type "run_paused" is not one of protocol`,
	"envelope.bad-status.json":              "event run_finished: ",
	"envelope.failed-without-reason.json":   "missing property 'reason'",
	"envelope.bad-stop-reason.json":         "at '/message/stopReason'",
	"envelope.bad-decision.json":            "at '/decision': value must be one of 'approve', 'deny', 'timeout'",
	"envelope.tool-end-without-result.json": "missing property 'result'",
	"envelope.unknown-stream-step.json":     "at '/assistantMessageEvent'",
	"run-request.unknown-field.json":        "additional properties 'promt' not allowed",
	"run-request.no-prompt.json":            "missing property 'prompt'",
	"run-request.system-message.json":       "value must be 'user'",
	"run-request.bad-thinking-level.json":   "at '/thinkingLevel': value must be one of",
	"run-request.bad-id.json":               "at '/id': 'r.1' does not match pattern",
	"run-request.bad-model.json":            "at '/model'",
	"run-request.limits-wrong-type.json":    "at '/limits/maxTurns': got string, want integer",
	"steer.text-and-message.json":           "'oneOf' failed, subschemas 0, 1 matched",
	"steer.empty.json":                      "'oneOf' failed, none matched",
	"followup.message-not-user.json":        "at '/message/role': value must be 'user'",
	"abort.unknown-field.json":              "additional properties 'why' not allowed",
	"approve.bad-decision.json":             "at '/decision': value must be one of 'approve', 'deny'",
	"approve.deny-with-arguments.json":      "'not' failed",
	"approve.missing-tool-call-id.json":     "missing property 'toolCallId'",
	"record.bad-state.json":                 "at '/state': value must be one of",
	"record.failed-without-reason.json":     "missing property 'reason'",
	"record.bad-time.json":                  "at '/submittedAt': 'yesterday' is not valid date-time",
	"record.bad-waiting-for.json":           "at '/waiting/for'",
	"presence.missing-protocol.json":        "missing property 'protocol'",
}

// Each document of testdata/invalid fails validation, for the reason it
// was made for, against the schemas as published (not strictly: these
// are wrong for every reader).
func TestInvalidDocuments(t *testing.T) {
	v, err := protocol.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	names, err := filepath.Glob("testdata/invalid/*.json")
	if err != nil {
		t.Fatal(err)
	}
	var have []string
	for _, name := range names {
		base := filepath.Base(name)
		have = append(have, base)
		want, ok := invalidCases[base]
		if !ok {
			t.Errorf("%s: not in invalidCases: say what is wrong with it", base)
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid(b) {
			t.Errorf("%s: not JSON (it must fail the schema, not the parser)", base)
			continue
		}
		doc, _, _ := strings.Cut(base, ".")
		err = v.Validate(protocol.Doc(doc), b)
		switch {
		case err == nil:
			t.Errorf("%s validates; it must not (%s)", base, want)
		case !strings.Contains(err.Error(), want):
			t.Errorf("%s fails, but not for what it was made for (want %q):\n%v", base, want, err)
		}
	}
	for name := range invalidCases {
		if !slices.Contains(have, name) {
			t.Errorf("invalidCases names %s, which testdata/invalid lacks", name)
		}
	}
}

// The validator refuses what is not a document of its kind at all.
func TestValidatorRefusesNonDocuments(t *testing.T) {
	v, err := protocol.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		doc  protocol.Doc
		data string
	}{
		{protocol.RunRequest, `{"prompt":"hi"} {"prompt":"again"}`},
		{protocol.Envelope, `not json`},
		{protocol.Doc("nonsense"), `{}`},
	} {
		if err := v.Validate(c.doc, []byte(c.data)); err == nil {
			t.Errorf("%s %q validates", c.doc, c.data)
		}
	}
	// And takes the smallest documents the protocol allows.
	for _, c := range []struct {
		doc  protocol.Doc
		data string
	}{
		{protocol.RunRequest, `{"prompt":"hi"}`},
		{protocol.RunRequest, `{"messages":[{"role":"user","content":"hi"}],"model":"openai/meta-llama/Llama-3-8B"}`},
		{protocol.Steer, `{"text":"Use metric units."}`},
		{protocol.FollowUp, `{"message":{"role":"user","content":"And in Fahrenheit?"}}`},
		{protocol.Abort, `{}`},
		{protocol.Approve, `{"toolCallId":"c1","decision":"approve"}`},
		{protocol.Record, `{"id":"r1","queue":"default","state":"running","attempt":1,"turns":0,"usage":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"totalTokens":0,"cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}},"cost":0,"waiting":"model"}`},
	} {
		if err := v.Validate(c.doc, []byte(c.data)); err != nil {
			t.Errorf("%s %s: %v", c.doc, c.data, err)
		}
	}
	// A minimal request is one the worker takes too.
	if _, err := bus.DecodeRunRequest([]byte(`{"messages":[{"role":"user","content":"hi"}],"model":"openai/meta-llama/Llama-3-8B"}`), "r1"); err != nil {
		t.Error(err)
	}
}
