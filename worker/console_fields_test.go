package worker

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/llm/openai"
)

// What protocol 1.8 adds for clients such as the web console: the
// record's title and tenant from pickup on, the tool's schema in
// tool_approval_requested, the models in the presence.

func TestRecordCarriesTitleAndTenantFromPickup(t *testing.T) {
	t.Parallel()
	_, c := startInternal(t, Config{Concurrency: 4}, nil)
	slow := func() *bus.FauxScript {
		return &bus.FauxScript{TokenSize: 1, TokensPerSecond: 20, Responses: []agent.ScriptedResponse{{Content: []agent.Content{agent.Text("slowly, slowly")}}}}
	}
	long := strings.Repeat("é", 150) // 300 bytes
	cases := []struct {
		req         *bus.RunRequest
		title, tent string
	}{
		{&bus.RunRequest{Prompt: "\n   \n  Summarise the notes  \nsecond line", Metadata: map[string]string{"tenant": "acme"}}, "Summarise the notes", "acme"},
		{&bus.RunRequest{Prompt: "the prompt", Metadata: map[string]string{"title": "Nightly report", "team": "x"}}, "Nightly report", ""},
		{&bus.RunRequest{Prompt: long}, strings.Repeat("é", 98) + "…", ""},
	}
	for _, tc := range cases {
		tc.req.Model, tc.req.Faux = fauxModel, slow()
		run := submitRun(t, c, tc.req)
		// The first record (the pickup's, before any turn) has them.
		rec := waitRecord(t, c, run, "running", func(r *bus.RunRecord) bool { return r.State == bus.StateRunning })
		if rec.Title != tc.title || rec.Tenant != tc.tent || rec.Turns != 0 {
			t.Errorf("run %s: record at pickup has title %q tenant %q (turns %d), want %q %q", run, rec.Title, rec.Tenant, rec.Turns, tc.title, tc.tent)
		}
		if len(rec.Title) > bus.MaxTitleBytes {
			t.Errorf("title of %d bytes", len(rec.Title))
		}
		done := waitRecord(t, c, run, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
		if done.Title != tc.title || done.Tenant != tc.tent {
			t.Errorf("run %s: final record has title %q tenant %q", run, done.Title, done.Tenant)
		}
	}
}

func TestApprovalRequestCarriesTheToolSchema(t *testing.T) {
	t.Parallel()
	_, c, _ := approvalWorker(t, Config{Concurrency: 2})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	re := followRun(t, c, run)
	req := re.waitFor(t, bus.EventToolApprovalRequested, 1).Approval
	var schema struct {
		Type       string                     `json:"type"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(req.Parameters, &schema); err != nil || schema.Type != "object" || schema.Properties["target"] == nil {
		t.Errorf("tool_approval_requested parameters %s (%v), want deploy's schema", req.Parameters, err)
	}
	// bus reads it into the pending call.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pending, err := c.PendingOf(ctx, run)
	if err != nil || len(pending) != 1 || string(pending[0].Parameters) != string(req.Parameters) {
		t.Errorf("PendingOf: %v %+v", err, pending)
	}
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "deny", "reason": "test over"})
	re.finished(t)

	big := &agent.Tool{Name: "big", Parameters: json.RawMessage(`{"type":"object","description":"` + strings.Repeat("x", bus.MaxApprovalSchemaBytes) + `"}`)}
	if got := approvalSchema(big); got != nil {
		t.Errorf("a schema over MaxApprovalSchemaBytes is sent (%d bytes)", len(got))
	}
}

func TestPresenceListsTheModelTables(t *testing.T) {
	t.Parallel()
	p, err := openai.New(openai.Config{BaseURL: "http://127.0.0.1:1/v1", APIKey: "k",
		Models: []openai.ModelInfo{{ID: "small"}, {ID: "large"}}})
	if err != nil {
		t.Fatal(err)
	}
	_, c := startInternal(t, Config{Providers: map[string]Provider{"openai": p}, DefaultModel: "openai/small", WorkerID: "models-worker"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := c.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, "models-worker")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e := <-w.Updates():
			var ws bus.WorkerPresence
			if e == nil || json.Unmarshal(e.Value(), &ws) != nil {
				continue
			}
			if want := []string{"openai/large", "openai/small"}; !slices.Equal(ws.Models, want) || ws.DefaultModel != "openai/small" {
				t.Fatalf("presence models %q default %q, want %q and openai/small", ws.Models, ws.DefaultModel, want)
			}
			return
		case <-ctx.Done():
			t.Fatal("no presence entry")
		}
	}
}
