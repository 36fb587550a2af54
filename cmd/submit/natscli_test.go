package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
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

// TestProtocolDocNATSCLI runs docs/protocol.md's nats CLI examples of
// what a client written from the doc alone needs (a reader's check): each
// block as written, with its run ids made unique, against the test fleet,
// and each gives what the doc says. It needs the nats CLI and jq.
//
// Not parallel: it declares a queue no worker serves (an update of the
// runs stream that must not race the parallel tests' updates).
func TestProtocolDocNATSCLI(t *testing.T) {
	path := natsCLIPath(t)
	if _, err := exec.LookPath("jq"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no jq on the PATH: .ci/run installs it")
		}
		t.Skip("no jq on the PATH (apt-get install jq)")
	}
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	// block returns the command lines of the one sh block holding marker,
	// and the text of the next block after it.
	block := func(marker string, n int) (lines []string, next string) {
		t.Helper()
		re := regexp.MustCompile("(?s)```sh\n(.*?)```")
		var found [][]int
		for _, m := range re.FindAllStringSubmatchIndex(doc, -1) {
			if strings.Contains(doc[m[2]:m[3]], marker) {
				found = append(found, m)
			}
		}
		if len(found) != 1 {
			t.Fatalf("docs/protocol.md has %d sh blocks with %q, want 1", len(found), marker)
		}
		for _, l := range strings.Split(doc[found[0][2]:found[0][3]], "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		if len(lines) != n {
			t.Fatalf("the block with %q has %d lines, want %d: teach this test about them\n%q", marker, len(lines), n, lines)
		}
		if m := regexp.MustCompile("(?s)```[a-z]*\n(.*?)```").FindStringSubmatch(doc[found[0][1]:]); m != nil {
			next = strings.TrimSpace(m[1])
		}
		return lines, next
	}
	c := testClient(t)
	home := t.TempDir()
	sh := func(line string, ids map[string]string, wantOK bool, want ...string) string {
		t.Helper()
		for from, to := range ids {
			line = regexp.MustCompile(`\b`+regexp.QuoteMeta(from)+`\b`).ReplaceAllString(line, to)
		}
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", line)
		cmd.Env = []string{"PATH=" + path, "HOME=" + home, "NATS_URL=" + fleet.url}
		out, err := cmd.CombinedOutput()
		if (err == nil) != wantOK {
			t.Fatalf("%s: %v (want success %v)\n%s", line, err, wantOK, out)
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s: no %q in\n%s", line, w, out)
			}
		}
		return string(out)
	}
	unique := func(prefix string) string { return prefix + bus.NewRunID()[:10] }

	// §2: an undeclared queue, told apart from JetStream being away.
	lines, _ := block("agents.submit.nosuchqueue.r1", 3)
	sh(lines[0], map[string]string{"r1": unique("doc-q-")}, false, "no responders")
	sh(lines[1], nil, true, `"agents.submit.default.*"`)
	sh(lines[2], nil, true, "io.nats.jetstream.api.v1.account_info_response")

	// §2: a finished run's transcript snapshot (since 1.9).
	snap := map[string]string{"r1": unique("doc-snap-")}
	if _, err := c.SubmitRaw(ctx(t), "", snap["r1"], []byte(`{"prompt":"hi","model":"faux/x","faux":{"responses":[{"content":[{"type":"text","text":"hello"}]}]}}`)); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, snap["r1"], bus.EventRunFinished, "")
	lines, _ = block("nats object info agents_transcripts", 3)
	sh(lines[0], nil, true, "agents_transcripts")
	sh(lines[0], nil, true, "JetStream Stream: OBJ_agents_transcripts", "TTL: 7d0h0m0s")
	sh(lines[1], snap, true, "Chunks: 1", "attempt: 1", "messages: 2", "run: "+snap["r1"])
	sh(lines[2], snap, true, "\"user\"\n\"assistant\"")

	// §3: a bad request lists an unknown field beside the other problems.
	bad := unique("doc-bad-")
	lines, want := block("agents.submit.default.r-bad", 2)
	sh(lines[0], map[string]string{"r-bad": bad}, true)
	waitEvent(t, c, bad, bus.EventRunFinished, "")
	if got := strings.TrimSpace(sh(lines[1], map[string]string{"r-bad": bad}, true)); got != want {
		t.Errorf("the bad request's error:\n%s\nthe doc says:\n%s", got, want)
	}

	// §3: the demo model calls the calculator for arithmetic.
	demo := unique("doc-demo-")
	lines, _ = block(`"model":"faux/demo"`, 2)
	sh(lines[0], map[string]string{"f1": demo}, true)
	waitEvent(t, c, demo, bus.EventRunFinished, "")
	sh(lines[1], map[string]string{"f1": demo}, true,
		`{"role":"assistant","content":[{"type":"text","text":"Let me compute that."},{"type":"toolCall","id":"demo-calc-1","name":"calculator","arguments":{"expression":"6*7"}}]}`,
		`{"role":"assistant","content":[{"type":"text","text":"The calculator says: 42"}]}`)

	// §4: a run that does not exist has no request, no record, no event;
	// a finished one has its record and events.
	lines, _ = block("--last-for 'agents.submit.*.r1'", 3)
	nobody := map[string]string{"r1": unique("doc-nobody-")}
	sh(lines[0], nobody, false, "no message found (10037)")
	sh(lines[1], nobody, false, "nats: key not found")
	sh(lines[2], nobody, false, "no message found (10037)")
	sh(lines[1], map[string]string{"r1": bad}, true, "failed")
	sh(lines[2], map[string]string{"r1": bad}, true, "run_finished")

	// §16: a run compacted by hand while its tool sleeps.
	long := map[string]string{"long1": unique("doc-compact-")}
	lines, want = block("agents.submit.default.long1", 3)
	sh(lines[0], long, true)
	waitEvent(t, c, long["long1"], string(agent.EventToolExecutionStart), "")
	sh(lines[1], long, true)
	waitEvent(t, c, long["long1"], bus.EventRunFinished, "")
	var got []string // the events, not the CLI's own line on stderr
	for _, l := range strings.Split(sh(lines[2], long, true), "\n") {
		if strings.HasPrefix(l, "{") {
			got = append(got, l)
		}
	}
	if strings.Join(got, "\n") != want {
		t.Errorf("the run's compactions:\n%s\nthe doc says:\n%s", strings.Join(got, "\n"), want)
	}

	// §6: a steer with an invalid body gets control_rejected on its run.
	live := map[string]string{"r1": unique("doc-live-")}
	if _, err := c.SubmitRaw(ctx(t), "", live["r1"], []byte(gatedRun(gateCalculator, calcCall, textReply("never")))); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, live["r1"], bus.EventToolApprovalRequested, "c1")
	lines, _ = block(`{"txt":"Use metric units."}`, 2)
	sh(lines[0], live, true)
	waitEvent(t, c, live["r1"], bus.EventControlRejected, "")
	rejected := regexp.MustCompile(`(?m)^\s*(\{"type":"control_rejected","kind":"steer","reason":"control message must.*"controlSeq":)\d+\}$`).FindStringSubmatch(doc)
	if rejected == nil {
		t.Fatal("docs/protocol.md shows no control_rejected of a steer")
	}
	sh(lines[1], live, true, rejected[1])

	// §6: an abort while a gated call waits: the call's error result, then
	// one more turn with an empty aborted message, counted in turns.
	lines, _ = block(`jq -c '.event | {type, stopReason: .message.stopReason, turns}'`, 2)
	sh(lines[0], live, true)
	waitEvent(t, c, live["r1"], bus.EventRunFinished, "")
	sh(lines[1], live, true, `{"type":"turn_start","stopReason":null,"turns":null}`+"\n"+
		`{"type":"message_start","stopReason":"aborted","turns":null}`+"\n"+
		`{"type":"message_end","stopReason":"aborted","turns":null}`,
		`{"type":"run_finished","stopReason":null,"turns":2}`)
	if text, isErr := toolResult(t, c, live["r1"], "c1"); !isErr || !strings.Contains(text, "stopped while waiting for approval") {
		t.Errorf("the waiting call's result: %q (error %v)", text, isErr)
	}

	// §7: a queued run's request, fetched with the message get API (on a
	// queue that is declared and that no worker serves).
	s, err := c.JetStream().Stream(ctx(t), c.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Subjects = append(cfg.Subjects, c.Names().SubmitFilter("docqueued"))
	if _, err := c.JetStream().UpdateStream(ctx(t), cfg); err != nil {
		t.Fatal(err)
	}
	queued := map[string]string{"r1": unique("doc-queued-")}
	body := `{"prompt":"hi"}`
	res, err := c.SubmitRaw(ctx(t), "docqueued", queued["r1"], []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.DeleteMsg(ctx(t), res.Seq) }()
	lines, _ = block(`'{"seq":1,"next_by_subj":"agents.submit.*.r1"}' --raw | jq -r .message.data`, 2)
	sh(lines[0], queued, true, fmt.Sprintf(`{"subject":"agents.submit.docqueued.%s","seq":%d,"time":"`, queued["r1"], res.Seq))
	sh(lines[1], queued, true, body)
	sh(lines[0], nobody, true, "null") // no request: no message
}

// docWalkthrough returns the nats CLI path and the non-empty lines of
// docs/protocol.md's sh blocks that contain marker, which must be want
// lines; without jq (or the nats CLI) the test skips, in CI it fails.
func docWalkthrough(t *testing.T, marker string, want int) (natsPath string, lines []string) {
	t.Helper()
	natsPath = natsCLIPath(t)
	if _, err := exec.LookPath("jq"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no jq on the PATH: .ci/run installs it")
		}
		t.Skip("no jq on the PATH (apt-get install jq)")
	}
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
		if strings.Contains(m[1], marker) {
			for _, l := range strings.Split(m[1], "\n") {
				if l = strings.TrimSpace(l); l != "" {
					lines = append(lines, l)
				}
			}
		}
	}
	if len(lines) != want {
		t.Fatalf("the walkthrough of %q has %d lines, want %d: %q", marker, len(lines), want, lines)
	}
	return natsPath, lines
}
