package deploy

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestAccountsApprover proves the approver role of accounts.conf: an
// approver (user approver) lists the run waiting for approval that a
// submitter submitted and approves its call, which then runs; the
// submitter, the observer and the tool service cannot publish on
// agents.run.*.approve (each refusal a permissions violation,
// nothing stored), and the approver cannot submit, steer or abort.
func TestAccountsApprover(t *testing.T) {
	url, pw := accountsServer(t)
	wc := connectAs(t, url, "worker", pw["worker"])
	sub := connectAs(t, url, "submitter", pw["submitter"])
	obs := connectAs(t, url, "observer", pw["observer"])
	ts := connectAs(t, url, "toolservice", pw["toolservice"])
	appr := connectAs(t, url, "approver", pw["approver"])
	names := wc.Names()

	fleettest.RunWorker(t, worker.Config{Client: wc, DrainTimeout: 2 * time.Second, WorkerID: "acl-approval-worker"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A submitted run that waits for approval of its calculator call.
	run := "acl-appr-run"
	req := `{"prompt":"what is 6*7?","tools":["calculator"],"approval":{"tools":["calculator"]},"model":{"provider":"faux","id":"scripted"},
	 "faux":{"responses":[{"content":[{"type":"toolCall","id":"c1","name":"calculator","arguments":{"expression":"6*7"}}],"stopReason":"toolUse"},
	 {"content":[{"type":"text","text":"It is 42."}]}]}}`
	if _, err := sub.SubmitRaw(ctx, "", run, []byte(req)); err != nil {
		t.Fatalf("submitter: submit: %v", err)
	}
	var pending []bus.PendingCall
	for ctx.Err() == nil {
		ps, err := appr.PendingApprovals(ctx, bus.ApprovalsOptions{})
		if err != nil {
			t.Fatalf("approver: pending approvals: %v", err)
		}
		if i := slices.IndexFunc(ps, func(p bus.PendingCall) bool { return p.Run == run }); i >= 0 {
			pending = ps[i : i+1]
			break
		}
		time.Sleep(50 * time.Millisecond) // the record's waiting comes with the heartbeat
	}
	if len(pending) != 1 || pending[0].ToolCallID != "c1" || pending[0].ToolName != "calculator" {
		t.Fatalf("approver: pending %+v", pending)
	}
	var args map[string]any
	if err := json.Unmarshal(pending[0].Args, &args); err != nil || args["expression"] != "6*7" {
		t.Errorf("approver: the request's arguments %s", pending[0].Args)
	}
	if _, err := appr.Answer(ctx, run, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove, By: "acl approver"}); err != nil {
		t.Fatalf("approver: approve: %v", err)
	}
	tr, err := appr.LoadTranscript(ctx, run)
	if err != nil || !tr.Done() {
		t.Fatalf("approver: follow: %v", err)
	}
	if tr.Finished.Status != bus.StatusSucceeded || !strings.Contains(tr.FinalText(), "42") {
		t.Fatalf("run: %s %s %s %q", tr.Finished.Status, tr.Finished.Reason, tr.Finished.Error, tr.FinalText())
	}
	for _, m := range tr.Messages {
		if m.ToolCallID == "c1" && (m.IsError || m.TextOf() != "42") {
			t.Errorf("the approved call's result: %+v", m)
		}
	}
	if logs[appr].Violation("", "") {
		t.Error("the approver's listing and answer met a permissions violation")
	}

	// What no role but the approver (and the console, for --allow-control:
	// TestAccountsConsole) may do: answer an approval (on a run id that
	// exists nowhere: the permission is the same).
	body := []byte(`{"toolCallId":"c1","decision":"approve"}`)
	for role, c := range map[string]*bus.Client{"submitter": sub, "observer": obs, "toolservice": ts} {
		subj := names.Control("acl-appr-"+role, bus.KindApprove)
		dctx, dcancel := deny()
		_, err := c.JetStream().Publish(dctx, subj, body)
		dcancel()
		denied(t, c, role+" answers an approval", subj, err)
		noMsg(t, wc, names.ControlStream(), subj, role+"'s approval answer")
	}
	// What the approver may not do.
	{
		dctx, dcancel := deny()
		_, err := appr.Submit(dctx, "", &bus.RunRequest{ID: "acl-appr-submit", Prompt: "hi"})
		dcancel()
		denied(t, appr, "approver submits", names.Submit("default", "acl-appr-submit"), err)
		for _, kind := range []string{bus.KindSteer, bus.KindFollowUp, bus.KindAbort} {
			dctx, dcancel := deny()
			_, err := appr.SendControl(dctx, "acl-appr-ctl", kind, bus.Control{Text: "x"})
			dcancel()
			denied(t, appr, "approver sends "+kind, names.Control("acl-appr-ctl", kind), err)
			noMsg(t, wc, names.ControlStream(), names.Control("acl-appr-ctl", kind), "approver's "+kind)
		}
	}
}
