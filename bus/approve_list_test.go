package bus_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// TestPendingApprovals lists the fleet's waiting calls from records and
// events written as workers write them: a run with a long history before
// its request, a run whose worker's clock is far ahead of the server's
// (its request is found by a full read), a run whose record still lists a
// call its events resolved, a run waiting for the model, a finished run;
// the queue filter.
func TestPendingApprovals(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	seqs := map[string]uint64{}
	// ts: when the worker published the event (the requests' order).
	ts := now.Add(-time.Minute)
	publish := func(run string, ev string) {
		t.Helper()
		seqs[run]++
		ts = ts.Add(time.Millisecond)
		data := fmt.Appendf(nil, `{"run":%q,"seq":%d,"attempt":1,"worker":"w","ts":%d,"event":%s}`, run, seqs[run], ts.UnixMilli(), ev)
		if _, err := c.JetStream().Publish(ctx, c.Names().Events(run), data); err != nil {
			t.Fatal(err)
		}
	}
	request := func(run, call, tool string) {
		publish(run, fmt.Sprintf(`{"type":"tool_approval_requested","toolCallId":%q,"toolName":%q,"args":{"target":%q},"expiresAt":%d}`,
			call, tool, run, now.Add(time.Hour).UnixMilli()))
	}
	record := func(run, queue, state string, w *bus.Waiting) {
		t.Helper()
		data, _ := json.Marshal(bus.RunRecord{ID: run, Queue: queue, State: state, HeartbeatAt: time.Now(), Waiting: w})
		if _, err := kv.Put(ctx, run, data); err != nil {
			t.Fatal(err)
		}
		if w != nil { // as a worker does, after the record
			if err := c.PutWaiting(ctx, &bus.RunRecord{ID: run, Queue: queue, Waiting: w}, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitingFor := func(call string, requestedAt time.Time) *bus.Waiting {
		return &bus.Waiting{For: bus.WaitingApproval, Since: requestedAt,
			Approvals: []bus.PendingApproval{{ToolCallID: call, ToolName: "deploy", RequestedAt: requestedAt.UnixMilli(), ExpiresAt: now.Add(time.Hour).UnixMilli()}}}
	}

	publish("long", `{"type":"run_started","queue":"default","worker":"w","attempt":1,"tools":["deploy"]}`)
	for range 300 {
		publish("long", `{"type":"message_update","assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"x"}}`)
	}
	request("long", "c1", "deploy")
	record("long", "default", bus.StateRunning, waitingFor("c1", now))

	request("ahead", "c2", "pay")
	record("ahead", "other", bus.StateRunning, waitingFor("c2", now.Add(10*time.Minute)))

	request("lagging", "c3", "deploy")
	publish("lagging", `{"type":"tool_approval_resolved","toolCallId":"c3","decision":"approve","controlSeq":1}`)
	record("lagging", "default", bus.StateRunning, waitingFor("c3", now))

	record("model", "default", bus.StateRunning, &bus.Waiting{For: bus.WaitingModel, Since: now})
	request("done", "c5", "deploy")
	record("done", "default", bus.StatusSucceeded, nil)

	list := func(queue string) string {
		t.Helper()
		ps, err := c.PendingApprovals(ctx, bus.ApprovalsOptions{Queue: queue})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range ps {
			out = append(out, fmt.Sprintf("%s/%s/%s/%s/%s", p.Run, p.Queue, p.ToolCallID, p.ToolName, p.Args))
			if p.ExpiresAt.UnixMilli() != now.Add(time.Hour).UnixMilli() || p.WaitingSince.IsZero() {
				t.Errorf("%s: expires %v, waiting since %v", p.Run, p.ExpiresAt, p.WaitingSince)
			}
		}
		return strings.Join(out, " ")
	}
	if got, want := list(""), `long/default/c1/deploy/{"target":"long"} ahead/other/c2/pay/{"target":"ahead"}`; got != want {
		t.Errorf("pending approvals:\n got %s\nwant %s", got, want)
	}
	if got, want := list("other"), `ahead/other/c2/pay/{"target":"ahead"}`; got != want {
		t.Errorf("pending approvals of queue other:\n got %s\nwant %s", got, want)
	}
}

// TestPendingApprovalsPages pages through 250 runs waiting for approval,
// with runs waiting for the model and finished runs between them: pages of
// 100 runs, each call once, the model's waits never taking a place on a
// page, and a cursor only while runs are left.
func TestPendingApprovalsPages(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	const n = 250
	for i := range n {
		run, call := fmt.Sprintf("wait-%03d", i), fmt.Sprintf("call-%03d", i)
		data := fmt.Appendf(nil, `{"run":%q,"seq":1,"attempt":1,"worker":"w","ts":%d,"event":{"type":"tool_approval_requested","toolCallId":%q,"toolName":"deploy","args":{"n":%d},"expiresAt":%d}}`,
			run, now.UnixMilli(), call, i, now.Add(time.Hour).UnixMilli())
		if _, err := c.JetStream().Publish(ctx, c.Names().Events(run), data); err != nil {
			t.Fatal(err)
		}
		recs := []bus.RunRecord{{ID: run, Queue: "default", State: bus.StateRunning, HeartbeatAt: now,
			Waiting: &bus.Waiting{For: bus.WaitingApproval, Since: now, Approvals: []bus.PendingApproval{{
				ToolCallID: call, ToolName: "deploy", RequestedAt: now.UnixMilli(), ExpiresAt: now.Add(time.Hour).UnixMilli()}}}}}
		if i%3 == 0 {
			recs = append(recs,
				bus.RunRecord{ID: fmt.Sprintf("model-%03d", i), Queue: "default", State: bus.StateRunning, HeartbeatAt: now,
					Waiting: &bus.Waiting{For: bus.WaitingModel, Since: now}},
				bus.RunRecord{ID: fmt.Sprintf("done-%03d", i), Queue: "default", State: bus.StatusSucceeded})
		}
		for _, r := range recs {
			data, _ := json.Marshal(r)
			if _, err := kv.Put(ctx, r.ID, data); err != nil {
				t.Fatal(err)
			}
			if r.Waiting != nil { // as a worker does, after the record
				if err := c.PutWaiting(ctx, &r, false); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	seen := map[string]bool{}
	var sizes []int
	cursor := ""
	for range 10 {
		p, err := c.PendingApprovalsPage(ctx, bus.ApprovalsOptions{Limit: 100, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(p.Calls))
		for _, call := range p.Calls {
			var i int
			_, _ = fmt.Sscanf(call.ToolCallID, "call-%d", &i)
			if seen[call.ToolCallID] || string(call.Args) != fmt.Sprintf(`{"n":%d}`, i) {
				t.Errorf("call %s (args %s) listed twice or with another call's arguments", call.ToolCallID, call.Args)
			}
			seen[call.ToolCallID] = true
		}
		if cursor = p.NextCursor; cursor == "" {
			break
		}
	}
	if fmt.Sprint(sizes) != "[100 100 50]" || len(seen) != n {
		t.Errorf("pages of %v calls, %d calls in all; want [100 100 50], %d", sizes, len(seen), n)
	}
}

// TestPendingOfKeepsOnlyWhatItFolds reads the pending calls of a run with
// 1,536 large events stored before its request, as a record whose
// requestedAt lies (or a worker's clock far behind) makes the listing do:
// the call is found, and the read keeps only the envelopes the fold reads
// (the request), never the transcript.
func TestPendingOfKeepsOnlyWhatItFolds(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	const run, n = "big", 1536
	delta := strings.Repeat("x", 8<<10)
	for i := range n {
		data := fmt.Appendf(nil, `{"run":%q,"seq":%d,"attempt":1,"worker":"w","ts":1,"event":{"type":"message_update","assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":%q}}}`, run, i+1, delta)
		if _, err := c.JetStream().PublishAsync(c.Names().Events(run), data); err != nil {
			t.Fatal(err)
		}
	}
	<-c.JetStream().PublishAsyncComplete()
	req := fmt.Appendf(nil, `{"run":%q,"seq":%d,"attempt":1,"worker":"w","ts":1,"event":{"type":"tool_approval_requested","toolCallId":"c1","toolName":"deploy","args":{},"expiresAt":%d}}`,
		run, n+1, time.Now().Add(time.Hour).UnixMilli())
	if _, err := c.JetStream().Publish(ctx, c.Names().Events(run), req); err != nil {
		t.Fatal(err)
	}
	calls, err := c.PendingOf(ctx, run)
	if err != nil || len(calls) != 1 || calls[0].ToolCallID != "c1" {
		t.Fatalf("pending calls %+v, %v", calls, err)
	}
	envs, err := bus.StoredEvents(ctx, c, run)
	if err != nil || len(envs) != 1 || envs[0].Type != bus.EventToolApprovalRequested {
		t.Errorf("the read kept %d envelopes (%v), want the request alone", len(envs), err)
	}
}

// TestPendingOfAsksTheAPIThreeTimes: a run's requests are read with the
// ordered consumer's create (its answer says what is pending), the pull
// and the delete; an approvals page does this for each of its 100 runs.
func TestPendingOfAsksTheAPIThreeTimes(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	req := fmt.Appendf(nil, `{"run":"r1","seq":1,"attempt":1,"worker":"w","ts":1,"event":{"type":"tool_approval_requested","toolCallId":"c1","toolName":"deploy","args":{},"expiresAt":%d}}`,
		time.Now().Add(time.Hour).UnixMilli())
	if _, err := c.JetStream().Publish(ctx, c.Names().Events("r1"), req); err != nil {
		t.Fatal(err)
	}
	apiCalls := func() uint64 { // the account's JetStream API requests, this one included
		t.Helper()
		info, err := c.JetStream().AccountInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.API.Total
	}
	for range 3 { // the first reads may look streams up
		if _, err := c.PendingOf(ctx, "r1"); err != nil {
			t.Fatal(err)
		}
	}
	before := apiCalls()
	calls, err := c.PendingOf(ctx, "r1")
	if err != nil || len(calls) != 1 {
		t.Fatalf("pending calls %+v, %v", calls, err)
	}
	// Pulls are no API requests the account counts: create and delete,
	// plus the count's own.
	if n := apiCalls() - before; n > 3 {
		t.Errorf("one run's pending calls took %d JetStream API requests, want at most 2 (and the count's own)", n-1)
	}
}
