package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// Faux scripts of the approval tests: the calculator is gated.
const (
	calcCall = `{"content":[{"type":"toolCall","id":"c1","name":"calculator","arguments":{"expression":"6*7"}}],"stopReason":"toolUse"}`
	twoCalls = `{"content":[{"type":"toolCall","id":"c1","name":"calculator","arguments":{"expression":"6*7"}},
	 {"type":"toolCall","id":"c2","name":"calculator","arguments":{"expression":"2+2"}}],"stopReason":"toolUse"}`
	gateCalculator = `{"tools":["calculator"]}`
)

func textReply(s string) string { return fmt.Sprintf(`{"content":[{"type":"text","text":%q}]}`, s) }

// gatedRun is a faux run request whose approval field is approval.
func gatedRun(approval string, responses ...string) string {
	return `{"prompt":"go","model":"faux/x","tools":["calculator","sleep"],"approval":` + approval +
		`,"faux":{"responses":[` + strings.Join(responses, ",") + `]}}`
}

// detach submits a request and returns its run id.
func detach(t *testing.T, body string, args ...string) string {
	t.Helper()
	out, errOut, code := submit(t, append([]string{"--detach", "--request", request(t, body)}, append(args, "go")...)...)
	if code != 0 {
		t.Fatalf("submit --detach: exit %d\n%s\n%s", code, out, errOut)
	}
	return strings.TrimSpace(out)
}

// testClient is a client of the test fleet for what the CLI does not show.
func testClient(t *testing.T) *bus.Client {
	t.Helper()
	return fleettest.Connect(t, fleet.url)
}

// approvalEvent is the wire form of the approval events.
type approvalEvent struct {
	Type       string         `json:"type"`
	ToolCallID string         `json:"toolCallId"`
	ToolName   string         `json:"toolName"`
	Args       map[string]any `json:"args"`
	ExpiresAt  int64          `json:"expiresAt"`
	Decision   string         `json:"decision"`
	By         string         `json:"by"`
	Reason     string         `json:"reason"`
	ControlSeq uint64         `json:"controlSeq"`
}

func decodeApproval(t *testing.T, env *bus.Envelope) approvalEvent {
	t.Helper()
	var ev approvalEvent
	if err := json.Unmarshal(env.Event, &ev); err != nil {
		t.Fatalf("%s: %v", env.Event, err)
	}
	return ev
}

// waitEvent follows a run until an envelope of type typ (and, if call is
// set, of that tool call) and returns it.
func waitEvent(t *testing.T, c *bus.Client, run, typ, call string) *bus.Envelope {
	t.Helper()
	fctx, cancel := context.WithTimeout(ctx(t), 45*time.Second)
	defer cancel()
	var seen []*bus.Envelope
	for env, err := range c.Follow(fctx, run) {
		if err != nil {
			if bus.IsFatalFollowError(err) {
				t.Fatalf("run %s: no %s %s: %v\n%s", run, typ, call, err, fleettest.Dump(seen))
			}
			continue
		}
		seen = append(seen, env)
		if env.Type == typ && (call == "" || decodeApproval(t, env).ToolCallID == call) {
			return env
		}
	}
	t.Fatalf("run %s finished without %s %s:\n%s", run, typ, call, fleettest.Dump(seen))
	return nil
}

// events returns a run's envelopes (after its end) of the given types.
func events(t *testing.T, c *bus.Client, run string, types ...string) []*bus.Envelope {
	t.Helper()
	var out []*bus.Envelope
	for env, err := range c.Follow(ctx(t), run) {
		if err != nil {
			if bus.IsFatalFollowError(err) {
				t.Fatal(err)
			}
			continue
		}
		for _, ty := range types {
			if env.Type == ty {
				out = append(out, env)
			}
		}
	}
	return out
}

// waitListed polls a CLI listing (the records' waiting shows with the
// run's next record write) until its output matches re.
func waitListed(t *testing.T, re string, args ...string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, errOut, code := submit(t, args...)
		if code != 0 {
			t.Fatalf("submit %v: exit %d\n%s\n%s", args, code, out, errOut)
		}
		if regexp.MustCompile(re).MatchString(out) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("submit %v never matched %s:\n%s%s", args, re, out, errOut)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// toolResult returns the text and error flag of a run's result of call.
func toolResult(t *testing.T, c *bus.Client, run, call string) (string, bool) {
	t.Helper()
	tr, err := c.LoadTranscript(ctx(t), run)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range tr.Messages {
		if m.ToolCallID == call {
			return m.TextOf(), m.IsError
		}
	}
	t.Fatalf("run %s has no result of %s", run, call)
	return "", false
}

// TestApprovalApprove: a run waits for approval of its calculator call;
// the CLI lists it (approvals, list --state waiting), refuses a call that
// is not pending, approves the call, and the run goes on with its result.
func TestApprovalApprove(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	run := detach(t, gatedRun(gateCalculator, calcCall, textReply("It is 42.")))
	req := decodeApproval(t, waitEvent(t, c, run, bus.EventToolApprovalRequested, "c1"))
	if req.ToolName != "calculator" || req.Args["expression"] != "6*7" || req.ExpiresAt < time.Now().Add(23*time.Hour).UnixMilli() {
		t.Errorf("request %+v", req)
	}
	waitListed(t, `(?m)^`+run+`\s+running`, "list", "--state", "waiting", "--limit", "0")
	out := waitListed(t, `(?m)^`+run+`\s+c1\s+calculator\s+\{"expression":"6\*7"\}\s+\S+\s+in 2[34]h`, "approvals")
	if !strings.HasPrefix(out, "RUN ") {
		t.Errorf("approvals:\n%s", out)
	}
	js, _, code := submit(t, "approvals", "--json")
	var ps []bus.PendingCall
	if err := json.Unmarshal([]byte(js), &ps); err != nil || code != 0 {
		t.Fatalf("approvals --json: exit %d %v\n%s", code, err, js)
	}
	found := false
	for _, p := range ps {
		if p.Run == run {
			found = p.ToolCallID == "c1" && p.ToolName == "calculator" && p.Queue == "default" &&
				p.ExpiresAt.UnixMilli() == req.ExpiresAt && !p.WaitingSince.IsZero()
		}
	}
	if !found {
		t.Errorf("approvals --json lacks %s c1:\n%s", run, js)
	}

	_, errOut, code := submit(t, "approve", run, "c9")
	if code != 1 || !strings.Contains(errOut, "call c9 of run "+run+" is not pending; pending: c1 (calculator)") {
		t.Errorf("approve of a call not pending: exit %d\n%s", code, errOut)
	}
	out, errOut, code = submit(t, "approve", run, "c1", "--by", "alice")
	if code != 0 || !strings.Contains(out, "approve sent for call c1 of run "+run) {
		t.Fatalf("approve: exit %d\n%s\n%s", code, out, errOut)
	}
	out, _, code = submit(t, "follow", run)
	if code != 0 {
		t.Fatalf("follow: exit %d\n%s", code, out)
	}
	expect(t, out, `⚙ calculator {"expression":"6*7"}`, `⏸ approval needed: calculator c1 {"expression":"6*7"} · expires `,
		"✓ approved c1 by alice", "↳ calculator → ok: 42", "It is 42.", "✓ succeeded")
	res := decodeApproval(t, waitEvent(t, c, run, bus.EventToolApprovalResolved, "c1"))
	if res.Decision != "approve" || res.By != "alice" || res.ControlSeq == 0 {
		t.Errorf("resolved %+v", res)
	}
	if _, errOut, code := submit(t, "approve", run, "c1"); code != 1 || !strings.Contains(errOut, "succeeded") {
		t.Errorf("approve after the end: exit %d\n%s", code, errOut)
	}
	if out, _, _ := submit(t, "approvals"); strings.Contains(out, run) {
		t.Errorf("approvals still lists %s:\n%s", run, out)
	}
}

// TestApprovalDenyWithReason: a denied call gets an error result with the
// reason and the model goes on.
func TestApprovalDenyWithReason(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	run := detach(t, gatedRun(gateCalculator, calcCall, textReply("Understood, no calculator.")))
	waitEvent(t, c, run, bus.EventToolApprovalRequested, "c1")
	if _, errOut, code := submit(t, "deny", run, "c1"); code != 2 || !strings.Contains(errOut, "--reason") {
		t.Errorf("deny without a reason: exit %d\n%s", code, errOut)
	}
	if out, errOut, code := submit(t, "deny", run, "c1", "--reason", "not in production", "--by", "bob"); code != 0 {
		t.Fatalf("deny: exit %d\n%s\n%s", code, out, errOut)
	}
	out, _, code := submit(t, "follow", run)
	if code != 0 {
		t.Fatalf("follow: exit %d\n%s", code, out)
	}
	expect(t, out, "✗ denied c1 by bob: not in production", "↳ calculator → error: ", "Understood, no calculator.")
	text, isErr := toolResult(t, c, run, "c1")
	if !isErr || !strings.Contains(text, "not in production") {
		t.Errorf("the denied call's result: %q (error %v)", text, isErr)
	}
	res := decodeApproval(t, waitEvent(t, c, run, bus.EventToolApprovalResolved, "c1"))
	if res.Decision != "deny" || res.Reason != "not in production" || res.By != "bob" {
		t.Errorf("resolved %+v", res)
	}
}

// TestApprovalEditedArguments: an edit that breaks the tool's schema is
// rejected and the call stays pending; a valid edit runs the call with
// the approver's arguments.
func TestApprovalEditedArguments(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	run := detach(t, gatedRun(gateCalculator, calcCall, textReply("Done.")))
	waitEvent(t, c, run, bus.EventToolApprovalRequested, "c1")
	if _, errOut, code := submit(t, "approve", run, "c1", "--args", "[1,2]"); code != 2 || !strings.Contains(errOut, "JSON object") {
		t.Errorf("--args not an object: exit %d\n%s", code, errOut)
	}
	if out, errOut, code := submit(t, "approve", run, "c1", "--args", `{"expression":{"nested":true}}`); code != 0 {
		t.Fatalf("approve with invalid args: exit %d\n%s\n%s", code, out, errOut)
	}
	rej := decodeApproval(t, waitEvent(t, c, run, bus.EventToolApprovalRejected, "c1"))
	if rej.Reason == "" || rej.ControlSeq == 0 {
		t.Errorf("rejected %+v", rej)
	}
	ps, err := c.PendingOf(ctx(t), run)
	if err != nil || len(ps) != 1 || ps[0].ToolCallID != "c1" {
		t.Fatalf("after the rejected edit: pending %+v %v", ps, err)
	}
	if out, errOut, code := submit(t, "approve", run, "c1", "--args", `{"expression":"2+3"}`); code != 0 {
		t.Fatalf("approve with valid args: exit %d\n%s\n%s", code, out, errOut)
	}
	out, _, code := submit(t, "follow", run)
	if code != 0 {
		t.Fatalf("follow: exit %d\n%s", code, out)
	}
	expect(t, out, "! an answer for c1 was not applied: ", "; still waiting", "✓ approved c1", ` with {"expression":"2+3"}`, "↳ calculator → ok: 5")
	if text, isErr := toolResult(t, c, run, "c1"); isErr || text != "5" {
		t.Errorf("the edited call's result: %q (error %v)", text, isErr)
	}
}

// TestApprovalTimeoutDeny: nobody answers; the call is denied at its
// expiry and the run goes on.
func TestApprovalTimeoutDeny(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	out, errOut, code := submit(t, "--request", request(t, gatedRun(`{"tools":["calculator"],"timeoutSeconds":1}`, calcCall, textReply("No answer, then."))), "go")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	expect(t, out, "⏸ approval needed: calculator c1", "✗ timeout c1", "↳ calculator → error: ", "No answer, then.", "✓ succeeded")
	run := regexp.MustCompile(`run (\S+) · queue`).FindStringSubmatch(out)
	if run == nil {
		t.Fatalf("no run id in\n%s", out)
	}
	req := decodeApproval(t, waitEvent(t, c, run[1], bus.EventToolApprovalRequested, "c1"))
	res := waitEvent(t, c, run[1], bus.EventToolApprovalResolved, "c1")
	if ev := decodeApproval(t, res); ev.Decision != "timeout" {
		t.Errorf("resolved %+v", ev)
	}
	if res.TS < req.ExpiresAt {
		t.Errorf("resolved at %d, before the expiry %d", res.TS, req.ExpiresAt)
	}
	if _, isErr := toolResult(t, c, run[1], "c1"); !isErr {
		t.Error("the timed-out call's result is not an error")
	}
}

// TestApprovalTimeoutAbort: onTimeout abort ends the run aborted /
// approval_timeout.
func TestApprovalTimeoutAbort(t *testing.T) {
	t.Parallel()
	out, errOut, code := submit(t, "--request", request(t, gatedRun(`{"tools":["calculator"],"timeoutSeconds":1,"onTimeout":"abort"}`, calcCall, textReply("never"))), "go")
	if code != exitAborted {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	expect(t, out, "⏸ approval needed: calculator c1", "■ aborted")
	if strings.Contains(out, "never") {
		t.Errorf("the model went on:\n%s", out)
	}
	run := regexp.MustCompile(`run (\S+) · queue`).FindStringSubmatch(out)
	st, _, _ := submit(t, "status", run[1])
	if !regexp.MustCompile(`(?m)^state\s+aborted \(approval_timeout\)$`).MatchString(st) {
		t.Errorf("status:\n%s", st)
	}
}

// TestApprovalAbortWhileWaiting: an abort ends a waiting run at once.
func TestApprovalAbortWhileWaiting(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	run := detach(t, gatedRun(gateCalculator, calcCall, textReply("never")))
	waitEvent(t, c, run, bus.EventToolApprovalRequested, "c1")
	out, errOut, code := submit(t, "abort", run, "--reason", "not needed")
	if code != 0 || !strings.Contains(out, "■ aborted: not needed") {
		t.Fatalf("abort: exit %d\n%s\n%s", code, out, errOut)
	}
	f := fleettest.Decode(t, waitEvent(t, c, run, bus.EventRunFinished, "")).RunFinished
	if f.Status != bus.StatusAborted || f.Reason != bus.ReasonAbortedByUser {
		t.Errorf("run_finished %+v", f)
	}
	if _, errOut, code := submit(t, "approve", run, "c1"); code != 1 || !strings.Contains(errOut, "aborted") {
		t.Errorf("approve after the abort: exit %d\n%s", code, errOut)
	}
}

// TestApprovalParallelCallsOppositeOrder: two gated calls of one batch are
// asked together; answered c2 first, then c1, each resolves as answered
// and gets its own result.
func TestApprovalParallelCallsOppositeOrder(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	run := detach(t, gatedRun(gateCalculator, twoCalls, textReply("42 and 4.")))
	waitEvent(t, c, run, bus.EventToolApprovalRequested, "c1")
	waitEvent(t, c, run, bus.EventToolApprovalRequested, "c2")
	if _, errOut, code := submit(t, "approve", run, "c2"); code != 0 {
		t.Fatalf("approve c2: exit %d\n%s", code, errOut)
	}
	waitEvent(t, c, run, bus.EventToolApprovalResolved, "c2")
	if ps, err := c.PendingOf(ctx(t), run); err != nil || len(ps) != 1 || ps[0].ToolCallID != "c1" {
		t.Fatalf("after c2's answer: pending %+v %v", ps, err)
	}
	if _, errOut, code := submit(t, "approve", run, "c1"); code != 0 {
		t.Fatalf("approve c1: exit %d\n%s", code, errOut)
	}
	out, _, code := submit(t, "follow", run)
	if code != 0 {
		t.Fatalf("follow: exit %d\n%s", code, out)
	}
	var order []string
	for _, env := range events(t, c, run, bus.EventToolApprovalRequested, bus.EventToolApprovalResolved) {
		order = append(order, strings.TrimPrefix(env.Type, "tool_approval_")+":"+decodeApproval(t, env).ToolCallID)
	}
	// The batch is asked together (in either order), then resolved as answered.
	if got := strings.Join(order, " "); !regexp.MustCompile(`^requested:c(1 requested:c2|2 requested:c1) resolved:c2 resolved:c1$`).MatchString(got) {
		t.Errorf("approval events: %s", got)
	}
	for call, want := range map[string]string{"c1": "42", "c2": "4"} {
		if text, isErr := toolResult(t, c, run, call); isErr || text != want {
			t.Errorf("%s: %q (error %v), want %s", call, text, isErr, want)
		}
	}
}

// TestApprovalAnswerBeforeRequest: an answer stored before its call asks
// is not applied (protocol 1.8): the run rejects it, and the call takes
// the answer sent after its request.
func TestApprovalAnswerBeforeRequest(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	sleepFirst := `{"content":[{"type":"toolCall","id":"s1","name":"sleep","arguments":{"seconds":2}}],"stopReason":"toolUse"}`
	run := detach(t, gatedRun(gateCalculator, sleepFirst, calcCall, textReply("It is 42.")))
	seq, err := c.Answer(ctx(t), run, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove, By: "early"})
	if err != nil {
		t.Fatal(err)
	}
	// The answer is stored: was the request?
	envs, err := c.ReadEvents(ctx(t), run, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range envs {
		if env.Type == bus.EventToolApprovalRequested {
			t.Fatalf("the call was asked before the answer was stored (a slow machine?):\n%s", fleettest.Dump(envs))
		}
	}
	rej := decodeApproval(t, waitEvent(t, c, run, bus.EventToolApprovalRejected, "c1"))
	if rej.ControlSeq != seq || !strings.Contains(rej.Reason, "stored before") {
		t.Fatalf("rejected %+v, want the early answer %d", rej, seq)
	}
	after, err := c.Answer(ctx(t), run, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove, By: "after"})
	if err != nil {
		t.Fatal(err)
	}
	res := decodeApproval(t, waitEvent(t, c, run, bus.EventToolApprovalResolved, "c1"))
	if res.Decision != "approve" || res.By != "after" || res.ControlSeq != after {
		t.Errorf("resolved %+v, want the answer of control sequence %d", res, after)
	}
	if f := fleettest.Decode(t, waitEvent(t, c, run, bus.EventRunFinished, "")).RunFinished; f.Status != bus.StatusSucceeded {
		t.Fatalf("run_finished %+v", f)
	}
	if text, isErr := toolResult(t, c, run, "c1"); isErr || text != "42" {
		t.Errorf("c1: %q (error %v)", text, isErr)
	}
}

// waitingRecord is the part of a run record the durability test reads.
type waitingRecord struct {
	State   string `json:"state"`
	Attempt int    `json:"attempt"`
	Worker  string `json:"worker"`
	Waiting *struct {
		For       string `json:"for"`
		Approvals []struct {
			ToolCallID string `json:"toolCallId"`
			ExpiresAt  int64  `json:"expiresAt"`
		} `json:"approvals"`
	} `json:"waiting"`
}

// waitRecord polls a run's record (submit status --json) until ok.
func waitRecord(t *testing.T, run string, ok func(waitingRecord) bool) waitingRecord {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, errOut, code := submit(t, "status", "--json", run)
		var rec waitingRecord
		if code == 0 && json.Unmarshal([]byte(out), &rec) == nil && ok(rec) {
			return rec
		}
		if time.Now().After(deadline) {
			envs, _ := testClient(t).ReadEvents(ctx(t), run, 0)
			t.Fatalf("run %s: the record never got there: exit %d\n%s\n%s\nevents:\n%s", run, code, out, errOut, fleettest.Dump(envs))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestApprovalWorkerKilledWhileWaiting: kill -9 of the worker holding a
// waiting run; another worker process resumes it, still waiting for the
// same call with the same expiry and without asking again; the answer
// then runs the call.
func TestApprovalWorkerKilledWhileWaiting(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	queue := "apprkill"
	dir := t.TempDir()
	stopA, killA, _, err := startKillableWorker(filepath.Join(dir, "a.log"), nil, "--nats", fleet.url, "--queue", queue, "--worker-id", "appr-a")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stopA() })
	run := detach(t, gatedRun(gateCalculator, calcCall, textReply("It is 42.")), "--queue", queue)
	req := decodeApproval(t, waitEvent(t, c, run, bus.EventToolApprovalRequested, "c1"))
	waitRecord(t, run, func(r waitingRecord) bool {
		return r.Waiting != nil && r.Waiting.For == "approval" && r.Attempt == 1
	})
	killA()
	stopB, _, err := startWorkerProcess(filepath.Join(dir, "b.log"), nil, "--nats", fleet.url, "--queue", queue, "--worker-id", "appr-b")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stopB(); err != nil {
			t.Errorf("worker b: %v", err)
		}
	})
	rec := waitRecord(t, run, func(r waitingRecord) bool {
		return r.Attempt >= 2 && r.Worker == "appr-b" && r.Waiting != nil && r.Waiting.For == "approval"
	})
	if len(rec.Waiting.Approvals) != 1 || rec.Waiting.Approvals[0].ToolCallID != "c1" || rec.Waiting.Approvals[0].ExpiresAt != req.ExpiresAt {
		t.Errorf("resumed record %+v, want c1 expiring at %d", rec.Waiting, req.ExpiresAt)
	}
	if ps, err := c.PendingOf(ctx(t), run); err != nil || len(ps) != 1 || ps[0].ExpiresAt.UnixMilli() != req.ExpiresAt {
		t.Errorf("pending after the resume: %+v %v", ps, err)
	}
	waitListed(t, `(?m)^`+run+`\s+c1\s+calculator\s`, "approvals", "--queue", queue)
	if out, _, _ := submit(t, "approvals", "--queue", "default"); strings.Contains(out, run) {
		t.Errorf("approvals --queue default lists %s of queue %s:\n%s", run, queue, out)
	}
	if _, errOut, code := submit(t, "approve", run, "c1"); code != 0 {
		t.Fatalf("approve: exit %d\n%s", code, errOut)
	}
	out, _, code := submit(t, "follow", run)
	if code != 0 {
		t.Fatalf("follow: exit %d\n%s", code, out)
	}
	expect(t, out, "attempt 2", "✓ approved c1", "↳ calculator → ok: 42", "It is 42.", "✓ succeeded")
	if n := len(events(t, c, run, bus.EventToolApprovalRequested)); n != 1 {
		t.Errorf("%d tool_approval_requested events, want 1 (no second request)", n)
	}
	if text, isErr := toolResult(t, c, run, "c1"); isErr || text != "42" {
		t.Errorf("c1: %q (error %v)", text, isErr)
	}
}

// TestApprovalOnATerminal answers two waiting calls from the terminal
// that follows the run: /approve alone is ambiguous with two pending,
// /deny c1 REASON denies c1, then /approve approves the one left.
func TestApprovalOnATerminal(t *testing.T) {
	t.Parallel()
	p := startPTY(t, []string{"USER=carol"}, "--request", request(t, gatedRun(gateCalculator, twoCalls, textReply("Only c2 ran."))), "go")
	p.out.waitFor(t, "/approve [CALL], /deny [CALL] REASON", 30*time.Second)
	p.out.waitFor(t, "/approve c1 approves · /deny c1 REASON denies", 30*time.Second)
	p.out.waitFor(t, "/approve c2 approves · /deny c2 REASON denies", 30*time.Second)
	p.typeLine(t, "/approve\n")
	p.out.waitFor(t, "several calls wait: ", 30*time.Second)
	p.out.waitFor(t, "; name one: /approve CALL", 30*time.Second)
	p.typeLine(t, "/deny c1 too risky\n")
	p.out.waitFor(t, "→ deny sent", 30*time.Second)
	p.out.waitFor(t, "✗ denied c1 by carol: too risky", 30*time.Second)
	p.typeLine(t, "/approve\n")
	p.out.waitFor(t, "→ approve sent", 30*time.Second)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.out)
	}
	expect(t, p.screen(t).String(), "✓ approved c2 by carol", "↳ calculator → ok: 4", "Only c2 ran.", "✓ succeeded")
}
