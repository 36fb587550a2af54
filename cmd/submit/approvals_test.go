package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

func TestParseApprovalInput(t *testing.T) {
	one := []pendingCall{{"c1", "deploy"}}
	two := []pendingCall{{"c1", "deploy"}, {"c2", "pay"}}
	for _, tc := range []struct {
		line    string
		pending []pendingCall
		want    string // decision call reason, or "error: ..." or "" (not handled)
	}{
		{"hello", one, ""},
		{"/followup x", one, ""},
		{"/approved", one, ""},
		{"/approve", one, "approve c1 "},
		{"/approve c1", one, "approve c1 "},
		{"  /approve   c1  ", one, "approve c1 "},
		{"/approve c9", one, `error: no pending call "c9" (pending: c1)`},
		{"/approve", two, "error: several calls wait: c1, c2; name one: /approve CALL"},
		{"/approve c2", two, "approve c2 "},
		{"/approve", nil, "error: no call waits for approval"},
		{"/deny", one, "error: usage: /deny [CALL] REASON"},
		{"/deny c1", one, "error: usage: /deny [CALL] REASON"},
		{"/deny too risky", one, "deny c1 too risky"},
		{"/deny c1 too risky", one, "deny c1 too risky"},
		// CALL is taken only if it equals a pending call's id.
		{"/deny c2 is not a call here", one, "deny c1 c2 is not a call here"},
		{"/deny c2 no", two, "deny c2 no"},
		{"/deny no", two, "error: several calls wait: c1, c2; name one: /deny CALL"},
	} {
		a, handled, err := parseApprovalInput(tc.line, tc.pending)
		got := ""
		switch {
		case err != nil:
			got = "error: " + err.Error()
		case handled:
			got = a.Decision + " " + a.ToolCallID + " " + a.Reason
		}
		if got != tc.want {
			t.Errorf("%q with %v: got %q, want %q", tc.line, tc.pending, got, tc.want)
		}
		if handled != (tc.want != "") {
			t.Errorf("%q: handled %v", tc.line, handled)
		}
	}
}

// TestRenderApprovalEvents: the approval events render as lines, the
// pending calls follow them, and what a model or an approver wrote cannot
// drive the terminal.
func TestRenderApprovalEvents(t *testing.T) {
	var out bytes.Buffer
	r := newRenderer(&out, style{})
	r.interactive = true
	evil := "\x1b]0;owned\x07\x1b[2J"
	for i, ev := range []map[string]any{
		{"type": "tool_execution_start", "toolCallId": "c1", "toolName": "deploy", "args": map[string]any{"env": "prod"}},
		{"type": bus.EventToolApprovalRequested, "toolCallId": "c1", "toolName": "deploy", "args": map[string]any{"env": "prod" + evil}, "expiresAt": 4102444800000},
		{"type": bus.EventToolApprovalRequested, "toolCallId": "c2" + evil, "toolName": "pay\nfake line", "args": map[string]any{}, "expiresAt": 4102444800000},
		{"type": bus.EventToolApprovalRejected, "toolCallId": "c1", "reason": "env: must be one of staging, prod" + evil, "controlSeq": 7},
		{"type": bus.EventToolApprovalResolved, "toolCallId": "c1", "decision": "approve", "by": "alice" + evil, "controlSeq": 8},
		{"type": bus.EventToolApprovalResolved, "toolCallId": "c2" + evil, "decision": "deny", "by": "bob", "reason": "too\nmuch", "controlSeq": 9},
	} {
		if err := r.Render(envelope(t, uint64(i+2), 0, ev)); err != nil {
			t.Fatal(err)
		}
		if i == 2 && len(r.approvals) != 2 {
			t.Fatalf("pending after two requests: %v", r.approvals)
		}
	}
	got := out.String()
	for _, want := range []string{
		`⏸ approval needed: deploy c1 {"env":"prod\u001b]0;owned\u0007\u001b[2J"} · expires `,
		"/approve c1 approves · /deny c1 REASON denies",
		"· expires " + time.UnixMilli(4102444800000).Local().Format("2006-01-02 15:04") + " (in ",
		"⏸ approval needed: pay fake line c2]0;owned[2J {}",
		"! an answer for c1 was not applied: env: must be one of staging, prod]0;owned[2J; still waiting",
		"✓ approved c1 by alice]0;owned[2J",
		"✗ denied c2]0;owned[2J by bob: too …",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.ContainsAny(got, "\x1b\x07") {
		t.Errorf("escapes reached the output: %q", got)
	}
	if len(r.approvals) != 0 {
		t.Errorf("pending after the answers: %v", r.approvals)
	}
}

// TestApprovalCommandWords: approvals, approve and deny are commands only
// when nothing but their own flags comes before them; otherwise they start
// a prompt (submit --model m approve the plan).
func TestApprovalCommandWords(t *testing.T) {
	e, _, _ := testEnv("")
	for _, c := range []struct {
		word string
		args []string
		want bool
	}{
		{"approve", nil, true},
		{"approve", []string{"--by", "alice", "--nats", "nats://x"}, true},
		{"deny", []string{"--reason=no"}, true},
		{"approvals", []string{"--json", "--queue", "q"}, true},
		{"approve", []string{"--model", "faux/x"}, false},
		{"approvals", []string{"--by", "alice"}, false},
	} {
		if got := takesOnly(promptWords[c.word](e), c.args); got != c.want {
			t.Errorf("%s after %v: command %v, want %v", c.word, c.args, got, c.want)
		}
	}
}
