package bus

import (
	"fmt"
	"strings"
	"testing"
)

// TestPendingCalls folds approval events into the pending calls: a
// resolution or a result settles the oldest unsettled call of its id, a
// resumed attempt keeps the first attempt's request, run_finished clears
// everything, a stored copy of an event (same attempt and seq) is skipped.
func TestPendingCalls(t *testing.T) {
	t.Parallel()
	env := func(attempt int, ts int64, event string) *Envelope {
		e, err := DecodeEnvelope(fmt.Appendf(nil, `{"run":"r1","seq":%d,"attempt":%d,"worker":"w","ts":%d,"event":%s}`, ts, attempt, ts, event))
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	req := func(id, tool string, exp int) string {
		return fmt.Sprintf(`{"type":"tool_approval_requested","toolCallId":%q,"toolName":%q,"args":{"x":1},"expiresAt":%d}`, id, tool, exp*1000)
	}
	ids := func(envs ...*Envelope) string {
		var out []string
		for _, p := range PendingCalls(envs) {
			out = append(out, p.ToolCallID+"/"+p.ToolName+"@"+p.ExpiresAt.UTC().Format("05"))
		}
		return strings.Join(out, " ")
	}
	a := env(1, 1, req("c1", "deploy", 9))
	b := env(1, 2, req("c2", "pay", 8))
	end := func(id string) *Envelope {
		return env(1, 3, `{"type":"tool_execution_end","toolCallId":"`+id+`","toolName":"deploy","result":{"content":[]},"isError":false}`)
	}
	resolved := func(id string) *Envelope {
		return env(1, 3, `{"type":"tool_approval_resolved","toolCallId":"`+id+`","decision":"approve","controlSeq":4}`)
	}
	rejected := env(1, 3, `{"type":"tool_approval_rejected","toolCallId":"c1","reason":"bad","controlSeq":4}`)
	resumed := env(2, 5, `{"type":"run_started","queue":"q","worker":"w2","attempt":2,"tools":[]}`)
	finished := env(2, 6, `{"type":"run_finished","status":"succeeded","usage":{},"cost":0,"turns":1,"durationMs":1}`)
	for _, tc := range []struct {
		name string
		envs []*Envelope
		want string
	}{
		{"none", nil, ""},
		{"one", []*Envelope{a}, "c1/deploy@09"},
		{"two in order", []*Envelope{a, b}, "c1/deploy@09 c2/pay@08"},
		{"a stored copy counts once", []*Envelope{a, b, a}, "c1/deploy@09 c2/pay@08"},
		{"rejected edit keeps it", []*Envelope{a, rejected}, "c1/deploy@09"},
		{"resolved", []*Envelope{a, b, resolved("c2")}, "c1/deploy@09"},
		{"a result settles it", []*Envelope{a, b, end("c1")}, "c2/pay@08"},
		{"resumed attempt keeps waiting", []*Envelope{a, resumed}, "c1/deploy@09"},
		{"reused id: the oldest first", []*Envelope{a, resolved("c1"), env(1, 4, req("c1", "deploy", 7))}, "c1/deploy@07"},
		{"finished", []*Envelope{a, resumed, finished}, ""},
	} {
		if got := ids(tc.envs...); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if p := PendingCalls([]*Envelope{a})[0]; string(p.Args) != `{"x":1}` || p.RequestedAt.UnixMilli() != 1 || p.Run != "r1" {
		t.Errorf("pending %+v", p)
	}
}
