package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// TestParkingDocNATSCLI runs docs/protocol.md's nats CLI walkthrough of a
// parked run (§13, Parking) as written, on a worker process with
// --park-after 1s serving its own queue (the block's "default" replaced by
// it): the run parks, its record says so, its kept request is the one
// submitted, and the answer wakes it to its end.
func TestParkingDocNATSCLI(t *testing.T) {
	t.Parallel()
	path, lines := docWalkthrough(t, "agents.parked.default.r4", 8)
	queue, run := "docpark", "doc-park-"+bus.NewRunID()[:10]
	stop, _, err := startWorkerProcess(filepath.Join(t.TempDir(), "worker.log"), nil,
		"--nats", fleet.url, "--queue", queue, "--park-after", "1s", "--worker-id", "doc-park")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	home := t.TempDir()
	sh := func(line string, want ...string) {
		t.Helper()
		line = regexp.MustCompile(`\br4\b`).ReplaceAllString(line, run)
		line = strings.ReplaceAll(line, ".default.", "."+queue+".")
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
	waitEvent(t, c, run, bus.EventRunParked, "")
	// run_parked is stored before the record says parked.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		rec, err := c.Status(ctx(t), run)
		if err == nil && rec.Parked != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("record never parked: %v %+v", err, rec)
		}
	}
	sh(lines[1], `{"state":"running","waiting":{"for":"approval"`, `"parked":{"at":"`, `"attempt":1,"digest":"`)
	sh(lines[2], `"prompt":"compute"`)
	// The waker's read (1.10): a direct get of the sequence the record names.
	sh(lines[3], `"compute"`)
	sh(lines[4], "parked.digest is the kept copy's")
	sh(lines[5])
	waitEvent(t, c, run, bus.EventRunFinished, "")
	sh(lines[6], `"run_started"`, `"run_parked"`, `"tool_approval_resolved"`)
	// The resume's read (1.10): every event type in order, in one batch.
	sh(lines[7], `"run_started"`, `"run_parked"`, `"run_resumed"`, `"run_finished"`)
}
