package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// gatedRun is a run whose one calculator call waits for approval, then
// says "done".
func gatedRun(id, expression string) *bus.RunRequest {
	return &bus.RunRequest{ID: id, Prompt: "compute " + expression, Tools: []string{"calculator"},
		Approval: &bus.Approval{Tools: []string{"calculator"}, TimeoutSeconds: 3600},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.ToolCall("c1", "calculator", map[string]any{"expression": expression})}, StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text("done")}}}}}
}

// waitWaiting waits until the console lists n waiting calls.
func waitWaiting(t *testing.T, c *console, n int) approvalsPage {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var page approvalsPage
		if code := c.getJSON(t, "/api/approvals", &page); code != http.StatusOK {
			t.Fatalf("/api/approvals: %d", code)
		}
		if len(page.Calls) == n || time.Now().After(deadline) {
			if len(page.Calls) != n {
				t.Fatalf("%d calls wait, want %d: %+v", len(page.Calls), n, page.Calls)
			}
			return page
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// toolResult is the text of a run's tool result for call c1.
func toolResult(t *testing.T, f *testFleet, id string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := f.c.LoadTranscript(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult {
			return m.TextOf(), m.IsError
		}
	}
	return "", false
}

// TestApprovalAnswers: the console lists the waiting calls of the fleet
// oldest first with their tool, arguments, schema and expiry, and answers
// them with the protocol's body: approve (by the basic-auth user), deny
// with a reason (by --approver-name), and an edit that the tool's schema
// refuses (422, nothing sent) then one it takes, which runs and which the
// answers endpoint returns as what ran. A read-only console lists them and
// answers nothing.
func TestApprovalAnswers(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	hash, _ := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	file := filepath.Join(t.TempDir(), "htpasswd")
	if err := os.WriteFile(file, []byte("alice:"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	basic, err := loadAuth(file, "")
	if err != nil {
		t.Fatal(err)
	}
	asAlice := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { r.SetBasicAuth("alice", "s3cret"); h.ServeHTTP(w, r) })
	}
	alice := newConsoleWith(t, f, serverConfig{AllowControl: true, Auth: basic}, asAlice)
	ops := newConsole(t, f, serverConfig{AllowControl: true, ApproverName: "ops-team"})
	ro := newConsole(t, f, serverConfig{})

	for _, r := range []*bus.RunRequest{gatedRun("ap-approve", "2*3"), gatedRun("ap-deny", "1/0"), gatedRun("ap-edit", "1+1")} {
		r.Metadata = map[string]string{"title": "Gated " + r.ID}
		f.submit(r)
		waitWaiting(t, ro, map[string]int{"ap-approve": 1, "ap-deny": 2, "ap-edit": 3}[r.ID])
	}
	page := waitWaiting(t, ro, 3)
	if page.AllowControl {
		t.Error("a read-only console says it allows control")
	}
	for i, want := range []string{"ap-approve", "ap-deny", "ap-edit"} {
		c := page.Calls[i]
		if c.Run != want || c.ToolCallID != "c1" || c.ToolName != "calculator" || c.Title != "Gated "+want || c.Queue != "default" ||
			!strings.Contains(string(c.Args), `"expression"`) || !strings.Contains(string(c.Parameters), `"expression"`) ||
			time.Until(c.ExpiresAt) < 50*time.Minute {
			t.Errorf("call %d: %+v", i, c)
		}
	}
	if code, body := ro.post(t, "/api/runs/ap-approve/approve", ro.csrfToken(t), `{"toolCallId":"c1","decision":"approve"}`); code != http.StatusForbidden {
		t.Errorf("read-only console approves: %d %s", code, body)
	}

	decode := func(body string) uint64 {
		t.Helper()
		var ack struct {
			ControlSeq uint64 `json:"controlSeq"`
		}
		if err := json.Unmarshal([]byte(body), &ack); err != nil || ack.ControlSeq == 0 {
			t.Fatalf("answer %s", body)
		}
		return ack.ControlSeq
	}
	tok := alice.csrfToken(t)
	code, body := alice.post(t, "/api/runs/ap-approve/approve", tok, `{"toolCallId":"c1","decision":"approve"}`)
	if code != http.StatusAccepted {
		t.Fatalf("approve: %d %s", code, body)
	}
	seq := decode(body)
	code, body = ops.post(t, "/api/runs/ap-deny/approve", ops.csrfToken(t), `{"toolCallId":"c1","decision":"deny","reason":"not now"}`)
	if code != http.StatusAccepted {
		t.Fatalf("deny: %d %s", code, body)
	}
	// An edit the schema refuses: 422 naming the problem, nothing sent.
	code, body = ops.post(t, "/api/runs/ap-edit/approve", ops.csrfToken(t), `{"toolCallId":"c1","decision":"approve","arguments":{"expr":"7*6"}}`)
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "expression") || !strings.Contains(body, `"field":"arguments"`) {
		t.Fatalf("bad edit: %d %s", code, body)
	}
	code, body = ops.post(t, "/api/runs/ap-edit/approve", ops.csrfToken(t), `{"toolCallId":"c1","decision":"approve","arguments":{"expression":"7*6"}}`)
	if code != http.StatusAccepted {
		t.Fatalf("edit: %d %s", code, body)
	}
	editSeq := decode(body)

	for id, want := range map[string]struct {
		text    string
		isError bool
	}{"ap-approve": {"6", false}, "ap-deny": {"denied by ops-team: not now", true}, "ap-edit": {"42", false}} {
		ro.waitRun(t, id, func(r bus.RunRecord) bool { return r.Finished() })
		if got, isErr := toolResult(t, f, id); !strings.Contains(got, want.text) || isErr != want.isError {
			t.Errorf("%s: tool result %q (error %v), want %q", id, got, isErr, want.text)
		}
	}
	// Who answered, as the runs' events say.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for id, by := range map[string]string{"ap-approve": "alice", "ap-deny": "ops-team", "ap-edit": "ops-team"} {
		envs, err := f.c.ReadEvents(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range envs {
			if e.Type == bus.EventToolApprovalResolved {
				var ev bus.ToolApproval
				_ = json.Unmarshal(e.Event, &ev)
				found = ev.By == by
			}
		}
		if !found {
			t.Errorf("%s: no tool_approval_resolved by %s", id, by)
		}
	}
	// The stored answers: the edit is what ran; another run's sequence is
	// not this run's answer.
	var a answerInfo
	if code := ro.getJSON(t, "/api/runs/ap-edit/answers/"+jsonNum(editSeq), &a); code != http.StatusOK || string(a.Arguments) != `{"expression":"7*6"}` || a.By != "ops-team" {
		t.Errorf("answer of the edit: %d %+v", code, a)
	}
	if code := ro.getJSON(t, "/api/runs/ap-edit/answers/"+jsonNum(seq), nil); code != http.StatusNotFound {
		t.Errorf("another run's answer: %d", code)
	}
	// Answered calls wait no more.
	if code, body := ops.post(t, "/api/runs/ap-edit/approve", ops.csrfToken(t), `{"toolCallId":"c1","decision":"approve"}`); code != http.StatusConflict {
		t.Errorf("answer to a finished run: %d %s", code, body)
	}
	waitWaiting(t, ro, 0)
}

func TestLocalRefsOnly(t *testing.T) {
	t.Parallel()
	for schema, want := range map[string]bool{
		`{"type":"object","properties":{"a":{"$ref":"#/$defs/x"}},"$defs":{"x":{"type":"string"}}}`: true,
		`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}`:                true,
		`{"type":"object","properties":{"a":{"$ref":"file:///etc/passwd"}}}`:                        false,
		`{"$id":"file:///tmp/x.json","type":"object"}`:                                              false,
		`{"$schema":"file:///etc/hosts"}`:                                                           false,
		`not json`:                                                                                  false,
	} {
		if got := localRefsOnly(json.RawMessage(schema)); got != want {
			t.Errorf("localRefsOnly(%s) = %v", schema, got)
		}
	}
}

// TestApprovalsPages: GET /api/approvals answers pages of 100 runs with
// the cursor of the next (before=), every call once; a bad query is a 400
// naming every problem.
func TestApprovalsPages(t *testing.T) {
	t.Parallel()
	fl := fleettest.Start(t, fleettest.Options{})
	f := &testFleet{Fleet: fl, t: t, srv: fl.Server, c: fl.Client}
	for i := range 120 {
		if err := fleettest.PutWaitingRun(fleettest.Context(t), fl.Client, "default", fmt.Sprintf("run-%03d", i), "c1", map[string]int{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	c := newConsole(t, f, serverConfig{})
	seen := map[string]bool{}
	var sizes []int
	path := "/api/approvals"
	for range 5 {
		var page approvalsPage
		if code := c.getJSON(t, path, &page); code != http.StatusOK {
			t.Fatalf("%s: %d", path, code)
		}
		sizes = append(sizes, len(page.Calls))
		for _, call := range page.Calls {
			if seen[call.Run] {
				t.Errorf("%s listed twice", call.Run)
			}
			seen[call.Run] = true
		}
		if page.Next == "" {
			break
		}
		path = "/api/approvals?before=" + url.QueryEscape(page.Next)
	}
	if fmt.Sprint(sizes) != "[100 20]" || len(seen) != 120 {
		t.Errorf("pages of %v calls, %d runs; want [100 20], 120", sizes, len(seen))
	}
	resp, err := c.Client().Get(c.URL + "/api/approvals?limit=0&before=x.y&queue=a.b")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "limit") || !strings.Contains(string(body), "before") || !strings.Contains(string(body), "queue") {
		t.Errorf("bad query: %d %s, want 400 naming limit, before and queue", resp.StatusCode, body)
	}
}
