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

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/internal/rolefleet"
	"github.com/agentfleet/agentfleet/worker"
)

// teamConf is accounts.conf with the submitter limited to queue team-a,
// as docs/security.md (Schedules) says to limit one: its submits and its
// schedules' subjects name team-a. A second submitter, submitter-b, is
// limited to queue other the same way.
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
	limit := func(queue string) string {
		block := text[start:end]
		for from, to := range map[string]string{
			`"agents.submit.*.*"`:    `"agents.submit.` + queue + `.*"`,
			`"agents.schedop.*.*.*"`: `"agents.schedop.` + queue + `.*.*"`,
		} {
			if !strings.Contains(block, from) {
				t.Fatalf("the SUBMITTER block has no %s", from)
			}
			block = strings.ReplaceAll(block, from, to)
		}
		return block
	}
	blockB := strings.Replace(limit("other"), "\nSUBMITTER = {", "\nSUBMITTER_B = {", 1)
	out := text[:start] + limit("team-a") + blockB + text[end:]
	user := "\n      {user: submitter, password: $AGENTS_SUBMITTER_PASSWORD, permissions: $SUBMITTER}"
	if !strings.Contains(out, user) {
		t.Fatal("accounts.conf has no submitter user line")
	}
	out = strings.Replace(out, user, user+"\n      {user: submitter-b, password: $AGENTS_SUBMITTER_B_PASSWORD, permissions: $SUBMITTER_B}", 1)
	p := filepath.Join(t.TempDir(), "accounts.conf")
	if err := os.WriteFile(p, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Issue 57: a schedule submits a run at each fire, so it is a submitter's
// right, on the queues its subjects allow, and nobody else's. An
// observer, an approver or a tool service cannot create or trigger one;
// a submitter of team-a cannot schedule onto another queue, neither by an
// operation on that queue's subject nor by one on its own subject whose
// body names the other queue (the worker refuses it); nor can it write
// AGENTS_SCHEDULES itself (a definition, a fire, a last run): only
// workers do.
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

	// Roles without the right: every publish on a schedule's subjects, and
	// every schedule operation, is a permissions violation.
	for _, role := range []string{"observer", "approver", "toolservice"} {
		nc, _ := srv.NATS(t, role)
		for _, subj := range []string{n.ScheduleDef("default", "evil-"+role), n.ScheduleFire("default", "evil-"+role),
			n.ScheduleOp("default", "evil-"+role, bus.ScheduleOpCreate)} {
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
	if !srv.Log.Violation("submitter", n.ScheduleOp("other", "elsewhere", bus.ScheduleOpCreate)) {
		t.Error("no permissions violation logged for the schedule on queue other")
	}
	// Nor on its own subject with a body naming queue other: the worker
	// refuses it.
	if r, err := sub.Conn().Request(n.ScheduleOp("team-a", "smuggle", bus.ScheduleOpCreate), def("other", "smuggle"), 5*time.Second); err != nil {
		t.Fatalf("the team-a submitter may ask on its queue: %v", err)
	} else if !strings.Contains(string(r.Data), `"code":"invalid"`) {
		t.Errorf("a create naming queue other on team-a's subject: %s", r.Data)
	}
	// Nor write the stream: a definition, a fire, a last run.
	js := sub.JetStream()
	for _, subj := range []string{n.ScheduleDef("team-a", "direct"), n.ScheduleFire("team-a", "direct"), n.ScheduleLast("team-a", "direct")} {
		if _, err := js.Publish(ctx(t, 2*time.Second), subj, def("team-a", "direct")); err == nil {
			t.Errorf("a submitter stored a message on %s", subj)
		}
		if !srv.Log.Violation("submitter", subj) {
			t.Errorf("no permissions violation logged for %s", subj)
		}
	}
	if err := sub.SetLastScheduleRun(ctx(t, 2*time.Second), "team-a", "mine", bus.ScheduleLast{Run: "someone-elses-run"}); err == nil {
		t.Error("a submitter wrote a schedule's last run")
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

// Issue 57, the holes docs/security.md named: the server lets a message
// stored in AGENTS_SCHEDULES purge any schedule of the stream (a purge
// naming its def in Nats-Scheduler), replace it (a schedule aimed at its
// def with Nats-Schedule-Rollup) or purge them all (Nats-Rollup: all), and
// NATS permissions cannot refuse a header. Only workers write the stream
// (submitters ask them, on agents.schedop), so a submitter limited to
// team-a, trying each attack on its own queue's subjects, leaves queue
// other's schedule firing. With the 1.10 grants before this (publish on
// agents.schedule.team-a.*.def and .fire) each attack stopped it.
func TestScheduleWriterCannotStopAnotherQueuesSchedule(t *testing.T) {
	srv := rolefleet.Start(t, teamConf(t))
	f := &fleet{Server: srv, WorkerLog: &logbuf.Buffer{}}
	f.Worker = f.Connect(t, "worker")
	fleettest.RunWorker(t, worker.Config{Client: f.Worker.Client, Queues: []string{"team-a", "other"},
		Logger: slog.New(slog.NewTextHandler(f.WorkerLog, nil)), WorkerID: "adversarial-worker", DrainTimeout: 2 * time.Second})
	victim, attacker := f.Connect(t, "submitter-b"), f.Connect(t, "submitter")
	n := attacker.Names()
	req, err := json.Marshal(fleettest.FauxRun("scheduled", fleettest.Text("ran")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := victim.CreateSchedule(ctx(t, 5*time.Second), &bus.Schedule{Name: "victim", Queue: "other", Every: "1s",
		Overlap: bus.OverlapAllow, Request: req}, false); err != nil {
		t.Fatalf("submitter-b's schedule on its queue: %v", err)
	}
	// runsAfter counts the victim's runs planned after t0.
	runsAfter := func(t0 time.Time) int {
		recs, err := victim.List(ctx(t, 5*time.Second), bus.ListOptions{Queue: "other",
			Metadata: map[string]string{bus.MetaSchedule: "victim"}, MaxScan: -1})
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for _, r := range recs {
			if p, err := time.Parse(time.RFC3339Nano, r.Metadata[bus.MetaScheduledFor]); err == nil && p.After(t0) {
				k++
			}
		}
		return k
	}
	waitRuns := func(t0 time.Time, want int, what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); runsAfter(t0) < want; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the victim's schedule ran %d times after %s in 30 s, want %d", what, runsAfter(t0), t0.Format(time.RFC3339), want)
			}
		}
	}
	waitRuns(time.Time{}, 1, "before the attacks")

	js := attacker.JetStream()
	attack := func(what string, m *nats.Msg) {
		t.Helper()
		_, err := js.PublishMsg(ctx(t, 2*time.Second), m)
		t.Logf("%s: %v", what, err) // stored or refused: what counts is the victim's schedule
		if err == nil {
			t.Errorf("%s: stored", what)
		}
	}
	// 1. A purge naming the victim's def, on the attacker's own subjects.
	for _, subj := range []string{n.ScheduleFire("team-a", "purger"), n.ScheduleDef("team-a", "purger")} {
		m := &nats.Msg{Subject: subj, Header: nats.Header{}}
		m.Header.Set("Nats-Schedule-Next", "purge")
		m.Header.Set("Nats-Scheduler", n.ScheduleDef("other", "victim"))
		attack("purge message on "+subj, m)
	}
	// 2. A schedule aimed at the victim's def, replacing it at each fire
	// with a paused copy.
	paused, err := json.Marshal(bus.Schedule{Name: "victim", Queue: "other", Every: "1s", Paused: true, Request: req,
		CreatedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: n.ScheduleDef("team-a", "replacer"), Data: paused, Header: nats.Header{}}
	m.Header.Set("Nats-Schedule", "@every 1s")
	m.Header.Set("Nats-Schedule-Target", n.ScheduleDef("other", "victim"))
	m.Header.Set("Nats-Schedule-Rollup", "sub")
	attack("schedule aimed at the victim's def", m)
	// 3. A rollup of the whole stream.
	m = &nats.Msg{Subject: n.ScheduleDef("team-a", "roller"), Header: nats.Header{}}
	m.Header.Set(nats.MsgRollup, nats.MsgRollupAll)
	attack("rollup all", m)
	// And through the workers: an operation on its own queue's subject
	// naming the victim (refused: the body is not the subject's), and one
	// on the victim's queue (a permissions violation).
	if r, err := attacker.Conn().Request(n.ScheduleOp("team-a", "victim", bus.ScheduleOpReplace), paused, 5*time.Second); err != nil ||
		!strings.Contains(string(r.Data), `"code"`) {
		t.Errorf("a replace of the victim on team-a's subject: %v", err)
	}
	for _, op := range []string{bus.ScheduleOpPause, bus.ScheduleOpDelete} {
		if _, err := attacker.Conn().Request(n.ScheduleOp("other", "victim", op), []byte("{}"), time.Second); err == nil {
			t.Errorf("%s of the victim on queue other answered", op)
		}
	}

	// The replacer would fire within a second: 3 s later the victim's
	// schedule still fires, as defined.
	after := time.Now().Add(3 * time.Second)
	waitRuns(after, 3, "after the attacks")
	info, err := victim.GetSchedule(ctx(t, 5*time.Second), "victim")
	if err != nil || info.Paused || info.Queue != "other" {
		t.Fatalf("the victim's schedule after the attacks: %+v %v", info, err)
	}
	if err := victim.DeleteSchedule(ctx(t, 5*time.Second), "victim"); err != nil {
		t.Fatal(err)
	}
}
