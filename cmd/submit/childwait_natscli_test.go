package main

import (
	"bufio"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// TestChildWaitDocNATSCLI runs docs/protocol.md's nats CLI lines of a
// parent waiting for its child (§17): the notice of the child's end, and
// the parent's entry in the waiting-run index while it waits.
func TestChildWaitDocNATSCLI(t *testing.T) {
	t.Parallel()
	path, notice := docWalkthrough(t, "agents.childdone.plan1.*", 1)
	_, index := docWalkthrough(t, "agents.waiting.default.plan1", 1)
	run := "doc-wait-" + bus.NewRunID()[:10]
	home := t.TempDir()
	command := func(line string) *exec.Cmd {
		line = regexp.MustCompile(`\bplan1\b`).ReplaceAllString(line, run)
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", line)
		cmd.Env = []string{"PATH=" + path, "HOME=" + home, "NATS_URL=" + fleet.url}
		return cmd
	}
	sub := command(notice[0])
	out, err := sub.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sub.Stderr = sub.Stdout
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Process.Kill(); _ = sub.Wait() })
	lines := bufio.NewReader(out)
	for {
		l, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("nats sub ended before subscribing: %v", err)
		}
		if strings.Contains(l, "Subscribing") {
			break
		}
	}
	child := bus.FauxScript{Responses: []agent.ScriptedResponse{{Content: []agent.Content{agent.Text(strings.Repeat("slow ", 10))}}}, TokensPerSecond: 5}
	req := &bus.RunRequest{ID: run, Prompt: "plan", Model: &bus.ModelRef{Provider: "faux", ID: "scripted"}, Tools: []string{bus.ToolRunAgent},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.ToolCall("a", bus.ToolRunAgent, map[string]any{"prompt": "research", "request": map[string]any{"faux": child}})}, StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text("merged")}},
		}}}
	c := testClient(t)
	if _, err := c.Submit(ctx(t), "", req); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) { // the worker is another process
		rec, err := c.Status(ctx(t), run)
		if err == nil && rec.Waiting != nil && rec.Waiting.For == bus.WaitingChildren {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never waited for its child: %v %+v", run, err, rec)
		}
	}
	got, err := command(index[0]).CombinedOutput()
	if err != nil || !strings.Contains(string(got), `"for":"children"`) {
		t.Fatalf("%s: %v\n%s", index[0], err, got)
	}
	rest, _ := io.ReadAll(lines)
	if want := `Received on "agents.childdone.` + run + `.` + childID(t, testClient(t), run, "a") + `"`; !strings.Contains(string(rest), want) {
		t.Fatalf("nats sub: no %q in\n%s", want, rest)
	}
}
