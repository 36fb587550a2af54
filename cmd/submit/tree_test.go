package main

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
)

// treeRun fans out to two scripted children, one of which starts its own.
const treeRun = `{"model":"faux/x","tools":["run_agent"],"faux":{"responses":[
 {"content":[{"type":"toolCall","id":"a","name":"run_agent","arguments":{"prompt":"research A","request":{"faux":{"responses":[{"content":[{"type":"text","text":"A is done"}]}]}}}},
  {"type":"toolCall","id":"b","name":"run_agent","arguments":{"prompt":"research B","request":{"tools":["run_agent"],"faux":{"responses":[
   {"content":[{"type":"toolCall","id":"c","name":"run_agent","arguments":{"prompt":"check B","request":{"faux":{"responses":[{"content":[{"type":"text","text":"B checked"}]}]}}}}],"stopReason":"toolUse"},
   {"content":[{"type":"text","text":"B is done"}]}]}}}}],"stopReason":"toolUse"},
 {"content":[{"type":"text","text":"merged"}]}]}}`

// A parent's children on a real worker process: `submit status --tree`
// lists them, nested by depth, each with its state; a child's status
// names its parent. Runs another submitter put at the ids it could
// compute for the children (the SHA-256 of the parent and the call key,
// review 56) are not shown.
func TestStatusTreeShowsChildRuns(t *testing.T) {
	t.Parallel()
	id := "t-tree-" + bus.NewRunID()[:8]
	var squats []string
	for _, key := range []string{"a", "b"} {
		h := sha256.Sum256([]byte(id + "\x00" + key))
		sq := "c" + hex.EncodeToString(h[:])[:40]
		body := `{"model":"faux/x","prompt":"squat","faux":{"responses":[{"content":[{"type":"text","text":"SQUAT"}]}]}}`
		if _, err := testClient(t).SubmitRaw(ctx(t), "", sq, []byte(body)); err != nil {
			t.Fatal(err)
		}
		squats = append(squats, sq)
	}
	out, errOut, code := submit(t, "--id", id, "--request", request(t, treeRun), "plan")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	expect(t, out, "A is done", "B is done", "merged")
	st, _, code := submit(t, "status", "--tree", id)
	if code != 0 {
		t.Fatalf("status --tree: exit %d\n%s", code, st)
	}
	a, b := childID(t, testClient(t), id, "a"), childID(t, testClient(t), id, "b")
	c := childID(t, testClient(t), b, "c")
	for _, re := range []string{`(?m)^└ ` + a + `\s+succeeded\s`, `(?m)^└ ` + b + `\s+succeeded\s`, `(?m)^  └ ` + c + `\s+succeeded\s`} {
		if !regexp.MustCompile(re).MatchString(st) {
			t.Errorf("status --tree lacks %s:\n%s", re, st)
		}
	}
	for _, sq := range squats {
		if strings.Contains(st, sq) {
			t.Errorf("status --tree shows the squatted %s:\n%s", sq, st)
		}
	}
	fo, _, _ := submit(t, "follow", c)
	expect(t, fo, "child of "+b+" (depth 2)", "B checked")
	cs, _, _ := submit(t, "status", c)
	if !strings.Contains(cs, "parent") || !strings.Contains(cs, b+" (depth 2, root "+id+")") {
		t.Errorf("child status:\n%s", cs)
	}
}

// childID is the run id of call key's child of parent, computed with the
// fleet's child key (the tests' connection may read it).
func childID(t *testing.T, c *bus.Client, parent, key string) string {
	t.Helper()
	k, err := c.ChildKey(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return k.RunID(parent, key)
}
