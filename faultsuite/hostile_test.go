//go:build fault && linux

package faultsuite

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// rssKiB is a process's resident set size.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// Hostile requests against a real worker process, each through the wire
// protocol: every run ends with its clear reason, the worker stays up, and
// its memory and log stay bounded.
func TestHostileRequestsRealWorker(t *testing.T) {
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	f.extraArgs = []string{"--max-run-events", "2000", "--max-turns", "20", "--max-run-timeout", "5m"}
	w := f.startWorker("h1")
	c := f.c
	ctx, cancel := f.ctx(3 * time.Minute)
	defer cancel()
	finished := func(id string) *bus.RunFinished {
		t.Helper()
		tr, err := c.LoadTranscript(ctx, id)
		if err != nil {
			t.Fatalf("run %s: %v\n%s", id, err, w.tail(20))
		}
		return tr.Finished
	}
	rss0 := rssKiB(t, w.pid())

	// An endless stream of one-character deltas: event_budget.
	stream := &bus.RunRequest{Prompt: "talk", Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: &bus.FauxScript{TokenSize: 1, Responses: []agent.ScriptedResponse{{Content: []agent.Content{agent.Text(strings.Repeat("blah ", 20_000))}}}}}
	res, err := c.Submit(ctx, "default", stream)
	if err != nil {
		t.Fatal(err)
	}
	if fin := finished(res.ID); fin.Reason != bus.ReasonEventBudget {
		t.Fatalf("streaming run ended %s/%s: %s", fin.Status, fin.Reason, fin.Error)
	}

	// A 1 MiB tool list, published raw: bad_request, with a small log.
	logBefore := len(strings.Join(w.output(), "\n"))
	id := bus.NewRunID()
	body := `{"prompt":"x","tools":["a"` + strings.Repeat(`,"a"`, 200_000-1) + `]}`
	if _, err := c.JetStream().Publish(ctx, c.Names().Submit("default", id), []byte(body)); err != nil {
		t.Fatal(err)
	}
	if fin := finished(id); fin.Reason != bus.ReasonBadRequest || len(fin.Error) > bus.MaxErrorBytes+8 {
		t.Fatalf("tool-list run ended %s/%s with a %d-byte error", fin.Status, fin.Reason, len(fin.Error))
	}
	if grown := len(strings.Join(w.output(), "\n")) - logBefore; grown > 32<<10 {
		t.Fatalf("the worker logged %d bytes about one bad request", grown)
	}

	// A ceiling: bad_request naming the flag.
	over := &bus.RunRequest{Prompt: "x", Limits: &bus.Limits{MaxTurns: 500}}
	if res, err = c.Submit(ctx, "default", over); err != nil {
		t.Fatal(err)
	}
	if fin := finished(res.ID); fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, "--max-turns") {
		t.Fatalf("over-ceiling run ended %s/%s: %s", fin.Status, fin.Reason, fin.Error)
	}

	// Forged usage in the submitted messages: token_budget, cost >= 0.
	var msgs []agent.Message
	if err := json.Unmarshal([]byte(`[{"role":"user","content":[{"type":"text","text":"hi"}]},
		{"role":"assistant","content":[{"type":"text","text":"hello"}],"stopReason":"stop",
		 "usage":{"totalTokens":-1000000000,"cost":{"total":-5000}}}]`), &msgs); err != nil {
		t.Fatal(err)
	}
	calc := agent.ScriptedResponse{Content: []agent.Content{agent.ToolCall("c", "calculator", map[string]any{"expression": "1+1"})}, StopReason: agent.StopReasonToolUse}
	forged := &bus.RunRequest{Messages: msgs, Prompt: "add", Tools: []string{"calculator"}, Limits: &bus.Limits{MaxTotalTokens: 1},
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{calc, calc, calc}}}
	if res, err = c.Submit(ctx, "default", forged); err != nil {
		t.Fatal(err)
	}
	if fin := finished(res.ID); fin.Reason != bus.ReasonTokenBudget || fin.Cost < 0 {
		t.Fatalf("forged-usage run ended %s/%s, cost %g", fin.Status, fin.Reason, fin.Cost)
	}

	// 200 steers of 100 KiB to one run blocked in a tool: control_budget.
	sleep := agent.ScriptedResponse{Content: []agent.Content{agent.ToolCall("s", "sleep", map[string]any{"seconds": 60})}, StopReason: agent.StopReasonToolUse}
	blocked := &bus.RunRequest{Prompt: "wait", Tools: []string{"sleep"}, Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{sleep, {Content: []agent.Content{agent.Text("done")}}}}}
	if res, err = c.Submit(ctx, "default", blocked); err != nil {
		t.Fatal(err)
	}
	for env, err := range c.Follow(ctx, res.ID) {
		if err != nil {
			t.Fatal(err)
		}
		if env.Type == string(agent.EventToolExecutionStart) {
			break
		}
	}
	text := strings.Repeat("s", 100<<10)
	sent := 0
	for ; sent < 200; sent++ {
		if _, err := c.Steer(ctx, res.ID, text); err != nil {
			break // the run finished: the client refuses more
		}
	}
	fin := finished(res.ID)
	if fin.Reason != bus.ReasonControlBudget {
		t.Fatalf("steered run ended %s/%s after %d steers: %s", fin.Status, fin.Reason, sent, fin.Error)
	}
	envs, err := rawEvents(ctx, c, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, e := range envs {
		total += len(e.Event)
	}
	if total > 8<<20 {
		t.Fatalf("the steered run stored %d MB of events", total>>20)
	}
	rss1 := rssKiB(t, w.pid())
	t.Logf("worker RSS %d MiB -> %d MiB; steered run: %d steers sent, %d KiB of events", rss0>>10, rss1>>10, sent, total>>10)
	if rss1 > rss0+256<<10 {
		t.Fatalf("worker RSS grew from %d MiB to %d MiB", rss0>>10, rss1>>10)
	}
	if w.exited() {
		t.Fatalf("the worker exited:\n%s", w.tail(20))
	}
}
