package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/freeport"
)

// Faux scripts (run requests) the tests submit.
const (
	toolRun = `{"model":"faux/x","tools":["calculator"],"faux":{"responses":[
 {"content":[{"type":"thinking","thinking":"I should use the calculator."},{"type":"toolCall","id":"c1","name":"calculator","arguments":{"expression":"6*7"}}],"stopReason":"toolUse"},
 {"content":[{"type":"text","text":"The answer is 42."}]}]}}`
	failRun = `{"model":"faux/x","faux":{"responses":[{"content":[],"stopReason":"error","errorMessage":"upstream exploded"}]}}`
)

// sleepRun sleeps in a tool, then answers with each text in turn.
func sleepRun(seconds float64, texts ...string) string {
	resps := []string{fmt.Sprintf(`{"content":[{"type":"toolCall","id":"s1","name":"sleep","arguments":{"seconds":%g}}],"stopReason":"toolUse"}`, seconds)}
	for _, t := range texts {
		resps = append(resps, fmt.Sprintf(`{"content":[{"type":"text","text":%q}]}`, t))
	}
	return `{"model":"faux/x","tools":["sleep"],"faux":{"responses":[` + strings.Join(resps, ",") + `]}}`
}

func expect(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func TestSucceededRunFollowReplayResultStatusList(t *testing.T) {
	t.Parallel()
	id := "t-ok-" + bus.NewRunID()[:8]
	out, errOut, code := submit(t, "--id", id, "--request", request(t, toolRun), "What is 6*7?")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	expect(t, out, "run "+id, "queue default", "faux/x",
		"[thinking] I should use the calculator.",
		`⚙ calculator {"expression":"6*7"} → ok: 42`,
		"── turn 2 ──", "The answer is 42.",
		"✓ succeeded · 2 turns · ", " tokens (", " · $0 · ")
	if strings.Contains(out, "\x1b[") {
		t.Errorf("colours on a pipe:\n%q", out)
	}
	if last := lastLine(out); !strings.HasPrefix(last, "✓ succeeded") {
		t.Errorf("last line %q", last)
	}

	// follow after the end replays the same view (plus the prompt).
	replay, _, code := submit(t, "follow", id)
	if code != 0 {
		t.Fatalf("follow: exit %d", code)
	}
	if got := dropLines(replay, "» What is 6*7?"); got != out {
		t.Errorf("follow replay differs:\n--- submit\n%s\n--- follow\n%s", out, replay)
	}

	res, _, code := submit(t, "result", id)
	if code != 0 || res != "The answer is 42.\n" {
		t.Errorf("result: exit %d %q", code, res)
	}
	tr, _, code := submit(t, "result", "--transcript", id)
	if code != 0 {
		t.Errorf("result --transcript: exit %d", code)
	}
	expect(t, tr, "» user: What is 6*7?", `⚙ calculator {"expression":"6*7"}`, "↳ calculator → ok: 42", "assistant: The answer is 42.", "✓ succeeded")

	st, _, code := submit(t, "status", id)
	if code != 0 {
		t.Errorf("status: exit %d", code)
	}
	if !regexp.MustCompile(`(?m)^state\s+succeeded$`).MatchString(st) || !regexp.MustCompile(`(?m)^turns\s+2$`).MatchString(st) {
		t.Errorf("status:\n%s", st)
	}
	js, _, _ := submit(t, "status", "--json", id)
	var rec bus.RunRecord
	if err := json.Unmarshal([]byte(js), &rec); err != nil || rec.ID != id || rec.State != bus.StatusSucceeded {
		t.Errorf("status --json: %v %+v\n%s", err, rec, js)
	}

	list, _, code := submit(t, "list", "--limit", "0")
	if code != 0 || !strings.HasPrefix(list, "RUN ") || !regexp.MustCompile(`(?m)^`+id+`\s+succeeded\s+default\s+faux/x\s+2\s`).MatchString(list) {
		t.Errorf("list: exit %d\n%s", code, list)
	}
	lj, _, code := submit(t, "list", "--state", "succeeded", "--limit", "0", "--json")
	var recs []bus.RunRecord
	if err := json.Unmarshal([]byte(lj), &recs); err != nil || code != 0 {
		t.Fatalf("list --json: exit %d %v\n%s", code, err, lj)
	}
	found := false
	for _, r := range recs {
		found = found || r.ID == id
		if r.State != bus.StatusSucceeded {
			t.Errorf("list --state succeeded gave %s %s", r.ID, r.State)
		}
	}
	if !found {
		t.Errorf("list --json lacks %s", id)
	}
	if since, _, code := submit(t, "list", "--since", "1h", "--limit", "0"); code != 0 || !strings.Contains(since, id) {
		t.Errorf("list --since 1h: exit %d\n%s", code, since)
	}
	if before, _, code := submit(t, "list", "--before", id, "--limit", "0"); code != 0 || strings.Contains(before, id) {
		t.Errorf("list --before %s: exit %d\n%s", id, code, before)
	}
	one, _, _ := submit(t, "list", "--limit", "1")
	if n := len(strings.Split(strings.TrimSpace(one), "\n")); n != 2 {
		t.Errorf("list --limit 1 printed %d lines:\n%s", n, one)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func dropLines(s, line string) string {
	return strings.Replace(s, line+"\n", "", 1)
}

func TestFailedRun(t *testing.T) {
	t.Parallel()
	out, errOut, code := submit(t, "--request", request(t, failRun), "fail please")
	if code != 1 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	expect(t, out, "✗ model error: upstream exploded", "✗ failed (model_error): upstream exploded · 1 turn")
}

func TestAbortedRun(t *testing.T) {
	t.Parallel()
	id := "t-abort-" + bus.NewRunID()[:8]
	p := start(t, nil, "--id", id, "--request", request(t, sleepRun(30, "never")), "sleep a while")
	p.stdout.waitFor(t, `⚙ sleep {"seconds":30}`, 30*time.Second)
	out, errOut, code := submit(t, "abort", id, "--reason", "changed my mind")
	if code != 0 {
		t.Fatalf("abort: exit %d\n%s\n%s", code, out, errOut)
	}
	expect(t, out, "abort sent to run "+id, "■ aborted: changed my mind")
	if code := p.wait(t); code != 3 {
		t.Fatalf("followed run: exit %d\n%s", code, p.stdout)
	}
	expect(t, p.stdout.String(), "→ error", "■ aborted: changed my mind · ")
	// A finished run takes no more control messages.
	_, errOut, code = submit(t, "steer", id, "too late")
	if code != 1 || !strings.Contains(errOut, "has finished") {
		t.Errorf("steer after the end: exit %d %s", code, errOut)
	}
}

func TestJSONIsNDJSONOfEnvelopes(t *testing.T) {
	t.Parallel()
	out, _, code := submit(t, "--json", "--request", request(t, toolRun), "json please")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	var types []string
	var seq uint64
	for sc.Scan() {
		env, err := bus.DecodeEnvelope(sc.Bytes())
		if err != nil {
			t.Fatalf("not an envelope: %v\n%s", err, sc.Text())
		}
		if env.Seq != seq+1 {
			t.Errorf("seq %d after %d", env.Seq, seq)
		}
		seq = env.Seq
		types = append(types, env.Type)
	}
	if len(types) < 10 || types[0] != bus.EventRunStarted || types[len(types)-1] != bus.EventRunFinished {
		t.Fatalf("types %v", types)
	}
}

func TestSteerFromAnotherCommand(t *testing.T) {
	t.Parallel()
	id := "t-steer-" + bus.NewRunID()[:8]
	p := start(t, nil, "--id", id, "--request", request(t, sleepRun(2, "steered answer", "unused")), "start")
	p.stdout.waitFor(t, "⚙ sleep", 30*time.Second)
	out, errOut, code := submit(t, "steer", "--key", "k1", id, "use", "metric", "units")
	if code != 0 || !strings.Contains(out, "steering sent to run "+id) {
		t.Fatalf("steer: exit %d\n%s\n%s", code, out, errOut)
	}
	// Run again with its key (a retry after an error): not sent twice.
	again, errOut, code := submit(t, "steer", "--key", "k1", id, "use", "metric", "units")
	if code != 0 || again != out {
		t.Fatalf("steer again with its key: exit %d\n%s\n%s\nfirst: %s", code, again, errOut, out)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.stdout)
	}
	o := p.stdout.String()
	expect(t, o, "» you: use metric units", "steered answer", "✓ succeeded")
	if n := strings.Count(o, "» you: use metric units"); n != 1 {
		t.Errorf("the steer shown %d times:\n%s", n, o)
	}
	if strings.Index(o, "» you: use metric units") > strings.Index(o, "steered answer") {
		t.Errorf("steering shown after the answer:\n%s", o)
	}
}

// A queue nobody declared is refused at once, naming the fix.
func TestUndeclaredQueueIsRefused(t *testing.T) {
	t.Parallel()
	_, errOut, code := submit(t, "--queue", "undeclared", "--detach", "hello?")
	if code != 1 || !strings.Contains(errOut, `no worker has declared queue "undeclared"`) || !strings.Contains(errOut, "--queue undeclared") {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
}

func TestNoWorkerNoticeAndCtrlCDetaches(t *testing.T) {
	t.Parallel()
	// The queue is declared (as an operator does for scale from zero) but
	// no worker ever served it.
	c := fleettest.Connect(t, fleet.url)
	ctx := fleettest.Context(t)
	s, err := c.JetStream().Stream(ctx, c.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Subjects = append(cfg.Subjects, c.Names().SubmitFilter("nobody"))
	if _, err := c.JetStream().UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	id := "t-queued-" + bus.NewRunID()[:8]
	p := start(t, nil, "--queue", "nobody", "--id", id, "--notice-after", "200ms", "hello?")
	p.stderr.waitFor(t, `no worker has picked up run `+id, 30*time.Second)
	expect(t, clean(p.stderr.String()), `(queue "nobody")`, "no worker has ever served this queue", "Start one: worker --queue nobody", "still waiting")
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 130 {
		t.Fatalf("exit %d\n%s", code, p.stderr)
	}
	expect(t, p.stderr.String(), "detached from run "+id, "submit follow "+id, "submit abort "+id)
	st, _, code := submit(t, "status", id)
	if code != 0 || !regexp.MustCompile(`(?m)^state\s+queued$`).MatchString(st) {
		t.Errorf("status: exit %d\n%s", code, st)
	}
	q, _, _ := submit(t, "list", "--state", "queued", "--limit", "0")
	if !strings.Contains(q, id) {
		t.Errorf("list --state queued lacks %s:\n%s", id, q)
	}
	out, _, code := submit(t, "abort", "--wait", "0", id)
	if code != 0 || !strings.Contains(out, "abort sent") {
		t.Errorf("abort of a queued run: exit %d %s", code, out)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--bogus", "hi"},
		{"list", "--state", "bogus"},
		{"list", "--limit", "x"},
		{"steer"},
		{"steer", "r1"},
		{"status", "bad.id"},
		{"follow"},
		{"--tools"},
		{"--model", "nomodel", "hi"},
		{"--temperature", "3", "hi"},
		{"bench", "--runs", "0"},
	} {
		_, errOut, code := submit(t, args...)
		if code != 2 {
			t.Errorf("submit %v: exit %d, want 2\n%s", args, code, errOut)
		}
		if errOut == "" {
			t.Errorf("submit %v: no message", args)
		}
	}
	_, errOut, code := submit(t)
	if code != 2 || !strings.Contains(errOut, "Usage:") {
		t.Errorf("no arguments: exit %d\n%s", code, errOut)
	}
	out, _, code := submit(t, "--help")
	if code != 0 || !strings.Contains(out, "Exit codes") {
		t.Errorf("--help: exit %d\n%s", code, out)
	}
	out, _, code = submit(t, "bench", "--help")
	if code != 0 || !strings.Contains(out, "-concurrency") {
		t.Errorf("bench --help: exit %d\n%s", code, out)
	}
}

func TestUnreachableNATS(t *testing.T) {
	t.Parallel()
	url := fmt.Sprintf("nats://127.0.0.1:%d", freeport.Pick(t)) // a port nobody listens on
	for _, args := range [][]string{{"--nats", url, "hello"}, {"status", "--nats", url, "r1"}, {"--nats", url, "list"}, {"bench", "--nats", url}} {
		_, errOut, code := submit(t, args...)
		if code != 4 {
			t.Errorf("%v: exit %d, want 4\n%s", args, code, errOut)
		}
		expect(t, errOut, "cannot reach NATS at "+url, "\n  worker\n")
	}
}

func TestNoSuchRun(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"status", "nope-nope"}, {"follow", "nope-nope"}, {"steer", "nope-nope", "x"}, {"abort", "nope-nope"}, {"result", "nope-nope"}} {
		_, errOut, code := submit(t, args...)
		if code != 1 || !strings.Contains(errOut, "no such run: nope-nope") {
			t.Errorf("%v: exit %d, want 1\n%s", args, code, errOut)
		}
	}
}

// A finished run whose events are no longer stored (past the events
// stream's max age or byte limit) while its record remains: follow says
// so and exits 1 instead of waiting for ever.
func TestFollowFinishedRunWithoutEvents(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := "gone-" + bus.NewRunID()[:12]
	b, _ := json.Marshal(bus.RunRecord{ID: id, Queue: "default", State: bus.StatusSucceeded, Attempt: 1})
	if _, err := kv.Put(ctx, id, b); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := submit(t, "follow", id)
	want := "submit: follow " + id + ": run finished (succeeded) but its events are no longer stored; its record remains: submit status " + id
	if code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("follow: exit %d, want 1 and %q\n%s", code, want, errOut)
	}
}

func TestReplyContinuesTheConversation(t *testing.T) {
	t.Parallel()
	first, _, code := submit(t, "--detach", "--request", request(t, toolRun), "What is 6*7?")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	first = strings.TrimSpace(first)
	if _, _, code := submit(t, "result", first); code != 0 {
		t.Fatalf("first run: exit %d", code)
	}
	id := "t-reply-" + bus.NewRunID()[:8]
	reply := `{"model":"faux/x","faux":{"responses":[{"content":[{"type":"text","text":"Doubled, it is 84."}]}]}}`
	out, errOut, code := submit(t, "reply", first, "--id", id, "--request", request(t, reply), "And doubled?")
	if code != 0 {
		t.Fatalf("reply: exit %d\n%s\n%s", code, out, errOut)
	}
	// The restored messages are named, not shown again (since 1.9).
	expect(t, out, "continues "+first, "continued from "+first+" (", "Doubled, it is 84.", "✓ succeeded")
	if strings.Contains(out, "The answer is 42.") {
		t.Errorf("the reply showed the continued run's messages again:\n%s", out)
	}
	tr, _, _ := submit(t, "result", "--transcript", id)
	expect(t, tr, "» user: What is 6*7?", "The answer is 42.", "» user: And doubled?", "Doubled, it is 84.")
}

func TestPromptFromStdinWithTheDemoModel(t *testing.T) {
	t.Parallel()
	out, errOut, code := submitIn(t, strings.NewReader("piped prompt\n"), "-")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	expect(t, out, "! DEMO MODEL", "You said: piped prompt", "✓ succeeded")
	out, _, code = submitIn(t, strings.NewReader("from a file flag"), "--file", "-", "--hide-thinking")
	if code != 0 || !strings.Contains(out, "You said: from a file flag") {
		t.Errorf("--file -: exit %d\n%s", code, out)
	}
}

func TestBenchSmall(t *testing.T) {
	t.Parallel()
	out, errOut, code := submit(t, "bench", "--runs", "20", "--concurrency", "4", "--deltas", "5", "--tools", "1", "--json")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	for _, k := range []string{"runs", "failed", "seconds", "runsPerSec", "eventsPerSec", "startLatencyMs", "firstDeltaLatencyMs"} {
		if _, ok := res[k]; !ok {
			t.Errorf("no %s in %s", k, out)
		}
	}
	if res["runs"] != 20.0 || res["failed"] != 0.0 {
		t.Errorf("runs/failed: %s", out)
	}
	cores, _ := res["cpuCores"].(float64)
	cpuSecs, _ := res["cpuSeconds"].(float64)
	secs, _ := res["seconds"].(float64)
	checkBenchCPU(t, cores, cpuSecs, secs)
	for _, k := range []string{"startLatencyMs", "firstDeltaLatencyMs"} {
		p, _ := res[k].(map[string]any)
		for _, q := range []string{"p50", "p90", "p99", "max"} {
			if v, ok := p[q].(float64); !ok || v <= 0 {
				t.Errorf("%s.%s = %v", k, q, p[q])
			}
		}
	}
	t.Logf("bench: %s", out)
	table, _, code := submit(t, "bench", "--runs", "10", "--concurrency", "2", "--rate", "200")
	if code != 0 {
		t.Fatalf("bench table: exit %d", code)
	}
	expect(t, table, "runs/s", "events/s", "bench CPU", "submit->run_started", "submit->first delta", "p99", "200 runs/s offered")
	t.Logf("bench table:\n%s", table)
}

func TestStreamingBenchSmall(t *testing.T) {
	t.Parallel()
	out, errOut, code := submit(t, "bench", "--streaming", "--concurrency", "5", "--deltas-per-second", "20", "--duration", "2s", "--json")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	var res struct {
		Runs, Failed, Gaps, Duplicates, Dropped, Events                int
		EventsPerSec, WindowSeconds, RampSeconds, CPUCores, CPUSeconds float64
		DelayMs                                                        struct{ P50, P99, Max float64 }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// 40 deltas a run plus the run's other events, none lost.
	if res.Runs != 5 || res.Failed+res.Gaps+res.Duplicates+res.Dropped != 0 || res.Events < 5*40 || res.EventsPerSec <= 0 {
		t.Errorf("result %s", out)
	}
	if res.WindowSeconds <= 0 || res.RampSeconds <= 0 || res.DelayMs.P50 > res.DelayMs.P99 || res.DelayMs.P99 > res.DelayMs.Max {
		t.Errorf("window, ramp or delays: %s", out)
	}
	// The CPU is the window's, as events/s are.
	checkBenchCPU(t, res.CPUCores, res.CPUSeconds, res.WindowSeconds)
}

// checkBenchCPU checks a bench's own CPU: some was used, no more than the
// machine has, and cores are the CPU seconds over the measured window
// (to the fields' rounding).
func checkBenchCPU(t *testing.T, cores, cpuSecs, window float64) {
	t.Helper()
	if _, ok := processCPU(); !ok {
		return // not measured here
	}
	if cpuSecs <= 0 || cores > float64(runtime.NumCPU()) {
		t.Errorf("cpuCores %v, cpuSeconds %v: the bench's own CPU", cores, cpuSecs)
	}
	if d := cores*window - cpuSecs; d > 0.001*window+0.001 || d < -(0.001*window+0.001) {
		t.Errorf("cpuCores %v over %v s is not cpuSeconds %v: not the same window", cores, window, cpuSecs)
	}
}

// TestCtrlCWithAbortOnInterrupt: the first Ctrl-C aborts the run.
func TestCtrlCAbortOnInterrupt(t *testing.T) {
	t.Parallel()
	p := start(t, nil, "--abort-on-interrupt", "--request", request(t, sleepRun(30, "never")), "sleep")
	p.stdout.waitFor(t, "⚙ sleep", 30*time.Second)
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 3 {
		t.Fatalf("exit %d\n%s\n%s", code, p.stdout, p.stderr)
	}
	expect(t, p.stderr.String(), "aborting run")
	expect(t, p.stdout.String(), "■ aborted: interrupted (Ctrl-C)")
}
