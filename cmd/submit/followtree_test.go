package main

import (
	"regexp"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
)

// `submit follow --tree` on a finished parent with a grandchild shows the
// events of all four runs, each line prefixed by its run's id, the
// children's answers under their own ids, and exits with the root's
// status.
func TestFollowTreeShowsChildRunsEvents(t *testing.T) {
	t.Parallel()
	id := "t-ftree-" + bus.NewRunID()[:8]
	if out, errOut, code := submit(t, "--id", id, "--request", request(t, treeRun), "plan"); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	out, errOut, code := submit(t, "follow", "--tree", "--no-color", id)
	if code != 0 {
		t.Fatalf("follow --tree: exit %d\n%s\n%s", code, out, errOut)
	}
	tc := testClient(t)
	a, b := childID(t, tc, id, "a"), childID(t, tc, id, "b")
	c := childID(t, tc, b, "c")
	for _, want := range []string{
		`(?m)^\[` + id + `\] .*merged`,
		`(?m)^\[` + a + `\] .*A is done`,
		`(?m)^\[` + b + `\] .*B is done`,
		`(?m)^\[` + c + `\] .*B checked`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("follow --tree lacks %s:\n%s", want, out)
		}
	}
	for _, line := range regexp.MustCompile(`(?m)^.*$`).FindAllString(out, -1) {
		if line != "" && !regexp.MustCompile(`^\[[a-z0-9-]+\] `).MatchString(line) {
			t.Errorf("a line without its run's id: %q", line)
		}
	}
	if _, errOut, code := submit(t, "follow", "--tree", "--json", id); code == 0 {
		t.Errorf("follow --tree --json: exit 0\n%s", errOut)
	}
}
