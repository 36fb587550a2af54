package deploy

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/toolsource"
	"github.com/agentfleet/agentfleet/worker"
)

// TestAccountsToolSources proves the grants of tool services and worker
// presence: a tool service under agents.tools.<service>, run as its own
// user (toolservice-calc), is discovered and called by a worker through its
// tool caller (user toolcaller, worker --tools-user), the worker's presence
// is readable by an observer, and neither a submitter nor a tool service
// can call tools or forge presence; a service's own user cannot subscribe
// to another service's subjects; the tool caller can do nothing but
// discovery and calls.
func TestAccountsToolSources(t *testing.T) {
	url, pw := accountsServer(t)
	wc := connectAs(t, url, "worker", pw["worker"])
	discovery := connectAs(t, url, "toolcaller", pw["toolcaller"])
	sub := connectAs(t, url, "submitter", pw["submitter"])
	obs := connectAs(t, url, "observer", pw["observer"])
	ts := connectAs(t, url, "toolservice", pw["toolservice"])
	calc := connectAs(t, url, "toolservice-calc", pw["toolservice-calc"])
	text := connectAs(t, url, "toolservice-text", pw["toolservice-text"])

	svc, err := micro.AddService(calc.Conn(), micro.Config{Name: "calc", Version: "1.0.0"})
	if err != nil {
		t.Fatalf("toolservice: add service: %v", err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	err = svc.AddGroup("agents.tools.calc").AddEndpoint("add", micro.HandlerFunc(func(r micro.Request) {
		_ = r.Respond([]byte("3"))
	}), micro.WithEndpointMetadata(map[string]string{"description": "Add.", "schema": `{"type":"object"}`}))
	if err != nil {
		t.Fatalf("toolservice: add endpoint: %v", err)
	}

	src, err := toolsource.NewServices(discovery.Conn(), toolsource.ServiceOptions{Allowed: []string{"calc"}})
	if err != nil {
		t.Fatal(err)
	}
	fleettest.RunWorker(t, worker.Config{Client: wc, DrainTimeout: 2 * time.Second, WorkerID: "acl-tools-worker",
		ToolSources: []toolsource.Source{src}})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := fleettest.FauxRun("add", fleettest.ToolCall("a", "calc__add", map[string]any{}), fleettest.Text("3"))
	req.Tools = []string{"calc__add"}
	res, err := sub.Submit(ctx, "", req)
	if err != nil {
		t.Fatalf("submitter: submit: %v", err)
	}
	tr, err := sub.LoadTranscript(ctx, res.ID)
	if err != nil || !tr.Done() || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("run: %v %+v", err, tr.Finished)
	}
	if i := slices.IndexFunc(tr.Messages, func(m agent.Message) bool { return m.Role == agent.RoleToolResult }); i < 0 ||
		tr.Messages[i].IsError || tr.Messages[i].TextOf() != "3" {
		t.Fatalf("the tool service's result: %+v", tr.Messages)
	}

	// Presence: written by the worker, read by an observer and a submitter.
	for _, c := range []*bus.Client{obs, sub} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			ws, err := c.ListWorkers(ctx)
			if err == nil && len(ws) == 1 && ws[0].Worker == "acl-tools-worker" &&
				slices.ContainsFunc(ws[0].Tools, func(p bus.PresenceTool) bool {
					return p.Name == "calc__add" && p.Source == "service:calc" && p.Available
				}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("presence: %v %+v", err, ws)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// What they must not do.
	{
		ctx, cancel := deny()
		_, err := sub.Conn().RequestWithContext(ctx, "agents.tools.calc.add", []byte(`{}`))
		cancel()
		denied(t, sub, "submitter calls a tool service directly", "agents.tools.calc.add", err)
	}
	{
		ctx, cancel := deny()
		_, err := sub.JetStream().Publish(ctx, "$KV.agents_workers.forged", []byte(`{"worker":"forged"}`))
		cancel()
		denied(t, sub, "submitter forges a worker's presence", "$KV.agents_workers.forged", err)
	}
	{
		ctx, cancel := deny()
		_, err := ts.JetStream().Publish(ctx, "$KV.agents_workers.forged", []byte(`{"worker":"forged"}`))
		cancel()
		denied(t, ts, "tool service forges a worker's presence", "$KV.agents_workers.forged", err)
	}
	{
		ctx, cancel := deny()
		_, err := ts.Conn().RequestWithContext(ctx, "$SRV.INFO", nil)
		cancel()
		denied(t, ts, "tool service runs discovery", "$SRV.INFO", err)
	}
	// One service's user cannot subscribe to another's subjects (take
	// its calls), nor to all of them.
	for c, subject := range map[*bus.Client]string{text: "agents.tools.calc.add", calc: "agents.tools.text.upper"} {
		if _, err := c.Conn().QueueSubscribeSync(subject, "q"); err != nil {
			t.Fatal(err)
		}
		_ = c.Conn().Flush()
		if !logs[c].Violation("", subject) {
			t.Errorf("a service's own user subscribed to %s without a permissions violation", subject)
		}
	}
	if _, err := text.Conn().SubscribeSync("agents.tools.>"); err != nil {
		t.Fatal(err)
	}
	_ = text.Conn().Flush()
	if !logs[text].Violation("", "agents.tools.>") {
		t.Error("toolservice-text subscribed to every service's subjects without a permissions violation")
	}
	// The tool caller: records, the JetStream API, events, presence.
	for _, subject := range []string{"$KV.agents_runs.forged", "$JS.API.STREAM.UPDATE.AGENTS_EVENTS", "$JS.API.STREAM.INFO.AGENTS_EVENTS",
		"agents.run.forged.events", "$KV.agents_workers.forged", "agents.submit.default.forged"} {
		ctx, cancel := deny()
		_, err := discovery.Conn().RequestWithContext(ctx, subject, []byte(`{}`))
		cancel()
		denied(t, discovery, "tool caller publishes on "+subject, subject, err)
	}
	if _, err := discovery.Conn().SubscribeSync("agents.run.*.events"); err != nil {
		t.Fatal(err)
	}
	_ = discovery.Conn().Flush()
	if !logs[discovery].Violation("", "agents.run.*.events") {
		t.Error("a tool caller subscribed to the runs' events without a permissions violation")
	}
	if ws, _ := obs.ListWorkers(ctx); len(ws) != 1 || strings.Contains(ws[0].Worker, "forged") {
		t.Errorf("presence after the forgeries: %+v", ws)
	}
}
