package bus

import (
	"encoding/json"
	"strings"
	"testing"
)

// A request's approval is checked like the rest: every problem listed.
func TestApprovalRequestProblemsAreAllListed(t *testing.T) {
	t.Parallel()
	body := `{"prompt":"x","approval":{"tools":["", "[a", "` + strings.Repeat("t", 200) + `", "ok\u0007"],"timeoutSeconds":604801,"onTimeout":"explode"}}`
	_, err := DecodeRunRequest([]byte(body), "r1")
	if !IsBadRequest(err) {
		t.Fatalf("not a bad request: %v", err)
	}
	for _, want := range []string{`approval.tools[0] ""`, "approval.tools[1]", "not a valid pattern", "approval.tools[2]", "approval.tools[3]",
		"approval.timeoutSeconds 604801 is not in 1..604800", `approval.onTimeout "explode" is not deny or abort`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	for _, bad := range []string{`{"prompt":"x","approval":{"tools":[]}}`, `{"prompt":"x","approval":{}}`, `{"prompt":"x","approval":{"tools":["a"],"extra":1}}`} {
		if _, err := DecodeRunRequest([]byte(bad), "r1"); !IsBadRequest(err) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	good := `{"prompt":"x","approval":{"tools":["deploy","everything__*"],"timeoutSeconds":3600,"onTimeout":"abort"}}`
	req, err := DecodeRunRequest([]byte(good), "r1")
	if err != nil {
		t.Fatal(err)
	}
	a := req.Approval
	if !a.Gates("deploy") || !a.Gates("everything__echo") || a.Gates("calculator") || a.Timeout() != 3600 || !a.Aborts() {
		t.Fatalf("approval %+v", a)
	}
	for pattern, name := range map[string]string{"*": "mcp/files/write", "mcp/*": "mcp/files/write", "mcp/?iles/*": "mcp/files/write",
		"mcp/files/write": "mcp/files/write", `mcp\/files*`: "mcp/files"} {
		if !(&Approval{Tools: []string{pattern}}).Gates(name) {
			t.Errorf("%q does not gate %q", pattern, name)
		}
	}
	if (&Approval{Tools: []string{"mcp/*"}}).Gates("other/x") || (&Approval{Tools: []string{"a?b"}}).Gates("a//b") {
		t.Error("a pattern gates a name it does not match")
	}
	if all := (&Approval{Tools: []string{"*"}}); !all.Gates("anything") || all.Timeout() != DefaultApprovalTimeoutSeconds || all.Aborts() {
		t.Fatalf("defaults %+v", all)
	}
}

func TestApprovalAnswerProblems(t *testing.T) {
	t.Parallel()
	a := ApprovalAnswer{ToolCallID: "", Decision: "maybe", By: strings.Repeat("b", 129), Reason: strings.Repeat("r", MaxApprovalReason+1)}
	p := strings.Join(a.Problems(), "; ")
	for _, want := range []string{"toolCallId", `decision "maybe"`, "by must be at most 128", "reason is"} {
		if !strings.Contains(p, want) {
			t.Errorf("problems %q do not say %q", p, want)
		}
	}
	deny := ApprovalAnswer{ToolCallID: "c1", Decision: DecisionDeny, Arguments: map[string]any{"x": 1}}
	if p := deny.Problems(); len(p) != 1 || !strings.Contains(p[0], "only for approve") {
		t.Fatalf("deny with arguments: %v", p)
	}
	ok := ApprovalAnswer{ToolCallID: "toolu_01A", Decision: DecisionApprove, By: "alice", Arguments: map[string]any{"x": 1}}
	if p := ok.Problems(); len(p) != 0 {
		t.Fatalf("valid answer: %v", p)
	}
}

// 1.2 records said "waiting":"model"; 1.3 writes an object. Both decode.
func TestRecordWaitingDecodesBothForms(t *testing.T) {
	t.Parallel()
	var old RunRecord
	if err := json.Unmarshal([]byte(`{"id":"r","state":"running","waiting":"model"}`), &old); err != nil || old.Waiting == nil || old.Waiting.For != WaitingModel {
		t.Fatalf("1.2 form: %v %+v", err, old.Waiting)
	}
	var rec RunRecord
	body := `{"id":"r","state":"running","waiting":{"for":"approval","since":"2026-11-29T18:00:01.25Z","approvals":[{"toolCallId":"c1","toolName":"deploy","requestedAt":1,"expiresAt":2}]},"waitedMs":5}`
	if err := json.Unmarshal([]byte(body), &rec); err != nil || rec.Waiting.For != WaitingApproval || len(rec.Waiting.Approvals) != 1 || rec.Waiting.Approvals[0].ExpiresAt != 2 || rec.WaitedMs != 5 {
		t.Fatalf("1.3 form: %v %+v", err, rec.Waiting)
	}
	var none RunRecord
	if err := json.Unmarshal([]byte(`{"id":"r","state":"running"}`), &none); err != nil || none.Waiting != nil {
		t.Fatalf("no waiting: %v %+v", err, none.Waiting)
	}
	if !matches(&rec, ListOptions{State: StateWaiting}) || matches(&none, ListOptions{State: StateWaiting}) {
		t.Fatal("the waiting filter")
	}
	if data, _ := json.Marshal(&rec); !mayMatch(data, listNeedles(ListOptions{State: StateWaiting})) {
		t.Fatal("a waiting record's JSON misses the filter's needles")
	}
}

func TestApprovalEventsDecode(t *testing.T) {
	t.Parallel()
	env := &Envelope{Event: json.RawMessage(`{"type":"tool_approval_resolved","toolCallId":"c1","decision":"deny","by":"bob","reason":"no","controlSeq":7}`)}
	ev, err := env.Decode()
	if err != nil || ev.Approval == nil || ev.Approval.Decision != DecisionDeny || ev.Approval.ControlSeq != 7 || ev.Agent != nil {
		t.Fatalf("%v %+v", err, ev)
	}
}
