//go:build adversarial

package adversarial

import (
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/internal/rolefleet"
	"github.com/agentfleet/agentfleet/worker"
)

// A worker answers a schedule operation with its own publish rights, so a
// submitter that names a reply subject other than an inbox would make it
// its deputy: here a team-a submitter aims the worker's answer at queue
// other's schedule definition and at a budgets KV entry. The worker
// answers inboxes only (review of issue 57, second pass, finding 1).
func TestScheduleOperationRepliesOnlyToInboxes(t *testing.T) {
	srv := rolefleet.Start(t, teamConf(t))
	f := &fleet{Server: srv, WorkerLog: &logbuf.Buffer{}}
	f.Worker = f.Connect(t, "worker")
	fleettest.RunWorker(t, worker.Config{Client: f.Worker.Client, Queues: []string{"team-a", "other"},
		Logger: slog.New(slog.NewTextHandler(f.WorkerLog, nil)), WorkerID: "adversarial-worker", DrainTimeout: 2 * time.Second})
	victim, attacker := f.Connect(t, "submitter-b"), f.Connect(t, "submitter")
	n := attacker.Names()
	req, _ := json.Marshal(fleettest.FauxRun("scheduled", fleettest.Text("ran")))
	if _, err := victim.CreateSchedule(ctx(t, 10*time.Second), &bus.Schedule{Name: "victim", Queue: "other", Every: "1h",
		Overlap: bus.OverlapAllow, Request: req}, false); err != nil {
		t.Fatal(err)
	}
	nc := attacker.Conn()
	for _, reply := range []string{n.ScheduleDef("other", "victim"), "$KV.agents_budgets.forged"} {
		if err := nc.PublishMsg(&nats.Msg{Subject: n.ScheduleOp("team-a", "x", "bogus"), Reply: reply, Data: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	// The same operation with an inbox is answered: the worker took the
	// two before it (one subscription, in order).
	if _, err := nc.Request(n.ScheduleOp("team-a", "x", "bogus"), []byte("{}"), 10*time.Second); err != nil {
		t.Fatalf("an operation with an inbox was not answered: %v", err)
	}
	st, err := f.Worker.JetStream().Stream(ctx(t, 10*time.Second), "AGENTS_SCHEDULES")
	if err != nil {
		t.Fatal(err)
	}
	kst, err := f.Worker.JetStream().Stream(ctx(t, 10*time.Second), "KV_agents_budgets")
	if err != nil {
		t.Fatal(err)
	}
	// Without the check the answers were stored within milliseconds.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if info, err := victim.GetSchedule(ctx(t, 10*time.Second), "victim"); err != nil || info.Queue != "other" {
			t.Fatalf("the victim's schedule after the reply-subject trick: %+v %v", info, err)
		}
		if m, err := kst.GetLastMsgForSubject(ctx(t, 10*time.Second), "$KV.agents_budgets.forged"); err == nil {
			t.Fatalf("a submitter wrote the budgets KV through a worker's answer: %s", m.Data)
		}
	}
	if m, err := st.GetLastMsgForSubject(ctx(t, 10*time.Second), n.ScheduleDef("other", "victim")); err != nil || m.Header.Get("Nats-Schedule") == "" {
		t.Fatalf("the victim's definition: %v %v", m, err)
	}
}
