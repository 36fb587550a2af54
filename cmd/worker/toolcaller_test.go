package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/internal/rolefleet"
)

// startWorker runs the worker binary's run with args until the test ends.
func startWorker(t *testing.T, args ...string) *logbuf.Buffer {
	t.Helper()
	var out logbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan started, 1)
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"--metrics-addr", "", "--log-format", "json", "--ack-wait", "5s"}, args...), &out, ready)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("worker exit %d:\n%s", code, out.String())
			}
		case <-time.After(20 * time.Second):
			t.Error("worker did not stop")
		}
	})
	select {
	case <-ready:
	case code := <-done:
		done <- code
		t.Fatalf("worker exited %d:\n%s", code, out.String())
	case <-time.After(20 * time.Second):
		t.Fatal("worker not ready")
	}
	return &out
}

// With --tools-user the worker discovers and calls tool services as its
// tool caller: on a server whose worker user may not publish there at all
// (accounts.conf without the worker's two tool lines, as it advises once
// every worker has a tool caller), a run's call is answered. Without it,
// the worker warns at its start.
func TestToolCallerConnection(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("OPENAI_BASE_URL", "")
	t.Setenv("NATS_URL", "")
	conf, err := os.ReadFile("../../deploy/nats/accounts.conf")
	if err != nil {
		t.Fatal(err)
	}
	const workerTools = "      \"$SRV.INFO\"\n      \"agents.tools.>\"\n"
	if strings.Count(string(conf), workerTools) != 1 {
		t.Fatalf("accounts.conf: the worker's tool grants %q not found once", workerTools)
	}
	path := filepath.Join(t.TempDir(), "accounts.conf")
	if err := os.WriteFile(path, []byte(strings.Replace(string(conf), workerTools, "", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := rolefleet.Start(t, path)

	ts := srv.Connect(t, "toolservice")
	svc, err := micro.AddService(ts.Conn(), micro.Config{Name: "calc", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	if err := svc.AddGroup("agents.tools.calc").AddEndpoint("add", micro.HandlerFunc(func(r micro.Request) { _ = r.Respond([]byte("3")) }),
		micro.WithEndpointMetadata(map[string]string{"description": "Add.", "schema": `{"type":"object"}`})); err != nil {
		t.Fatal(err)
	}

	t.Setenv("NATS_PASSWORD", srv.Passwords["worker"])
	t.Setenv("AGENTS_TOOLS_PASSWORD", srv.Passwords["toolcaller"])
	log := startWorker(t, "--nats", srv.URL, "--user", "worker", "--tool-services", "calc", "--tools-user", "toolcaller", "--worker-id", "with-caller")
	sub := srv.Connect(t, "submitter")
	ctx := fleettest.Context(t)
	req := fleettest.FauxRun("add", fleettest.ToolCall("c1", "calc__add", map[string]any{}), fleettest.Text("done"))
	req.Tools = []string{"calc__add"}
	res, err := sub.Submit(ctx, "", req)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := sub.LoadTranscript(ctx, res.ID)
	if err != nil || !tr.Done() || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("run: %v %+v", err, tr.Finished)
	}
	var result *agent.Message
	for i := range tr.Messages {
		if tr.Messages[i].Role == agent.RoleToolResult {
			result = &tr.Messages[i]
		}
	}
	if result == nil || result.IsError || result.TextOf() != "3" {
		t.Errorf("the call through the tool caller: %+v\n%s", result, log.String())
	}
	if !strings.Contains(log.String(), "tool services are called on a connection of their own") || strings.Contains(log.String(), "own NATS connection and permissions") {
		t.Errorf("log:\n%s", log.String())
	}
	if lines := srv.Log.Lines("Violation", `user:worker"`); len(lines) > 0 {
		t.Errorf("the worker user was refused: %v", lines)
	}

	// Without a tool caller: a warning at the start.
	log = startWorker(t, "--nats", srv.URL, "--user", "worker", "--tool-services", "calc", "--worker-id", "without-caller")
	if n := strings.Count(log.String(), "tool services are called with the worker's own NATS connection and permissions"); n != 1 {
		t.Errorf("the warning appears %d times:\n%s", n, log.String())
	}
}
