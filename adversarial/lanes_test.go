//go:build adversarial

package adversarial

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// A submitter claiming a priority it is not granted: the high lane's
// subject is refused by its permissions, and a body claiming high on a
// subject it may use is a bad request, never run as high. Low is allowed.
func TestSubmitterCannotClaimHighPriority(t *testing.T) {
	f := startFleet(t, &worker.Config{})
	sub := f.Connect(t, "submitter")
	c := ctx(t, 2*time.Minute)
	high := fauxRun("claims-high", "hi", fleettest.Text("ok"))
	high.Priority = bus.PriorityHigh
	// A publish the permissions refuse gets no ack: it ends with its bound.
	if _, err := sub.Submit(ctx(t, 3*time.Second), "", high); err == nil {
		t.Fatal("the submitter stored a request on the high lane")
	}
	raw := `{"prompt":"hi","priority":"high"}`
	if _, err := sub.SubmitRaw(c, "", "claims-high-body", []byte(raw)); err != nil {
		t.Fatal(err)
	}
	tr, err := sub.LoadTranscript(c, "claims-high-body")
	for err == nil && !tr.Done() {
		time.Sleep(20 * time.Millisecond) // a transcript is read, not followed
		tr, err = sub.LoadTranscript(c, "claims-high-body")
	}
	if err != nil || tr.Finished.Reason != bus.ReasonBadRequest {
		t.Fatalf("a body claiming high on the normal subject: %v %+v", err, tr)
	}
	low := fauxRun("asks-low", "hi", fleettest.Text("ok"))
	low.Priority = bus.PriorityLow
	if _, err := sub.Submit(c, "", low); err != nil {
		t.Fatalf("low priority: %v", err)
	}
	for env, err := range sub.Follow(c, "asks-low") {
		if err != nil {
			t.Fatal(err)
		}
		if ev, _ := env.Decode(); ev != nil && ev.RunFinished != nil && ev.RunFinished.Status != bus.StatusSucceeded {
			t.Fatalf("low run ended %s: %s", ev.RunFinished.Status, ev.RunFinished.Error)
		}
	}
}

// A submitter of one queue filling a concurrency key (its places and its
// line) with long runs does not hold up another queue's runs of the same
// key: a key belongs to its queue.
func TestKeyOfAnotherQueueCannotBeExhausted(t *testing.T) {
	f := startFleet(t, &worker.Config{Queues: []string{"default", "other"}, Concurrency: 8})
	sub := f.Connect(t, "submitter")
	c := ctx(t, 2*time.Minute)
	for i := range 3 {
		req := sleepingRun(fmt.Sprintf("squatter-%d", i))
		req.Concurrency = &bus.Concurrency{Key: "customer-42", Limit: 1}
		if _, err := sub.Submit(c, "other", req); err != nil {
			t.Fatal(err)
		}
	}
	// The squatters hold the key's place and line on "other": whichever
	// took the place, the two others wait for it.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		waiting := 0
		for i := range 3 {
			r, err := sub.Status(c, fmt.Sprintf("squatter-%d", i))
			if err == nil && r.Waiting != nil && r.Waiting.For == bus.WaitingKey {
				waiting++
			}
		}
		if waiting == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the squatters never filled the key (%d waiting)\n%s", waiting, f.WorkerLog.String())
		}
	}
	victim := fauxRun("victim", "hi", fleettest.Text("ok"))
	victim.Concurrency = &bus.Concurrency{Key: "customer-42", Limit: 1}
	start := time.Now()
	if _, err := sub.Submit(c, "default", victim); err != nil {
		t.Fatal(err)
	}
	for env, err := range sub.Follow(c, "victim") {
		if err != nil {
			t.Fatal(err)
		}
		if ev, _ := env.Decode(); ev != nil && ev.RunFinished != nil && ev.RunFinished.Status != bus.StatusSucceeded {
			t.Fatalf("victim ended %s: %s", ev.RunFinished.Status, ev.RunFinished.Error)
		}
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("the victim waited %v behind another queue's runs of its key", d)
	}
	for i := range 3 {
		_, _ = sub.Abort(c, fmt.Sprintf("squatter-%d", i), "test over")
	}
}

// A key's limit is the smallest its runs ask (docs/protocol.md §3), but
// only among its own queue's runs: a submitter's limit-1 run of the same
// key text on another queue does not lower it.
func TestKeyLimitOfAnotherQueueCannotBeLowered(t *testing.T) {
	f := startFleet(t, &worker.Config{Queues: []string{"default", "other"}, Concurrency: 8})
	sub := f.Connect(t, "submitter")
	c := ctx(t, 2*time.Minute)
	keyed := func(req *bus.RunRequest, limit int) *bus.RunRequest {
		req.Concurrency = &bus.Concurrency{Key: "customer-42", Limit: limit}
		return req
	}
	running := func(id string) {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			if r, err := sub.Status(c, id); err == nil && r.State == bus.StateRunning && r.Parked == nil && r.Waiting == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never ran\n%s", id, f.WorkerLog.String())
			}
		}
	}
	if _, err := sub.Submit(c, "other", keyed(sleepingRun("lowerer"), 1)); err != nil {
		t.Fatal(err)
	}
	running("lowerer")
	if _, err := sub.Submit(c, "default", keyed(sleepingRun("first"), 2)); err != nil {
		t.Fatal(err)
	}
	running("first")
	start := time.Now()
	if _, err := sub.Submit(c, "default", keyed(fauxRun("second", "hi", fleettest.Text("ok")), 2)); err != nil {
		t.Fatal(err)
	}
	for env, err := range sub.Follow(c, "second") {
		if err != nil {
			t.Fatal(err)
		}
		if ev, _ := env.Decode(); ev != nil && ev.RunFinished != nil && ev.RunFinished.Status != bus.StatusSucceeded {
			t.Fatalf("second ended %s: %s", ev.RunFinished.Status, ev.RunFinished.Error)
		}
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("the second run of a limit-2 key waited %v: another queue's limit 1 applied", d)
	}
	for _, id := range []string{"lowerer", "first"} {
		_, _ = sub.Abort(c, id, "test over")
	}
}

// A submitter of one tenant (accounts.conf's SUBMITTER_ACME, its user line
// uncommented as docs/security.md says) cannot submit into another
// tenant's lane, the no-tenant lanes or the old subject: its permissions
// refuse them. A body naming another tenant on its own lane is a bad
// request, and one naming none runs as the subject's tenant.
func TestSubmitterCannotSubmitIntoAnotherTenantsLane(t *testing.T) {
	text, err := os.ReadFile(accountsConf)
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := os.ReadFile(filepath.Join(filepath.Dir(accountsConf), "tenant-submitter.conf.example"))
	if err != nil {
		t.Fatal(err)
	}
	// The example's block before the accounts, its user in AGENTS.
	const pw = "acme-password"
	conf := filepath.Join(t.TempDir(), "accounts.conf")
	s := strings.Replace(string(text), "\naccounts: {", "\n"+string(tenant)+"\naccounts: {", 1)
	s = strings.Replace(s, "    users: [\n", "    users: [\n      {user: submitter-acme, password: \""+pw+"\", permissions: $SUBMITTER_ACME}\n", 1)
	if err := os.WriteFile(conf, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	f := startFleetConf(t, conf, &worker.Config{})
	f.Passwords["submitter-acme"] = pw
	acme := f.Connect(t, "submitter-acme")
	c := ctx(t, 2*time.Minute)
	for _, tenant := range []string{"beta", ""} { // another tenant's lane; the old subject
		req := fauxRun("forged-"+tenant, "hi", fleettest.Text("ok"))
		req.Metadata = map[string]string{"tenant": tenant}
		if _, err := acme.Submit(ctx(t, 3*time.Second), "", req); err == nil {
			t.Errorf("submitter-acme stored a request for tenant %q", tenant)
		}
	}
	for _, l := range []bus.Lane{{Queue: "default", Priority: bus.PriorityNormal, Tenant: bus.NoTenant}, {Queue: "default", Priority: bus.PriorityLow, Tenant: "beta"}} {
		if _, err := acme.SubmitLane(ctx(t, 3*time.Second), l, "forged-lane", []byte(`{"prompt":"hi"}`)); err == nil {
			t.Errorf("submitter-acme stored a request on lane %s/%s", l.Priority, l.Tenant)
		}
	}
	body := `{"prompt":"hi","metadata":{"tenant":"beta"}}`
	if _, err := acme.SubmitLane(c, bus.Lane{Queue: "default", Priority: bus.PriorityNormal, Tenant: "acme"}, "claims-beta", []byte(body)); err != nil {
		t.Fatal(err)
	}
	own := fauxRun("own", "hi", fleettest.Text("ok"))
	if _, err := acme.SubmitLane(c, bus.Lane{Queue: "default", Priority: bus.PriorityNormal, Tenant: "acme"}, "own", mustJSON(t, own)); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"claims-beta": bus.ReasonBadRequest, "own": ""} {
		for env, err := range acme.Follow(c, id) {
			if err != nil {
				t.Fatal(err)
			}
			if ev, _ := env.Decode(); ev != nil && ev.RunFinished != nil && ev.RunFinished.Reason != want {
				t.Errorf("run %s ended %s (%s): %s; want reason %q", id, ev.RunFinished.Status, ev.RunFinished.Reason, ev.RunFinished.Error, want)
			}
		}
	}
	rec, err := acme.Status(c, "own")
	if err != nil || rec.Tenant != "acme" {
		t.Errorf("record of own: %v %+v; want tenant acme", err, rec)
	}
}
