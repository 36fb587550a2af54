package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// scheduleRunsNow lists a schedule's runs with submit list --schedule.
func scheduleRunsNow(t *testing.T, name string) []bus.RunRecord {
	t.Helper()
	out, errOut, code := submit(t, "list", "--schedule", name, "--limit", "0", "--json")
	if code != 0 {
		t.Fatalf("list --schedule: exit %d\n%s", code, errOut)
	}
	var recs []bus.RunRecord
	if err := json.Unmarshal([]byte(out), &recs); err != nil {
		t.Fatalf("list --schedule --json: %v\n%s", err, out)
	}
	return recs
}

func TestScheduleCommands(t *testing.T) {
	t.Parallel()
	name := "cli-" + bus.NewRunID()[:8]
	req := request(t, `{"model":"faux/x","faux":{"responses":[{"content":[{"type":"text","text":"tick"}]}]}}`)

	// A time zone with @every is refused before anything is stored, with
	// every problem listed.
	_, errOut, code := submit(t, "schedule", "create", name, "--every", "1s", "--tz", "Europe/Berlin", "--overlap", "sometimes", "--request", req, "go")
	if code != exitUsage {
		t.Fatalf("--tz with --every: exit %d\n%s", code, errOut)
	}
	expect(t, errOut, "a time zone applies only to a cron schedule", `overlap "sometimes"`)

	out, errOut, code := submit(t, "schedule", "create", name, "--every", "1s", "--request", req, "go")
	if code != 0 {
		t.Fatalf("create: exit %d\n%s\n%s", code, out, errOut)
	}
	expect(t, out, "schedule "+name+" on queue default: @every 1s, next ")
	if _, errOut, code := submit(t, "schedule", "create", name, "--every", "1s", "--request", req, "go"); code == 0 || !strings.Contains(errOut, "schedule exists") {
		t.Errorf("create twice: exit %d\n%s", code, errOut)
	}

	deadline := time.Now().Add(40 * time.Second)
	for len(scheduleRunsNow(t, name)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no two runs of %s after 40s", name)
		}
	}
	list, _, code := submit(t, "schedule", "list")
	if code != 0 || !strings.Contains(list, name) || !strings.Contains(list, "@every 1s") {
		t.Errorf("schedule list: exit %d\n%s", code, list)
	}
	show, _, code := submit(t, "schedule", "show", name, "--lateness")
	if code != 0 || !strings.Contains(show, "overlap skip") || !strings.Contains(show, "lateness (planned time to run start)") {
		t.Errorf("schedule show: exit %d\n%s", code, show)
	}

	if out, errOut, code := submit(t, "schedule", "pause", name); code != 0 || out != "schedule "+name+": paused\n" {
		t.Fatalf("pause: exit %d\n%s%s", code, out, errOut)
	}
	lj, _, _ := submit(t, "schedule", "list", "--json")
	var infos []bus.ScheduleInfo
	if err := json.Unmarshal([]byte(lj), &infos); err != nil {
		t.Fatal(err)
	}
	paused := false
	for _, in := range infos {
		paused = paused || (in.Name == name && in.Paused)
	}
	if !paused {
		t.Errorf("schedule list --json after pause:\n%s", lj)
	}
	id, errOut, code := submit(t, "schedule", "trigger", name)
	id = strings.TrimSpace(id)
	if code != 0 || !bus.ValidID(id) {
		t.Fatalf("trigger: exit %d %q\n%s", code, id, errOut)
	}
	if res, _, code := submit(t, "result", id); code != 0 || res != "tick\n" {
		t.Errorf("the triggered run %s: exit %d %q", id, code, res)
	}
	if _, errOut, code := submit(t, "schedule", "delete", name); code != 0 {
		t.Fatalf("delete: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := submit(t, "schedule", "show", name); code == 0 || !strings.Contains(errOut, "schedule not found") {
		t.Errorf("show after delete: exit %d\n%s", code, errOut)
	}
}

// TestScheduleNATSCLI runs docs/protocol.md's nats CLI commands of
// schedules (§2, Schedules) against the test fleet, as written but for the
// schedule's name: create, list, pause, trigger (whose run the worker
// runs), the newest run, delete; `submit schedule` then agrees.
func TestScheduleNATSCLI(t *testing.T) {
	t.Parallel()
	path := natsCLIPath(t)
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n### Schedules (since 1.10)\n")
	if !ok {
		t.Fatal(`docs/protocol.md has no section "Schedules (since 1.10)"`)
	}
	if i := regexp.MustCompile(`\n#{2,3} `).FindStringIndex(section); i != nil { // "# " starts the block's comments
		section = section[:i[0]]
	}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) != 1 {
		t.Fatalf("the section has %d sh blocks, want 1: teach this test about them", len(blocks))
	}
	name := "natscli" + strings.ToLower(bus.NewRunID()[:8])
	script := strings.ReplaceAll(blocks[0][1], "nightly", name)
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Env = []string{"PATH=" + path, "HOME=" + t.TempDir(), "NATS_URL=" + fleet.url}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"agents.schedule.default." + name + ".def", `"run":"sch-`, `"trigger":true`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("no %q in the commands' output:\n%s", want, out)
		}
	}
	var last struct{ Run string }
	if i := strings.Index(string(out), `{"run":"`); i >= 0 {
		_ = json.NewDecoder(strings.NewReader(string(out[i:]))).Decode(&last)
	}
	if res, _, code := submit(t, "result", last.Run); code != 0 || res == "" {
		t.Errorf("the triggered run %q: exit %d %q", last.Run, code, res)
	}
	if _, errOut, code := submit(t, "schedule", "show", name); code == 0 || !strings.Contains(errOut, "schedule not found") {
		t.Errorf("after the delete: exit %d\n%s", code, errOut)
	}
}
