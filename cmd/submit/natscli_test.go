package main

import (
	"fmt"
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
	path := natsCLIPath(t)
	if _, err := exec.LookPath("jq"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no jq on the PATH: .ci/run installs it")
		}
		t.Skip("no jq on the PATH (apt-get install jq)")
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
		cmd.Env = []string{"PATH=" + path, "HOME=" + home, "NATS_URL=" + fleet.url}
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

	for i, want := range []struct{ result, decision string }{{"42", "approve"}, {"5", "approve"}, {"not in production", "deny"}} {
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
		expectIn(blocks[1][3], sh(blocks[1][3], run), `{"type":"tool_approval_resolved","toolCallId":"c1","decision":"`+want.decision+`"`)
	}
}

// TestControlIDNATSCLI runs docs/protocol.md's nats CLI example of a
// control message retried with its Nats-Msg-Id: the second publish must
// name the first one's sequence and be a duplicate.
func TestControlIDNATSCLI(t *testing.T) {
	t.Parallel()
	path := natsCLIPath(t)
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
		cmd.Env = []string{"PATH=" + path, "HOME=" + t.TempDir(), "NATS_URL=" + fleet.url}
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

// natsCLIVersion is the nats CLI the docs are tested with; .ci/run installs
// the same.
const natsCLIVersion = "v0.5.0"

// natsCLIPath is a PATH with the nats CLI on it: the one on the PATH, else
// natscli built once per test binary (go install into the test's
// directory, from the module cache or the proxy). natscli is no tool
// dependency in go.mod: it would add some fifty modules to the module
// graph and switch the embedded nats-server's Antithesis SDK from its
// no-op build to the active one.
func natsCLIPath(t *testing.T) string {
	t.Helper()
	path := os.Getenv("PATH")
	if _, err := exec.LookPath("nats"); err == nil {
		return path
	}
	fleet.natsOnce.Do(func() {
		dir := filepath.Join(fleet.dir, "natscli")
		cmd := exec.Command("go", "install", "github.com/nats-io/natscli/nats@"+natsCLIVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			fleet.natsErr = fmt.Errorf("go install github.com/nats-io/natscli/nats@%s: %v\n%s", natsCLIVersion, err, out)
			return
		}
		fleet.natsDir = dir
	})
	if fleet.natsErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(fleet.natsErr)
		}
		t.Skipf("no nats CLI: not on the PATH, and building it failed (offline without it in the module cache?): %v", fleet.natsErr)
	}
	return fleet.natsDir + string(os.PathListSeparator) + path
}

// The version tested is the one CI installs.
func TestNATSCLIVersionIsCIs(t *testing.T) {
	ci, err := os.ReadFile(filepath.Join("..", "..", ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ci), "github.com/nats-io/natscli/nats@"+natsCLIVersion) {
		t.Errorf(".ci/run does not install natscli %s", natsCLIVersion)
	}
}
