package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// A compaction renders as one line when it ends (tokens, cut, the
// summary's first line); a manual one also when it starts; a failed one
// says why; a cancelled one (a drain, a hand-back, an abort) is not shown
// as failed.
func TestRenderCompaction(t *testing.T) {
	var b bytes.Buffer
	r := newRenderer(&b, style{})
	for i, ev := range []any{
		bus.CompactionStart{Type: bus.EventCompactionStart, Reason: bus.CompactionThreshold, TokensBefore: 7000},
		bus.CompactionEnd{Type: bus.EventCompactionEnd, Reason: bus.CompactionThreshold, TokensBefore: 7000, TokensAfter: 3100,
			Summary: "## Goal\nread every file", FirstKeptIndex: 13, MessagesSummarized: 13},
		bus.CompactionStart{Type: bus.EventCompactionStart, Reason: bus.CompactionManual, ControlSeq: 42},
		bus.CompactionEnd{Type: bus.EventCompactionEnd, Reason: bus.CompactionManual, Error: "compaction: the summary call failed: 503"},
		bus.CompactionEnd{Type: bus.EventCompactionEnd, Reason: bus.CompactionThreshold, Error: "compaction: the summary call failed: context canceled", Cancelled: true},
	} {
		if err := r.Render(envelope(t, uint64(i+2), 0, ev)); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || !strings.Contains(lines[0], "context compacted (threshold): 7000 → 3100 tokens, 13 messages summarised, kept from message 13 · ## Goal") ||
		!strings.Contains(lines[1], "control sequence 42") || !strings.Contains(lines[2], "compaction failed: compaction: the summary call failed: 503") ||
		!strings.Contains(lines[3], "compaction cancelled") || strings.Contains(lines[3], "failed") {
		t.Fatalf("rendered:\n%s", b.String())
	}
}

// submit result --transcript shows every message and, before the first
// kept one, where the context was cut and the summary the model was sent
// instead of what came before.
func TestTranscriptShowsTheCut(t *testing.T) {
	var out bytes.Buffer
	e := &env{stdout: &out, stderr: &out, getenv: func(string) string { return "" }}
	tr := &bus.Transcript{
		Messages: []agent.Message{agent.UserText("read every file"), agent.UserText("second"), agent.UserText("third")},
		Compactions: []*bus.CompactionEnd{{Type: bus.EventCompactionEnd, Reason: bus.CompactionThreshold, TokensBefore: 7000, TokensAfter: 3000,
			Summary: "## Goal\nread every file", FirstKeptIndex: 2}},
		Finished: &bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded},
	}
	writeTranscript(e, style{}, tr, 0)
	got := out.String()
	cut := strings.Index(got, "context compacted here (threshold, 7000 → 3000 tokens)")
	if cut < 0 || cut < strings.Index(got, "» user: second") || cut > strings.Index(got, "» user: third") ||
		!strings.Contains(got, "   │ ## Goal\n   │ read every file\n") || !strings.Contains(got, "» user: read every file") {
		t.Fatalf("transcript:\n%s", got)
	}
}

// The transcript draws only the cuts a resume would use: one after the
// last message too; not a failed compaction's, nor one on a tool result.
func TestTranscriptCutsAsResumesUseThem(t *testing.T) {
	var out bytes.Buffer
	e := &env{stdout: &out, stderr: &out, getenv: func(string) string { return "" }}
	tr := &bus.Transcript{
		Messages: []agent.Message{agent.UserText("read every file"),
			{Role: agent.RoleAssistant, Content: []agent.Content{agent.ToolCall("c1", "read", map[string]any{})}, StopReason: agent.StopReasonToolUse},
			{Role: agent.RoleToolResult, ToolCallID: "c1", ToolName: "read", Content: []agent.Content{agent.Text("ok")}}},
		Compactions: []*bus.CompactionEnd{
			{Type: bus.EventCompactionEnd, Reason: bus.CompactionManual, Error: "compaction: the summary call failed: 503"},
			{Type: bus.EventCompactionEnd, Reason: bus.CompactionThreshold, Summary: "on a tool result", FirstKeptIndex: 2},
			{Type: bus.EventCompactionEnd, Reason: bus.CompactionOverflow, TokensBefore: 9000, TokensAfter: 100, Summary: "all of it", FirstKeptIndex: 3},
		},
		Finished: &bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded},
	}
	writeTranscript(e, style{}, tr, 0)
	got := out.String()
	if n := strings.Count(got, "context compacted here"); n != 1 || strings.Index(got, "context compacted here (overflow") < strings.Index(got, "↳ read") ||
		strings.Contains(got, "on a tool result") {
		t.Fatalf("transcript:\n%s", got)
	}
}

// submit compact sends the compact control message to a running run; a
// run id is required and the instructions are bounded.
func TestCompactCommand(t *testing.T) {
	t.Parallel()
	if _, _, code := submit(t, "compact"); code != exitUsage {
		t.Fatalf("compact without a run: exit %d", code)
	}
	if _, errOut, code := submit(t, "compact", "r1", "--instructions", strings.Repeat("x", bus.MaxCompactionInstructions+1)); code != exitUsage || !strings.Contains(errOut, "at most") {
		t.Fatalf("long instructions: exit %d %s", code, errOut)
	}
	id := "t-compact-" + bus.NewRunID()[:8]
	p := start(t, nil, "--id", id, "--request", request(t, sleepRun(2, "answer", "unused")), "start")
	p.stdout.waitFor(t, "⚙ sleep", 30*time.Second)
	out, errOut, code := submit(t, "compact", id, "--instructions", "keep file names")
	if code != 0 || !strings.Contains(out, "compact sent to run "+id) {
		t.Fatalf("compact: exit %d\n%s\n%s", code, out, errOut)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.stdout)
	}
}

// Without the continued run's messages (no snapshot), the cut is still
// drawn before the first kept message: firstKeptIndex counts them.
func TestTranscriptCutWithoutThePriorMessages(t *testing.T) {
	var out bytes.Buffer
	e := &env{stdout: &out, stderr: &out, getenv: func(string) string { return "" }}
	tr := &bus.Transcript{
		Messages: []agent.Message{agent.UserText("second"), agent.UserText("third")}, // "first" is the prior's, left out
		Compactions: []*bus.CompactionEnd{{Type: bus.EventCompactionEnd, Reason: bus.CompactionThreshold, TokensBefore: 7000, TokensAfter: 3000,
			Summary: "## Goal", FirstKeptIndex: 2}},
		Finished: &bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded},
	}
	writeTranscript(e, style{}, tr, 1)
	got := out.String()
	cut := strings.Index(got, "context compacted here")
	if cut < 0 || cut < strings.Index(got, "» user: second") || cut > strings.Index(got, "» user: third") {
		t.Fatalf("transcript:\n%s", got)
	}
}
