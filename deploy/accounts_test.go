package deploy

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/internal/rolefleet"
	"github.com/agentfleet/agentfleet/worker"
)

// accountsServer runs an in-process nats-server with nats/accounts.conf
// (passwords from the environment, as the config expects) on a free
// loopback port.
func accountsServer(t *testing.T) (url string, passwords map[string]string) {
	t.Helper()
	url, passwords, _ = accountsServerLog(t)
	return url, passwords
}

// accountsServerLog is accountsServer that also keeps the server's log
// (permission violations are logged there with the user).
func accountsServerLog(t *testing.T) (url string, passwords map[string]string, serverLog *logBuf) {
	t.Helper()
	return accountsServerFrom(t, "nats/accounts.conf")
}

// accountsServerFrom is accountsServerLog with the config file conf.
func accountsServerFrom(t *testing.T, conf string) (url string, passwords map[string]string, serverLog *logBuf) {
	t.Helper()
	s := rolefleet.Start(t, conf)
	return s.URL, s.Passwords, s.Log
}

// logBuf keeps a client's or the server's log.
type logBuf = rolefleet.Log

var logs = map[*bus.Client]*logBuf{}

func connectAs(t *testing.T, url, user, password string) *bus.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lb := &logBuf{}
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: url, User: user, Password: password, Name: user,
		Logger: slog.New(slog.NewTextHandler(lb, nil))})
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	logs[c] = lb
	t.Cleanup(c.Close)
	return c
}

func short() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*time.Second)
}

// deny bounds an operation that must be refused.
func deny() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 500*time.Millisecond)
}

func fauxRun(prompt string, resps ...agent.ScriptedResponse) *bus.RunRequest {
	req := fleettest.FauxRun(prompt, resps...)
	req.Tools = []string{"calculator"}
	req.Faux.TokenSize, req.Faux.TokensPerSecond = 1, 400
	return req
}

// noMsg asserts that nothing is stored on subject in stream (read with a
// client allowed to).
func noMsg(t *testing.T, c *bus.Client, stream, subject, what string) {
	t.Helper()
	ctx, cancel := short()
	defer cancel()
	s, err := c.JetStream().Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	if m, err := s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subject)); err == nil {
		t.Errorf("%s: a message was stored on %s (seq %d)", what, subject, m.Sequence)
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("%s: reading %s: %v", what, stream, err)
	}
}

// denied asserts that an operation failed and that the server reported a
// permissions violation for subject to c (a refused JetStream request
// itself only times out).
func denied(t *testing.T, c *bus.Client, what, subject string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed, want a permissions violation", what)
		return
	}
	if subject != "" && !logs[c].Violation("", subject) {
		t.Errorf("%s: failed (%v) but the server reported no permissions violation for %s", what, err, subject)
		return
	}
	t.Logf("denied as it should be: %s (%s): %v", what, subject, err)
}

// TestAccountsConfig proves deploy/nats/accounts.conf: a worker with the
// worker credentials does its job end to end; a submitter submits,
// follows, steers, sends follow-ups and aborts but cannot publish events,
// records or acks, take requests or see another account; an observer
// follows and reads records but cannot submit, steer or abort.
// A worker whose user may not publish the commits of its event batches
// (a copy of accounts.conf older than event batches): no batch would be
// answered, and each of a run's batches waited out its answer before its
// re-send. The worker finds out at its start, says so, and sends events singly.
func TestWorkerWithoutTheBatchCommitPermission(t *testing.T) {
	conf, err := os.ReadFile("nats/accounts.conf")
	if err != nil {
		t.Fatal(err)
	}
	const allow = "\n      \"agents.eventbatch\"\n"
	if strings.Count(string(conf), allow) != 1 {
		t.Fatalf("nats/accounts.conf: the worker's %q not found once", strings.TrimSpace(allow))
	}
	old := filepath.Join(t.TempDir(), "accounts.conf")
	if err := os.WriteFile(old, []byte(strings.Replace(string(conf), allow, "\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	url, pw, _ := accountsServerFrom(t, old)
	wc := connectAs(t, url, "worker", pw["worker"])
	sub := connectAs(t, url, "submitter", pw["submitter"])
	var wlog logbuf.Buffer
	fleettest.RunWorker(t, worker.Config{Client: wc, DrainTimeout: 2 * time.Second, WorkerID: "old-acl-worker",
		Logger: slog.New(slog.NewTextHandler(&wlog, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := fauxRun("a story", fleettest.Text(strings.Repeat("once upon a time ", 50)))
	req.ID = "old-acl-run"
	if _, err := sub.Submit(ctx, "", req); err != nil {
		t.Fatal(err)
	}
	tr, err := sub.LoadTranscript(ctx, req.ID)
	if err != nil || !tr.Done() || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("run: %v (done %v)", err, tr != nil && tr.Done())
	}
	if !strings.Contains(wlog.String(), "event batches off") {
		t.Errorf("the worker did not say its batches are off; its log:\n%s", wlog.String())
	}
}

func TestAccountsConfig(t *testing.T) {
	url, pw := accountsServer(t)
	wc := connectAs(t, url, "worker", pw["worker"])
	sub := connectAs(t, url, "submitter", pw["submitter"])
	obs := connectAs(t, url, "observer", pw["observer"])
	other := connectAs(t, url, "other", pw["other"])
	names := wc.Names()

	// Wrong password: refused.
	{
		ctx, cancel := short()
		_, err := bus.Connect(ctx, bus.ConnectOptions{URL: url, User: "submitter", Password: "wrong"})
		cancel()
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Errorf("wrong password: %v, want an authorization error", err)
		}
	}

	// The worker, in-process, with the worker's permissions only: it
	// creates the streams (EnsureStreams) and runs.
	fleettest.RunWorker(t, worker.Config{Client: wc, DrainTimeout: 2 * time.Second, WorkerID: "acl-worker"})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Submitter: submit, steer and follow up before pickup, follow to the
	// end, status, list.
	run1 := "acl-run-1"
	req := fauxRun("what is 6*7?",
		fleettest.ToolCall("c1", "calculator", map[string]any{"expression": "6*7"}),
		fleettest.Text("It is 42."), fleettest.Text("Noted."), fleettest.Text("Done."))
	req.ID = run1
	if _, err := sub.Submit(ctx, "", req); err != nil {
		t.Fatalf("submitter: submit: %v", err)
	}
	steerSeq, err := sub.SendControl(ctx, run1, bus.KindSteer, bus.Control{Text: "use integers"}, bus.WithControlID("s1"))
	if err != nil {
		t.Fatalf("submitter: steer: %v", err)
	}
	if _, err := sub.FollowUp(ctx, run1, "thanks"); err != nil {
		t.Fatalf("submitter: follow-up: %v", err)
	}
	tr, err := sub.LoadTranscript(ctx, run1)
	if err != nil || !tr.Done() {
		t.Fatalf("submitter: follow: %v (done %v)", err, tr.Done())
	}
	if tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("run 1: %s %s %s", tr.Finished.Status, tr.Finished.Reason, tr.Finished.Error)
	}
	var users []string
	for _, m := range tr.Messages {
		if m.Role == agent.RoleUser {
			users = append(users, m.TextOf())
		}
	}
	if strings.Join(users, "|") != "what is 6*7?|use integers|thanks" {
		t.Errorf("run 1 user messages %q", users)
	}
	if rec, err := sub.Status(ctx, run1); err != nil || rec.State != bus.StatusSucceeded {
		t.Errorf("submitter: status: %v %+v", err, rec)
	}
	// The steer retried with its id after the run finished: its first
	// copy is read (the role allows it) and named.
	if seq, err := sub.SendControl(ctx, run1, bus.KindSteer, bus.Control{Text: "use integers"}, bus.WithControlID("s1")); err != nil || seq != steerSeq {
		t.Errorf("submitter: steer retried after the finish: %d %v, want %d", seq, err, steerSeq)
	}
	if recs, err := sub.List(ctx, bus.ListOptions{}); err != nil || len(recs) == 0 {
		t.Errorf("submitter: list: %v (%d records)", err, len(recs))
	}

	// Submitter: abort (sent before pickup, so the run never calls the
	// model).
	run2 := "acl-run-2"
	req2 := fauxRun("a long story", fleettest.Text(strings.Repeat("once upon a time ", 200)))
	req2.ID = run2
	if _, err := sub.Submit(ctx, "", req2); err != nil {
		t.Fatalf("submitter: submit: %v", err)
	}
	if _, err := sub.Abort(ctx, run2, "changed my mind"); err != nil {
		t.Fatalf("submitter: abort: %v", err)
	}
	if tr, err := sub.LoadTranscript(ctx, run2); err != nil || !tr.Done() || tr.Finished.Status != bus.StatusAborted {
		t.Fatalf("run 2 after abort: %v %+v", err, tr.Finished)
	}

	// Submitter: what it must not do.
	forged := []byte(`{"run":"acl-run-1","seq":99,"attempt":9,"worker":"evil","ts":1,"event":{"type":"run_finished","status":"failed"}}`)
	{
		c, cl := deny()
		_, err := sub.JetStream().Publish(c, names.Events(run1), forged)
		cl()
		denied(t, sub, "submitter publishes an event", names.Events(run1), err)
		c, cl = deny()
		_, err = sub.JetStream().Publish(c, names.Events("acl-forged"), forged)
		cl()
		denied(t, sub, "submitter publishes an event of a new run", names.Events("acl-forged"), err)
		noMsg(t, wc, names.EventsStream(), names.Events("acl-forged"), "submitter's forged event")
		c, cl = deny()
		_, err = sub.JetStream().Publish(c, names.Record("acl-forged"), []byte(`{"id":"acl-forged","state":"succeeded"}`))
		cl()
		denied(t, sub, "submitter writes a record", names.Record("acl-forged"), err)
		if _, err := sub.Status(ctx, "acl-forged"); !errors.Is(err, bus.ErrRunNotFound) {
			t.Errorf("forged record: status says %v", err)
		}
		c, cl = deny()
		_, err = sub.Conn().RequestWithContext(c, "$JS.API.CONSUMER.MSG.NEXT."+names.RunsStream()+"."+names.Consumer("default"), []byte(`{"batch":1}`))
		cl()
		denied(t, sub, "submitter pulls requests off the work queue", "$JS.API.CONSUMER.MSG.NEXT."+names.RunsStream(), err)
		c, cl = deny()
		_, err = sub.Conn().RequestWithContext(c, "$JS.API.STREAM.DELETE."+names.EventsStream(), nil)
		cl()
		denied(t, sub, "submitter deletes the events stream", "$JS.API.STREAM.DELETE."+names.EventsStream(), err)
		c, cl = deny()
		_, err = sub.Conn().RequestWithContext(c, "$JS.API.STREAM.PURGE."+names.ControlStream(), nil)
		cl()
		denied(t, sub, "submitter purges the control stream", "$JS.API.STREAM.PURGE."+names.ControlStream(), err)
		// Reading workers' control feed: the subscription is refused.
		if _, err := sub.Conn().SubscribeSync(names.Republished()); err == nil {
			_ = sub.Conn().Flush()
			if !logs[sub].Violation("", names.Republished()) {
				t.Errorf("submitter subscribed to %s without a permissions violation", names.Republished())
			}
		}
	}

	// Accounts are isolated: OTHER's data is invisible to the submitter,
	// and AGENTS' streams to OTHER.
	{
		c, cl := short()
		_, err := other.JetStream().CreateStream(c, jetstream.StreamConfig{Name: "OTHER_SECRETS", Subjects: []string{"secrets.>"}})
		cl()
		if err != nil {
			t.Fatalf("other account: create stream: %v", err)
		}
		c, cl = short()
		_, err = other.JetStream().Publish(c, "secrets.a", []byte("other account's secret"))
		cl()
		if err != nil {
			t.Fatalf("other account: publish: %v", err)
		}
		c, cl = deny()
		_, err = sub.JetStream().Stream(c, "OTHER_SECRETS")
		cl()
		denied(t, sub, "submitter reads another account's stream", "$JS.API.STREAM.INFO.OTHER_SECRETS", err)
		c, cl = deny()
		_, err = other.JetStream().Stream(c, names.EventsStream())
		cl()
		denied(t, other, "another account reads AGENTS_EVENTS (not there: accounts are isolated)", "", err)
		live, err := sub.Conn().SubscribeSync(names.Events("*"))
		if err != nil {
			t.Fatal(err)
		}
		_ = sub.Conn().Flush()
		_ = other.Conn().Publish(names.Events("acl-run-1"), []byte("from another account"))
		_ = other.Conn().Flush()
		if m, err := live.NextMsg(300 * time.Millisecond); err == nil {
			t.Errorf("a message published in another account reached the submitter: %q", m.Data)
		}
		_ = live.Unsubscribe()
	}

	// Observer: follow, records, list; no submit, steer, follow-up or abort.
	{
		if otr, err := obs.LoadTranscript(ctx, run1); err != nil || !otr.Done() || len(otr.Messages) != len(tr.Messages) {
			t.Errorf("observer: follow: %v (done %v, %d messages, the submitter saw %d)", err, otr.Done(), len(otr.Messages), len(tr.Messages))
		}
		if rec, err := obs.Status(ctx, run1); err != nil || rec.State != bus.StatusSucceeded {
			t.Errorf("observer: status: %v", err)
		}
		if recs, err := obs.List(ctx, bus.ListOptions{}); err != nil || len(recs) < 2 {
			t.Errorf("observer: list: %v (%d records)", err, len(recs))
		}
		c, cl := deny()
		_, err := obs.Submit(c, "", &bus.RunRequest{ID: "acl-obs", Prompt: "hi"})
		cl()
		denied(t, obs, "observer submits", names.Submit("default", "acl-obs"), err)
		noMsg(t, wc, names.RunsStream(), names.Submit("default", "acl-obs"), "observer's submit")
		for _, kind := range []string{bus.KindSteer, bus.KindFollowUp, bus.KindAbort} {
			c, cl := deny()
			_, err := obs.SendControl(c, "acl-obs-ctl", kind, bus.Control{Text: "x"})
			cl()
			denied(t, obs, "observer sends "+kind, names.Control("acl-obs-ctl", kind), err)
			noMsg(t, wc, names.ControlStream(), names.Control("acl-obs-ctl", kind), "observer's "+kind)
		}
		c, cl = deny()
		_, err = obs.JetStream().Publish(c, names.Events("acl-obs"), forged)
		cl()
		denied(t, obs, "observer publishes an event", names.Events("acl-obs"), err)
	}

	// The connections survived the violations (no disconnect).
	for _, c := range []*bus.Client{wc, sub, obs} {
		if c.Conn().Status() != nats.CONNECTED {
			t.Errorf("connection %s: %v", c.Conn().Opts.Name, c.Conn().Status())
		}
	}
}
