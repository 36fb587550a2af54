package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// envelope builds an envelope the way the worker writes it.
func envelope(t *testing.T, seq uint64, controlSeq uint64, event any) *bus.Envelope {
	t.Helper()
	ev, err := json.Marshal(event)
	if err != nil {
		t.Fatal(err)
	}
	data := (&bus.Envelope{Run: "r1", Seq: seq, Attempt: 1, Worker: "w1", TS: 1, ControlSeq: controlSeq, Event: ev}).AppendJSON(nil)
	env, err := bus.DecodeEnvelope(data)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func update(se agent.StreamEvent) bus.AgentEvent {
	return bus.AgentEvent{Type: string(agent.EventMessageUpdate), AssistantMessageEvent: &se}
}

func TestRendererView(t *testing.T) {
	isErr, notErr := true, false
	asst := agent.Message{Role: agent.RoleAssistant}
	user := agent.UserText("the prompt")
	steer := agent.UserText("steer \x1b[31mred\x1b[0m")
	events := []any{
		bus.RunStarted{Type: bus.EventRunStarted, Queue: "default", Worker: "w1", Attempt: 1, Model: &bus.ModelRef{Provider: "faux", ID: "x"}, Tools: []string{"calculator"}, Notice: "DEMO"},
		bus.AgentEvent{Type: "agent_start"},
		bus.AgentEvent{Type: "turn_start"},
		bus.AgentEvent{Type: "message_start", Message: &user},
		bus.AgentEvent{Type: "message_end", Message: &user},
		bus.AgentEvent{Type: "message_start", Message: &asst},
		update(agent.StreamEvent{Type: agent.StreamThinkingStart}),
		update(agent.StreamEvent{Type: agent.StreamThinkingDelta, Delta: "hmm "}),
		update(agent.StreamEvent{Type: agent.StreamThinkingDelta, Delta: "ok"}),
		update(agent.StreamEvent{Type: agent.StreamThinkingEnd, Content: "hmm ok"}),
		update(agent.StreamEvent{Type: agent.StreamTextStart, ContentIndex: 1}),
		update(agent.StreamEvent{Type: agent.StreamTextDelta, ContentIndex: 1, Delta: "Let me "}),
		update(agent.StreamEvent{Type: agent.StreamTextDelta, ContentIndex: 1, Delta: "check.\x07"}),
		update(agent.StreamEvent{Type: agent.StreamTextEnd, ContentIndex: 1}),
		bus.AgentEvent{Type: "message_end", Message: &asst},
		// two tools in parallel: the second start breaks the first line
		bus.AgentEvent{Type: "tool_execution_start", ToolCallID: "a", ToolName: "calculator", Args: map[string]any{"expression": "1+1"}},
		bus.AgentEvent{Type: "tool_execution_start", ToolCallID: "b", ToolName: "calculator", Args: map[string]any{"expression": "1/0"}},
		bus.AgentEvent{Type: "tool_execution_end", ToolCallID: "b", ToolName: "calculator", IsError: &isErr, Result: &agent.ToolResult{Content: []agent.Content{agent.Text("division by zero\nmore")}}},
		bus.AgentEvent{Type: "tool_execution_end", ToolCallID: "a", ToolName: "calculator", IsError: &notErr, Result: &agent.ToolResult{Content: []agent.Content{agent.Text("2")}}},
		bus.AgentEvent{Type: "turn_end"},
		bus.AgentEvent{Type: "turn_start"},
		bus.AgentEvent{Type: "message_end", Message: &steer},
		bus.AgentEvent{Type: "tool_execution_start", ToolCallID: "c", ToolName: "sleep", Args: map[string]any{"seconds": 1}},
		bus.AgentEvent{Type: "tool_execution_end", ToolCallID: "c", ToolName: "sleep", IsError: &notErr, Result: &agent.ToolResult{Content: []agent.Content{agent.Text("slept 1s")}}},
		bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusFailed, Reason: "max_turns", Error: "limit", Turns: 2,
			Usage: agent.Usage{Input: 1000, Output: 234, TotalTokens: 1234}, Cost: 0.0012, DurationMs: 2310},
	}
	render := func(colour, hide bool) string {
		var b bytes.Buffer
		r := newRenderer(&b, style{on: colour})
		r.hideThinking = hide
		for i, ev := range events {
			ctl := uint64(0)
			if ev, ok := ev.(bus.AgentEvent); ok && ev.Message == &steer {
				ctl = 7
			}
			if err := r.Render(envelope(t, uint64(i+1), ctl, ev)); err != nil {
				t.Fatal(err)
			}
		}
		return b.String()
	}
	want := `● run r1 · queue default · worker w1 · faux/x · tools calculator
! DEMO
[thinking] hmm ok
Let me check.
⚙ calculator {"expression":"1+1"}
⚙ calculator {"expression":"1/0"} → error: division by zero …
  ↳ calculator → ok: 2
── turn 2 ──
» you: steer [31mred[0m
⚙ sleep {"seconds":1} → ok: slept 1s
✗ failed (max_turns): limit · 2 turns · 1,234 tokens (1,000 in, 234 out) · $0.0012 · 2.3s
`
	if got := render(false, false); got != want {
		t.Errorf("plain view:\n%s\nwant:\n%s", got, want)
	}
	hidden := render(false, true)
	if strings.Contains(hidden, "hmm") || !strings.Contains(hidden, "Let me check.") {
		t.Errorf("--hide-thinking:\n%s", hidden)
	}
	col := render(true, false)
	// Thinking is labelled and dim italic: the header and hints are dim.
	if !strings.Contains(col, "\x1b[36m[thinking]\x1b[0m \x1b[2;3mhmm ok\x1b[0m") || !strings.Contains(col, "\x1b[31m✗ failed") {
		t.Errorf("colour view:\n%q", col)
	}
	if strings.Count(col, "\x1b[31mred") != 0 {
		t.Errorf("model text drove the terminal:\n%q", col)
	}
}

func TestClosingLine(t *testing.T) {
	for _, c := range []struct {
		f    bus.RunFinished
		want string
	}{
		{bus.RunFinished{Status: "succeeded", Turns: 1, DurationMs: 4}, "✓ succeeded · 1 turn · 0 tokens (0 in, 0 out) · $0 · 4ms"},
		{bus.RunFinished{Status: "aborted", Error: "enough", Turns: 3, Cost: 1.5, DurationMs: 61000}, "■ aborted: enough · 3 turns · 0 tokens (0 in, 0 out) · $1.50 · 1m1s"},
	} {
		if got := closingLine(style{}, &c.f); got != c.want {
			t.Errorf("got %q want %q", got, c.want)
		}
	}
}

func TestParseInput(t *testing.T) {
	for _, c := range []struct{ in, kind, text string }{
		{"use metric", bus.KindSteer, "use metric"},
		{"  /abort ", bus.KindAbort, ""},
		{"/followup and then?", bus.KindFollowUp, "and then?"},
		{"//etc/hosts", bus.KindSteer, "/etc/hosts"},
		{"", "", ""},
	} {
		kind, text, err := parseInput(c.in)
		if err != nil || kind != c.kind || text != c.text {
			t.Errorf("%q: %q %q %v", c.in, kind, text, err)
		}
	}
	for _, bad := range []string{"/followup", "/quit"} {
		if _, _, err := parseInput(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestArgumentParsing(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	reason := fs.String("reason", "", "")
	pos, err := parseArgs(fs, []string{"r1", "--reason", "why", "more", "--", "--not-a-flag"})
	if err != nil || *reason != "why" || !reflect.DeepEqual(pos, []string{"r1", "more", "--not-a-flag"}) {
		t.Errorf("parseArgs: %v %q %v", pos, *reason, err)
	}
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"status", "r1"}, 0},
		{[]string{"--nats", "nats://x", "status", "r1"}, 2},
		{[]string{"--json", "--queue", "q", "list"}, 3},
		{[]string{"--nats=nats://x", "follow"}, 1},
		{[]string{"--json"}, -1},
		{[]string{"--", "status"}, -1},
	} {
		if got := firstPositional(c.args); got != c.want {
			t.Errorf("firstPositional(%v) = %d, want %d", c.args, got, c.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(101-i)*time.Millisecond)
	}
	if got := summarize(s); got != (percentiles{P50: 50, P90: 90, P99: 99, Max: 100}) {
		t.Errorf("%+v", got)
	}
	if got := summarize(nil); got != (percentiles{}) {
		t.Errorf("empty: %+v", got)
	}
	if got := summarize([]time.Duration{1500 * time.Microsecond}); got.P50 != 1.5 || got.Max != 1.5 {
		t.Errorf("one: %+v", got)
	}
	if bar := progressBar(50, 100, 2, time.Second, 80); !strings.HasPrefix(bar, "[====================>") || !strings.Contains(bar, "50/100 runs · 50 runs/s · 2 failed") {
		t.Errorf("bar %q", bar)
	}
}

func TestEventTypes(t *testing.T) {
	for _, c := range []struct {
		ev       any
		typ, sub string
	}{
		{bus.RunStarted{Type: bus.EventRunStarted, Tools: []string{}}, "run_started", ""},
		{update(agent.StreamEvent{Type: agent.StreamTextDelta, Delta: `"type":"x"`}), "message_update", "text_delta"},
		{bus.RunFinished{Type: bus.EventRunFinished, Status: "failed", Reason: "timeout"}, "run_finished", ""},
	} {
		env := envelope(t, 1, 0, c.ev)
		data, _ := json.Marshal(env)
		typ, sub := eventTypes(data)
		if typ != c.typ || sub != c.sub {
			t.Errorf("%s: %q %q", data, typ, sub)
		}
	}
	// Another field order falls back to decoding.
	typ, sub := eventTypes([]byte(`{"event":{"assistantMessageEvent":{"type":"text_delta"},"type":"message_update"},"run":"r","seq":1,"attempt":1}`))
	if typ != "message_update" || sub != "text_delta" {
		t.Errorf("fallback: %q %q", typ, sub)
	}
	st, reason := finishedStatus(mustJSON(t, envelope(t, 9, 0, bus.RunFinished{Type: bus.EventRunFinished, Status: "failed", Reason: "timeout"})))
	if st != "failed" || reason != "timeout" {
		t.Errorf("finishedStatus %q %q", st, reason)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSanitizeAndCut(t *testing.T) {
	if got := sanitize("a\x1b[2Jb\rc\td\n\u009be"); got != "a[2Jbc\td\ne" {
		t.Errorf("%q", got)
	}
	if got := cut("héllo wörld", 6); got != "héllo…" {
		t.Errorf("%q", got)
	}
	if got := oneLine("  first\nsecond"); got != "first …" {
		t.Errorf("%q", got)
	}
	if got := thousands(1234567); got != "1,234,567" {
		t.Errorf("%q", got)
	}
}

// testEnv is an in-process environment: no terminal, buffers for output.
func testEnv(stdin string) (*env, *bytes.Buffer, *bytes.Buffer) {
	var out, errOut bytes.Buffer
	return &env{
		stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut,
		getenv: func(k string) string {
			if k == "NATS_URL" {
				return fleet.url
			}
			return ""
		},
		interrupts: make(chan os.Signal),
	}, &out, &errOut
}

// TestInProcess runs the CLI in the test process (under the race detector
// and goleak): a followed run, a bench, usage and connection errors.
func TestInProcess(t *testing.T) {
	e, out, errOut := testEnv("")
	if code := run(ctx(t), []string{"--request", request(t, toolRun), "in process"}, e); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	expect(t, out.String(), "⚙ calculator", "The answer is 42.", "✓ succeeded")

	e, out, errOut = testEnv("")
	if code := run(ctx(t), []string{"bench", "--runs", "12", "--concurrency", "3", "--deltas", "3", "--json"}, e); code != 0 {
		t.Fatalf("bench: exit %d\n%s\n%s", code, out, errOut)
	}
	var res benchResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.Runs != 12 || res.Failed != 0 || res.StartLatencyMs.P50 <= 0 {
		t.Errorf("bench: %v %+v", err, res)
	}

	e, _, errOut = testEnv("")
	if code := run(ctx(t), []string{"list", "--state", "nope"}, e); code != 2 || !strings.Contains(errOut.String(), "--state") {
		t.Errorf("bad state: exit %d %s", code, errOut)
	}
	e, _, errOut = testEnv("")
	if code := run(ctx(t), []string{"--nats", "nats://127.0.0.1:1", "status", "r1"}, e); code != 4 || !strings.Contains(errOut.String(), "\n  worker\n") {
		t.Errorf("unreachable: exit %d %s", code, errOut)
	}
	// The interactive seam: lines on stdin steer when stdin and stdout
	// are terminals.
	e, _, errOut = testEnv("")
	view := newOutBuf()
	pr, pw := io.Pipe()
	e.stdin, e.stdout, e.stdinTTY, e.stdoutTTY = pr, view, true, true
	done := make(chan int, 1)
	go func() {
		done <- run(ctx(t), []string{"--no-color", "--request", request(t, sleepRun(30, "never")), "seam"}, e)
	}()
	view.waitFor(t, "⚙ sleep", 30*time.Second)
	_, _ = pw.Write([]byte("/abort\n"))
	if code := <-done; code != 3 {
		t.Errorf("exit %d\n%s\n%s", code, view, errOut)
	}
	pw.Close()
	expect(t, clean(view.String()), "type a line to steer", "→ abort sent", "■ aborted")
}

// A running record whose worker stopped heartbeating is shown as stale.
func TestStaleRecordShown(t *testing.T) {
	rec := bus.RunRecord{ID: "r1", State: bus.StateRunning, Queue: "default", Stale: true,
		HeartbeatAt: time.Now().Add(-10 * time.Minute), StartedAt: time.Now().Add(-11 * time.Minute)}
	e, out, _ := testEnv("")
	writeList(e, []bus.RunRecord{rec})
	if !strings.Contains(out.String(), "running (stale)") {
		t.Fatalf("list:\n%s", out.String())
	}
	e, out, _ = testEnv("")
	writeRecord(e, style{}, &rec)
	if !strings.Contains(out.String(), "stale: no heartbeat since 10m") {
		t.Fatalf("status:\n%s", out.String())
	}
	if !contains(listStates, bus.StateStale) {
		t.Fatal("--state stale is refused")
	}
}

// A record's fields come from the wire: terminal escapes and line breaks in
// them must neither drive the terminal nor forge rows.
func TestStatusAndListAreInertToEscapes(t *testing.T) {
	evil := "gpt\x1b]0;owned\x07\x1b[2J\nr9\tsucceeded"
	rec := bus.RunRecord{ID: "r1", State: bus.StatusFailed, Reason: "model_error", Queue: "q\x1b[31m", Model: evil,
		Worker: "w\x1b[H", Error: "boom\x1b[2J\nforged row", Metadata: map[string]string{"k\x1b[1m": "v\nx"},
		StartedAt: time.Now(), FinishedAt: time.Now()}
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	writeRecord(e, style{}, &rec)
	writeList(e, []bus.RunRecord{rec})
	got := out.String()
	if strings.ContainsAny(got, "\x1b\x07") {
		t.Fatalf("escape reached the terminal: %q", got)
	}
	for _, line := range strings.Split(strings.TrimSpace(got), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "r9") || strings.HasPrefix(strings.TrimSpace(line), "forged") {
			t.Fatalf("a value forged a line: %q in %q", line, got)
		}
	}
	var b bytes.Buffer
	r := newRenderer(&b, style{})
	m := bus.ModelRef{Provider: "openai", ID: evil}
	if err := r.Render(envelope(t, 1, 0, bus.RunStarted{Type: bus.EventRunStarted, Queue: "default", Worker: "w1", Model: &m})); err != nil {
		t.Fatal(err)
	}
	if s := b.String(); strings.ContainsAny(s, "\x1b\x07") || strings.Count(s, "\n") != 1 {
		t.Fatalf("banner not inert: %q", s)
	}
}

func TestCPUBetween(t *testing.T) {
	t0 := time.Now()
	c := cpuBetween(cpuMark{wall: t0, cpu: time.Second, ok: true}, cpuMark{wall: t0.Add(2 * time.Second), cpu: 1500 * time.Millisecond, ok: true})
	if c.CPUCores == nil || *c.CPUCores != 0.25 || *c.CPUSeconds != 0.5 {
		t.Fatalf("500 ms of CPU in 2 s: %s", cpuLine(c))
	}
	if got := cpuLine(c); got != "0.250 of a core, 0.5000 s (this process)" {
		t.Errorf("line %q", got)
	}
	for _, m := range []cpuMark{{wall: t0.Add(time.Second)}, {wall: t0, ok: true}} {
		c := cpuBetween(cpuMark{wall: t0, ok: true}, m)
		if c.CPUCores != nil || c.CPUSeconds != nil {
			t.Errorf("%+v: want nothing (not measured, or no time passed)", m)
		}
		if got := cpuLine(c); got != "not measured on this system" {
			t.Errorf("line %q", got)
		}
		if b, _ := json.Marshal(benchResult{benchCPU: c}); strings.Contains(string(b), "cpu") {
			t.Errorf("unmeasured CPU in the JSON: %s", b)
		}
	}
}

// The reader counts this process's CPU, not the time passed: 200 ms
// asleep use little, 200 ms spinning use some. No other test of the
// package runs beside it (the parallel ones wait for the sequential
// ones), and the bounds hold on a loaded machine.
func TestProcessCPUCountsThisProcess(t *testing.T) {
	if _, ok := processCPU(); !ok {
		t.Skip("no CPU time on this system")
	}
	a := markCPU(time.Now())
	time.Sleep(200 * time.Millisecond)
	b := markCPU(time.Now())
	for time.Since(b.wall) < 200*time.Millisecond {
	}
	c := markCPU(time.Now())
	asleep, spinning := cpuBetween(a, b), cpuBetween(b, c)
	if *asleep.CPUCores > 0.5 {
		t.Errorf("asleep: %s, want little", cpuLine(asleep))
	}
	if *spinning.CPUSeconds <= 0 || *spinning.CPUCores > float64(runtime.NumCPU()) {
		t.Errorf("spinning: %s", cpuLine(spinning))
	}
	if *spinning.CPUSeconds <= *asleep.CPUSeconds {
		t.Errorf("spinning used %s, asleep %s", cpuLine(spinning), cpuLine(asleep))
	}
}

// --help prints a command's usage once, on stdout, with no hint to run
// --help; a bad flag still gets the hint on stderr.
func TestCommandHelpPrintsUsageOnce(t *testing.T) {
	for _, args := range [][]string{{"status", "--help"}, {"hello", "--help"}, {"run", "-h"}, {"bench", "--help"}} {
		e, out, errOut := testEnv("")
		if code := run(t.Context(), args, e); code != 0 {
			t.Errorf("%v: exit %d", args, code)
		}
		if n := strings.Count(out.String(), "Usage: "); n != 1 || errOut.Len() != 0 {
			t.Errorf("%v: %d usage lines on stdout; stderr:\n%s", args, n, errOut)
		}
	}
	e, out, errOut := testEnv("")
	if code := run(t.Context(), []string{"status", "--bogus"}, e); code != 2 || out.Len() != 0 ||
		!strings.Contains(errOut.String(), "flag provided but not defined: -bogus") ||
		!strings.Contains(errOut.String(), "Run 'submit status --help' for its flags") {
		t.Errorf("bad flag: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// A bench running more at once than the fleet has slots says its latency
// is mostly queueing; one that fits says nothing.
func TestBenchSaysWhenLatencyIsQueueing(t *testing.T) {
	e, out, errOut := testEnv("")
	if code := run(t.Context(), []string{"bench", "--runs", "4", "--concurrency", "100000", "--deltas", "1"}, e); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	expect(t, out.String(), "note: --concurrency 100000 is more than the ", `slots of the `, `worker(s) on queue "default"`, "mostly that wait")
	e, out, errOut = testEnv("")
	if code := run(t.Context(), []string{"bench", "--runs", "2", "--concurrency", "1", "--deltas", "1", "--json"}, e); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if strings.Contains(out.String()+errOut.String(), "note:") {
		t.Errorf("a note for a bench that fits:\n%s\n%s", out, errOut)
	}
}

// The example requests (README.md runs most of them) are valid requests.
func TestExampleRequestsAreValid(t *testing.T) {
	files, err := filepath.Glob("examples/*.json")
	if err != nil || len(files) < 4 {
		t.Fatalf("examples: %v %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var req bus.RunRequest
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		req.Prompt = "p"
		if err := req.Validate(""); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
