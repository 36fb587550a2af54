package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// TestApprovalsAndWaitingListPage writes five runs waiting for approval
// (records and request events, as workers leave them) in a queue of their
// own, then pages through them with `submit approvals --limit 2` and
// `submit list --state waiting --limit 2`: each page prints the command
// for the next on stderr, and every run is listed once.
func TestApprovalsAndWaitingListPage(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	queue := "pages-" + bus.NewRunID()[:6]
	kv, err := c.Records(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var runs []string
	for i := range 5 {
		run, call := fmt.Sprintf("%s-run-%d", queue, i), fmt.Sprintf("call-%d", i)
		runs = append(runs, run)
		ev := fmt.Appendf(nil, `{"run":%q,"seq":1,"attempt":1,"worker":"w","ts":%d,"event":{"type":"tool_approval_requested","toolCallId":%q,"toolName":"deploy","args":{"n":%d},"expiresAt":%d}}`,
			run, now.UnixMilli(), call, i, now.Add(time.Hour).UnixMilli())
		if _, err := c.JetStream().Publish(ctx(t), c.Names().Events(run), ev); err != nil {
			t.Fatal(err)
		}
		rec := bus.RunRecord{ID: run, Queue: queue, State: bus.StateRunning, HeartbeatAt: now,
			Waiting: &bus.Waiting{For: bus.WaitingApproval, Since: now, Approvals: []bus.PendingApproval{{
				ToolCallID: call, ToolName: "deploy", RequestedAt: now.UnixMilli(), ExpiresAt: now.Add(time.Hour).UnixMilli()}}}}
		data, _ := json.Marshal(rec)
		if _, err := kv.Put(ctx(t), run, data); err != nil {
			t.Fatal(err)
		}
		if err := c.PutWaiting(ctx(t), &rec, false); err != nil { // as a worker does, after the record
			t.Fatal(err)
		}
	}
	next := regexp.MustCompile(`more: submit (.*)\n`)
	for _, first := range [][]string{
		{"approvals", "--queue", queue, "--limit", "2"},
		{"list", "--state", "waiting", "--queue", queue, "--limit", "2"},
	} {
		args := first
		var pages []int
		listed := map[string]int{}
		for range 5 {
			out, errOut, code := submit(t, args...)
			if code != 0 {
				t.Fatalf("submit %s: exit %d\n%s", strings.Join(args, " "), code, errOut)
			}
			n := 0
			for _, run := range runs {
				if regexp.MustCompile(`(?m)^` + run + `\s`).MatchString(out) {
					listed[run]++
					n++
				}
			}
			pages = append(pages, n)
			m := next.FindStringSubmatch(errOut)
			if m == nil {
				break
			}
			args = strings.Fields(m[1])
		}
		if fmt.Sprint(pages) != "[2 2 1]" || len(listed) != len(runs) {
			t.Errorf("submit %s: pages of %v runs, %d runs listed (%v); want [2 2 1], each once", first[0], pages, len(listed), listed)
		}
	}
	if _, errOut, code := submit(t, "approvals", "--limit", "-1", "--before", "nope", "x"); code == 0 ||
		!strings.Contains(errOut, "no arguments") || !strings.Contains(errOut, "--limit") || !strings.Contains(errOut, "--before") {
		t.Errorf("bad flags: exit %d, want every problem named:\n%s", code, errOut)
	}
}
