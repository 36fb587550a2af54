package main

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// TestChildRunsDocNATSCLI runs docs/protocol.md's nats CLI walkthrough of
// child runs (§17) as written, on the tests' worker process: the parent's
// tool results are its children's answers, and each child's record names
// it as parent.
func TestChildRunsDocNATSCLI(t *testing.T) {
	t.Parallel()
	path, lines := docWalkthrough(t, "agents.submit.default.plan1", 3)
	run := "doc-plan-" + bus.NewRunID()[:10]
	home := t.TempDir()
	sh := func(line string, want ...string) {
		t.Helper()
		line = regexp.MustCompile(`\bplan1\b`).ReplaceAllString(line, run)
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", line)
		cmd.Env = []string{"PATH=" + path, "HOME=" + home, "NATS_URL=" + fleet.url}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s: no %q in\n%s", line, w, out)
			}
		}
	}
	c := testClient(t)
	sh(lines[0])
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) { // the worker is another process
		rec, err := c.Status(ctx(t), run)
		if err == nil && rec.Finished() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not finish: %v %+v", run, err, rec)
		}
	}
	sh(lines[1], `"A is done"`, `"B is done"`)
	sh(lines[2], `"state":"succeeded","child":{"parentRunId":"`+run+`","rootRunId":"`+run+`","depth":1}`, `"id":"`+childID(t, testClient(t), run, "a")+`"`, `"id":"`+childID(t, testClient(t), run, "b")+`"`)
}

// TestForgedChildLinkDocNATSCLI runs docs/protocol.md's walkthrough of a
// forged child link (§17): the worker process refuses the request, and the
// child key is 64 hex digits (the tests' server has no permissions).
func TestForgedChildLinkDocNATSCLI(t *testing.T) {
	t.Parallel()
	path, lines := docWalkthrough(t, "agents.submit.default.forged1", 3)
	run := "doc-forged-" + bus.NewRunID()[:10]
	home := t.TempDir()
	sh := func(line string) string {
		t.Helper()
		line = regexp.MustCompile(`\bforged1\b`).ReplaceAllString(line, run)
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", line)
		cmd.Env = []string{"PATH=" + path, "HOME=" + home, "NATS_URL=" + fleet.url}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		return string(out)
	}
	c := testClient(t)
	sh(lines[0])
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) { // the worker is another process
		rec, err := c.Status(ctx(t), run)
		if err == nil && rec.Finished() {
			if rec.Child != nil {
				t.Errorf("the refused run's record keeps the link %+v", rec.Child)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not finish: %v %+v", run, err, rec)
		}
	}
	if out := sh(lines[1]); !strings.Contains(out, "the link was not made by a worker of this fleet") {
		t.Errorf("the forged run's error: %s", out)
	}
	if out := strings.TrimSpace(sh(lines[2])); !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(out) {
		t.Errorf("the child key: %q", out)
	}
}
