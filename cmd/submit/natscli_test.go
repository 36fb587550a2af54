package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
)

// TestApprovalNATSCLI runs the exact commands of docs/protocol.md's
// "Answering with the nats CLI" against the test fleet: the reads on a
// waiting run, then each answer on a waiting run of its own, with the
// outcome each must have. It needs the nats CLI (natscli) and jq on the
// PATH, and skips without them.
func TestApprovalNATSCLI(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"nats", "jq"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("no %s on the PATH: .ci/run installs it", bin)
			}
			t.Skipf("no %s on the PATH (nats: go install github.com/nats-io/natscli/nats@v0.5.0)", bin)
		}
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n### Answering with the nats CLI\n")
	if !ok {
		t.Fatal("docs/protocol.md has no section \"Answering with the nats CLI\"")
	}
	if i := regexp.MustCompile(`\n#{1,3} `).FindStringIndex(section); i != nil {
		section = section[:i[0]]
	}
	var blocks [][]string
	for _, b := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1) {
		var lines []string
		for _, l := range strings.Split(b[1], "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		blocks = append(blocks, lines)
	}
	if len(blocks) != 2 || len(blocks[0]) != 3 || len(blocks[1]) != 4 {
		t.Fatalf("the section's blocks changed (%d blocks): teach this test about them\n%q", len(blocks), blocks)
	}
	c := testClient(t)
	home := t.TempDir() // no nats CLI contexts of the user's
	sh := func(line, run string) string {
		t.Helper()
		line = regexp.MustCompile(`\br1\b`).ReplaceAllString(line, run)
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", line)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "NATS_URL=" + fleet.url}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		return string(out)
	}
	newRun := func() string {
		t.Helper()
		id := "natscli-" + bus.NewRunID()[:12]
		if _, err := c.SubmitRaw(ctx(t), "", id, []byte(gatedRun(gateCalculator, calcCall, textReply("Done.")))); err != nil {
			t.Fatal(err)
		}
		waitEvent(t, c, id, bus.EventToolApprovalRequested, "c1")
		return id
	}
	expectIn := func(what, out string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: no %q in\n%s", what, w, out)
			}
		}
	}

	run := newRun()
	waitRecord(t, run, func(r waitingRecord) bool { return r.Waiting != nil && r.Waiting.For == "approval" })
	expectIn(blocks[0][0], sh(blocks[0][0], run), `{"for":"approval",`, `"toolCallId":"c1"`, `"expiresAt":`)
	expectIn(blocks[0][1], sh(blocks[0][1], run), `{"type":"tool_approval_requested","toolCallId":"c1","toolName":"calculator","args":{"expression":"6*7"},"expiresAt":`)
	expectIn(blocks[0][2], sh(blocks[0][2], run), `{"id":"`+run+`","waiting":{"for":"approval"`)

	for i, want := range []struct{ result, decision, resolved string }{
		{"42", "approve", `"by":"alice","controlSeq":`},
		{"5", "approve", `,"arguments":{"expression":"2+3"}}`}, // the edit, since 1.8
		{"not in production", "deny", `"by":"bob","reason":"not in production","controlSeq":`},
	} {
		if i > 0 {
			run = newRun()
		}
		sh(blocks[1][i], run)
		if f := waitEvent(t, c, run, bus.EventRunFinished, ""); f == nil {
			t.Fatal("no run_finished")
		}
		text, isErr := toolResult(t, c, run, "c1")
		if !strings.Contains(text, want.result) || isErr != (want.decision == "deny") {
			t.Errorf("%s: c1's result %q (error %v), want %q", blocks[1][i], text, isErr, want.result)
		}
		expectIn(blocks[1][3], sh(blocks[1][3], run), `{"type":"tool_approval_resolved","toolCallId":"c1","decision":"`+want.decision+`"`, want.resolved)
	}
}

// TestControlIDNATSCLI runs docs/protocol.md's nats CLI example of a
// control message retried with its Nats-Msg-Id: the second publish must
// name the first one's sequence and be a duplicate.
func TestControlIDNATSCLI(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("nats"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no nats on the PATH: .ci/run installs it")
		}
		t.Skip("no nats on the PATH (go install github.com/nats-io/natscli/nats@v0.5.0)")
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, b := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		if !strings.Contains(b[1], "Nats-Msg-Id:r1:steer:k1") {
			continue
		}
		for _, l := range strings.Split(b[1], "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
	}
	if len(lines) != 2 || lines[0] != lines[1] {
		t.Fatalf("the example changed: teach this test about it\n%q", lines)
	}
	run := "natscli-" + bus.NewRunID()[:12]
	line := regexp.MustCompile(`\br1\b`).ReplaceAllString(lines[0], run)
	var outs []string
	for range 2 {
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", line)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "NATS_URL=" + fleet.url}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		outs = append(outs, string(out))
	}
	seq := regexp.MustCompile(`Stored in Stream: AGENTS_CONTROL Sequence: (\d+)`).FindStringSubmatch(outs[0])
	if seq == nil || strings.Contains(outs[0], "Duplicate") {
		t.Fatalf("first publish:\n%s", outs[0])
	}
	if !strings.Contains(outs[1], "Sequence: "+seq[1]+" Duplicate: true") {
		t.Fatalf("the retry is not the first copy (sequence %s):\n%s", seq[1], outs[1])
	}
}
