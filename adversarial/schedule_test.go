//go:build adversarial

package adversarial

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/internal/rolefleet"
	"github.com/agentfleet/agentfleet/worker"
)

// teamConf is accounts.conf with the submitter limited to queue team-a,
// as docs/security.md (Schedules) says to limit one: its submits and its
// schedules' subjects name team-a.
func teamConf(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(accountsConf)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start, end := strings.Index(text, "\nSUBMITTER = {"), strings.Index(text, "\nOBSERVER = {")
	if start < 0 || end < start {
		t.Fatal("accounts.conf has no SUBMITTER block before OBSERVER")
	}
	block := text[start:end]
	for from, to := range map[string]string{
		`"agents.submit.*.*"`:        `"agents.submit.team-a.*"`,
		`"agents.schedule.*.*.def"`:  `"agents.schedule.team-a.*.def"`,
		`"agents.schedule.*.*.fire"`: `"agents.schedule.team-a.*.fire"`,
	} {
		if !strings.Contains(block, from) {
			t.Fatalf("the SUBMITTER block has no %s", from)
		}
		block = strings.ReplaceAll(block, from, to)
	}
	p := filepath.Join(t.TempDir(), "accounts.conf")
	if err := os.WriteFile(p, []byte(text[:start]+block+text[end:]), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Issue 57: a schedule submits a run at each fire, so it is a submitter's
// right, on the queues its subjects allow, and nobody else's. An
// observer, an approver or a tool service cannot create or trigger one;
// a submitter of team-a cannot schedule onto another queue, neither by a
// schedule on that queue's subject nor by a fire on its own subject whose
// body names the other queue (the worker submits only to the subject's
// queue and drops the fire); nor can it write a schedule's last run (the
// overlap policy's), which only workers write.
func TestScheduleIsASubmittersRightOnItsQueues(t *testing.T) {
	srv := rolefleet.Start(t, teamConf(t))
	f := &fleet{Server: srv, WorkerLog: &logbuf.Buffer{}}
	f.Worker = f.Connect(t, "worker")
	fleettest.RunWorker(t, worker.Config{Client: f.Worker.Client, Queues: []string{"default", "team-a", "other"},
		Logger: slog.New(slog.NewTextHandler(f.WorkerLog, nil)), WorkerID: "adversarial-worker", DrainTimeout: 2 * time.Second})
	sub := f.Connect(t, "submitter")
	n := sub.Names()
	req, err := json.Marshal(fleettest.FauxRun("scheduled", fleettest.Text("ran")))
	if err != nil {
		t.Fatal(err)
	}
	def := func(queue, name string) []byte {
		b, err := json.Marshal(bus.Schedule{Name: name, Queue: queue, Every: "1s", Request: req})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	// Roles without the right: every publish on a schedule's subjects is a
	// permissions violation.
	for _, role := range []string{"observer", "approver", "toolservice"} {
		nc, _ := srv.NATS(t, role)
		for _, subj := range []string{n.ScheduleDef("default", "evil-"+role), n.ScheduleFire("default", "evil-"+role)} {
			m := &nats.Msg{Subject: subj, Data: def("default", "evil-"+role), Header: nats.Header{}}
			m.Header.Set("Nats-Schedule", "@every 1s")
			m.Header.Set("Nats-Schedule-Target", n.ScheduleFire("default", "evil-"+role))
			if _, err := nc.RequestMsg(m, time.Second); err == nil {
				t.Errorf("%s stored a message on %s", role, subj)
			}
			if !srv.Log.Violation(role, subj) {
				t.Errorf("%s: no permissions violation logged for %s", role, subj)
			}
		}
	}

	// The team-a submitter: not on another queue's subject.
	if _, err := sub.CreateSchedule(ctx(t, 5*time.Second), &bus.Schedule{Name: "elsewhere", Queue: "other", Every: "1s", Request: req}, false); err == nil {
		t.Error("a team-a submitter created a schedule on queue other")
	}
	if !srv.Log.Violation("submitter", n.ScheduleDef("other", "elsewhere")) {
		t.Error("no permissions violation logged for the schedule on queue other")
	}
	// Nor the last run a worker writes.
	if err := sub.SetLastScheduleRun(ctx(t, 2*time.Second), "team-a", "mine", bus.ScheduleLast{Run: "someone-elses-run"}); err == nil {
		t.Error("a submitter wrote a schedule's last run")
	}
	// A fire on its own subject whose body names queue other: dropped.
	if _, err := sub.JetStream().Publish(ctx(t, 5*time.Second), n.ScheduleFire("team-a", "smuggle"), def("other", "smuggle")); err != nil {
		t.Fatalf("the team-a submitter may publish on its fire subjects: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(f.WorkerLog.String(), "schedule fire dropped") {
		if time.Now().After(deadline) {
			t.Fatalf("the smuggled fire was not dropped; worker log:\n%s", f.WorkerLog.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Review 57, finding 1: the server fires a schedule onto any subject of
	// the stream (Nats-Schedule-Target), whoever stored it. A team-a
	// schedule aimed at queue other's fire subject makes no run there,
	// and one aimed at other's last run leaves no last run to read.
	js := sub.JetStream()
	aim := func(name, target string, body []byte) {
		t.Helper()
		m := &nats.Msg{Subject: n.ScheduleDef("team-a", name), Data: body, Header: nats.Header{}}
		m.Header.Set("Nats-Schedule", "@every 1s")
		m.Header.Set("Nats-Schedule-Target", target)
		m.Header.Set("Nats-Schedule-TTL", "1m")
		if _, err := js.PublishMsg(ctx(t, 5*time.Second), m); err != nil {
			t.Fatalf("the team-a submitter may store a schedule on its def subjects: %v", err)
		}
	}
	aim("cross", n.ScheduleFire("other", "cross"), def("other", "cross"))
	aim("forge", n.ScheduleLast("other", "victim"), []byte(`{"run":"forged-run","plannedAt":"2026-01-01T00:00:00Z"}`))
	st, err := f.Worker.JetStream().Stream(ctx(t, 5*time.Second), n.SchedulesStream())
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		info, err := st.Info(ctx(t, 5*time.Second), jetstream.WithSubjectFilter(n.ScheduleFire("other", "cross")))
		if err != nil {
			t.Fatal(err)
		}
		_, lerr := st.GetLastMsgForSubject(ctx(t, 5*time.Second), n.ScheduleLast("other", "victim"))
		if info.State.Msgs >= 3 && lerr == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the aimed schedules fired %d times onto other in 30 s (last: %v)", info.State.Msgs, lerr)
		}
	}
	for _, name := range []string{"cross", "forge"} { // stop them: a plain message rolls the schedule up
		m := &nats.Msg{Subject: n.ScheduleDef("team-a", name), Header: nats.Header{}}
		m.Header.Set(nats.MsgRollup, nats.MsgRollupSubject)
		m.Header.Set("Agentfleet-Schedule-Deleted", "true")
		if _, err := js.PublishMsg(ctx(t, 5*time.Second), m); err != nil {
			t.Fatal(err)
		}
	}
	fires, err := f.Worker.JetStream().Consumer(ctx(t, 5*time.Second), n.SchedulesStream(), n.FiresConsumer())
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ci, err := fires.Info(ctx(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumPending == 0 && ci.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fires not handled in 30 s: %d pending, %d unacknowledged", ci.NumPending, ci.NumAckPending)
		}
	}
	if l, err := sub.LastScheduleRun(ctx(t, 5*time.Second), "other", "victim"); err != nil || l != nil {
		t.Errorf("a forged last run of queue other's schedule is read: %+v %v", l, err)
	}
	if runs, err := sub.List(ctx(t, 5*time.Second), bus.ListOptions{Queue: "other", MaxScan: -1}); err != nil || len(runs) > 0 {
		t.Errorf("a team-a schedule made %d runs on queue other (%v)", len(runs), err)
	}

	// Its own queue: a schedule that runs there, and only there.
	if _, err := sub.CreateSchedule(ctx(t, 5*time.Second), &bus.Schedule{Name: "mine", Queue: "team-a", Every: "1s", Request: req}, false); err != nil {
		t.Fatalf("a team-a schedule: %v", err)
	}
	var recs []bus.RunRecord
	for deadline := time.Now().Add(30 * time.Second); len(recs) == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the team-a schedule ran nothing in 30 s")
		}
		recs, err = sub.List(ctx(t, 5*time.Second), bus.ListOptions{Metadata: map[string]string{bus.MetaSchedule: "mine"}, MaxScan: -1})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Observers read schedules (list, show), as they read runs.
	if list, err := f.Connect(t, "observer").ListSchedules(ctx(t, 5*time.Second)); err != nil || len(list) != 1 || list[0].Name != "mine" {
		t.Errorf("observer: list schedules: %v %+v", err, list)
	}
	if err := sub.DeleteSchedule(ctx(t, 5*time.Second), "mine"); err != nil {
		t.Fatal(err)
	}
	all, err := sub.List(ctx(t, 5*time.Second), bus.ListOptions{MaxScan: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if r.Queue != "team-a" {
			t.Errorf("run %s on queue %s (schedule %q)", r.ID, r.Queue, r.Metadata[bus.MetaSchedule])
		}
	}
}
