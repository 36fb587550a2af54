//go:build adversarial

package adversarial

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// Issue 54: a parked run is woken only by a worker's wake. A submitter
// who may publish requests for any run id crafts a wake of another's
// parked run: the wake headers naming its park (read from the record,
// which submitters may read), another request body (no approval gate),
// and the wake's Nats-Msg-Id, to take the run over with its own request
// and to keep the honest wake out by the dedupe. It cannot read the kept
// request, write it, or fire the run's timer. The forged wake is dropped
// with no event; the run stays parked; the approver's answer still wakes
// it, and the gated call runs once, approved.
func TestParkedRunCannotBeWokenByASubmitter(t *testing.T) {
	f := startFleet(t, &worker.Config{ParkAfter: 300 * time.Millisecond})
	owner, attacker, approver := f.Connect(t, "submitter"), f.Connect(t, "submitter"), f.Connect(t, "approver")
	req := fauxRun("parked-victim", "compute", calc("6*7"), fleettest.Text("done"))
	req.Approval = &bus.Approval{Tools: []string{"calculator"}}
	submit(t, owner, req)
	ev := follow(t, approver, req.ID)
	ev.wait(t, "run_parked", func(e *bus.Event) bool { return e.RunParked != nil })
	rec := waitRecord(t, attacker, req.ID, func(r *bus.RunRecord) bool { return r.Parked != nil })
	n := attacker.Names()

	forged := fauxRun(req.ID, "compute", calc("6*7"), fleettest.Text("taken over"))
	body, err := agent.MarshalJSON(forged)
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: n.Submit(rec.Queue, req.ID), Data: body, Header: nats.Header{}}
	seq := strconv.FormatUint(rec.Parked.Seq, 10)
	m.Header.Set(bus.HeaderWokenFrom, seq)
	m.Header.Set(bus.HeaderAttemptBase, strconv.Itoa(rec.Parked.Attempt))
	m.Header.Set(jetstream.MsgIDHeader, req.ID+":wake:"+seq)
	if _, err := attacker.JetStream().PublishMsg(ctx(t, 10*time.Second), m); err != nil {
		t.Fatalf("the submitter may publish requests: %v", err)
	}
	// What only workers may do.
	parked, err := attacker.JetStream().Stream(ctx(t, 2*time.Second), n.ParkedStream())
	if err == nil {
		if _, err = parked.GetMsg(ctx(t, 2*time.Second), rec.Parked.Seq); err == nil {
			t.Error("a submitter read a parked run's kept request")
		}
	}
	for _, subj := range []string{n.Parked(rec.Queue, req.ID), n.ParkTimerDue(req.ID)} {
		if _, err := attacker.JetStream().Publish(ctx(t, 2*time.Second), subj, []byte(`{"attempt":1}`)); err == nil {
			t.Errorf("a submitter published on %s", subj)
		}
	}
	// 1.10: AGENTS_PARKED allows direct gets (the waker's read). Only
	// workers may ask: the kept copy carries the wake key. Both forms, by
	// every role that reads runs, are permissions violations.
	direct := "$JS.API.DIRECT.GET." + n.ParkedStream()
	for _, role := range []string{"submitter", "approver", "observer"} {
		nc, log := f.NATS(t, role)
		got, err := nc.SubscribeSync(nc.NewRespInbox())
		if err != nil {
			t.Fatal(err)
		}
		last := direct + "." + n.Parked(rec.Queue, req.ID)
		if err := nc.PublishRequest(direct, got.Subject, []byte(`{"seq":`+seq+`}`)); err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishRequest(last, got.Subject, nil); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		for _, subj := range []string{direct + `"`, last} { // the quote: not the other's prefix
			if !f.Log.Violation(role, subj) {
				t.Errorf("a %s asked %s without a permissions violation; client log: %s", role, subj, log.String())
			}
		}
		if m, err := got.NextMsg(500 * time.Millisecond); err == nil && len(m.Data) > 0 {
			t.Fatalf("a %s read a parked run's kept request by direct get: %s", role, m.Data)
		}
	}
	waitRunsEmpty(t, f, rec.Queue, 30*time.Second)
	if cur := waitRecord(t, attacker, req.ID, func(*bus.RunRecord) bool { return true }); cur.Parked == nil || cur.Revision != rec.Revision {
		t.Fatalf("after the forged wake the record is %+v (parked at revision %d)", cur, rec.Revision)
	}
	if !strings.Contains(f.WorkerLog.String(), "wake the run's record does not confirm") {
		t.Errorf("the forged wake was not dropped as unconfirmed; worker log:\n%s", f.WorkerLog.String())
	}

	answer(t, approver, req.ID, "c1", bus.DecisionApprove, "alice")
	if fin := ev.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v; events %s", fin, ev.summary())
	}
	if got := results(t, owner, req.ID)["c1"]; got != "42" {
		t.Fatalf("the approved call's result %q; events %s", got, ev.summary())
	}
	if s := ev.summary(); strings.Count(s, "run_started") != 2 || strings.Contains(s, "taken over") {
		t.Fatalf("events %s: want the parked attempt and one woken attempt, the owner's", s)
	}
}

// 1.10: AGENTS_EVENTS allows direct gets, which a resume reads a run's
// events with (one batched get, no consumer). A tool service, which must
// not read runs, tries both direct get forms on a run's events: the
// batched one and the last-by-subject one; each is a permissions
// violation and brings nothing. A follower (observer) still reads the
// run's last event, which the Go client now asks by direct get.
func TestEventsDirectGetIsNotAToolServiceRead(t *testing.T) {
	f := startFleet(t, &worker.Config{})
	sub, observer := f.Connect(t, "submitter"), f.Connect(t, "observer")
	c := ctx(t, 30*time.Second)
	req := fauxRun("direct-victim", "secret prompt", fleettest.Text("secret answer"))
	if _, err := sub.Submit(c, "", req); err != nil {
		t.Fatal(err)
	}
	if tr, err := sub.LoadTranscript(c, req.ID); err != nil || !tr.Done() {
		t.Fatalf("run: %v", err)
	}
	n := sub.Names()
	nc, log := f.NATS(t, "toolservice")
	got, err := nc.SubscribeSync(nc.NewRespInbox())
	if err != nil {
		t.Fatal(err)
	}
	batched := "$JS.API.DIRECT.GET." + n.EventsStream()
	last := batched + "." + n.Events(req.ID)
	body := `{"seq":1,"next_by_subj":"` + n.Events(req.ID) + `","batch":100}`
	if err := nc.PublishRequest(batched, got.Subject, []byte(body)); err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(last, got.Subject, nil); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	for _, subj := range []string{batched, last} {
		if !f.Log.Violation("toolservice", subj) {
			t.Errorf("a tool service asked %s without a permissions violation; client log: %s", subj, log.String())
		}
	}
	if m, err := got.NextMsg(time.Second); err == nil && len(m.Data) > 0 {
		t.Fatalf("a tool service read a run's event: %s", m.Data)
	}
	s, err := observer.JetStream().Stream(c, n.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	if !s.CachedInfo().Config.AllowDirect {
		t.Fatal("AGENTS_EVENTS does not allow direct gets")
	}
	if m, err := s.GetLastMsgForSubject(c, n.Events(req.ID)); err != nil || !strings.Contains(string(m.Data), "run_finished") {
		t.Fatalf("an observer's read of the run's last event: %v", err)
	}
}
