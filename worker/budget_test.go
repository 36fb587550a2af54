package worker_test

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/llm/openai"
	"github.com/agentfleet/agentfleet/worker"
)

// pricedFleet is a worker on the provider with model m at $1,000 per
// million tokens (a tenth of a cent a token) and model free without prices.
func pricedFleet(t *testing.T, p *limitedProvider) *fleettest.Fleet {
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	f := newFleet(t)
	prov, err := openai.New(openai.Config{BaseURL: srv.URL + "/v1", Models: []openai.ModelInfo{
		{ID: "m", MaxTokens: 50, Cost: agent.ModelCost{Input: 1000, Output: 1000}}, {ID: "free"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prov.CloseIdleConnections)
	f.StartWorker(worker.Config{DefaultModel: "openai/m", Providers: map[string]worker.Provider{"openai": prov}})
	return f
}

func TestMaxCostUsd(t *testing.T) {
	t.Parallel()
	t.Run("refused before the call", func(t *testing.T) {
		p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
		f := pricedFleet(t, p)
		id := f.Submit("", &bus.RunRequest{Prompt: "what is 6*7?", Tools: []string{"calculator"}, Limits: &bus.Limits{MaxCostUsd: 0.01}})
		fin := f.WaitFinished(id)
		if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonBudgetExceeded {
			t.Fatalf("finished %s/%s (%s), want failed/budget_exceeded", fin.Status, fin.Reason, fin.Error)
		}
		if _, calls, _ := p.stats(); calls != 0 {
			t.Fatalf("%d model calls, want none: the first call's worst case (50 output tokens alone) is over the budget", calls)
		}
	})
	t.Run("stopped after the call that crossed it", func(t *testing.T) {
		p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute, extra: 2000}
		f := pricedFleet(t, p)
		id := f.Submit("", &bus.RunRequest{Prompt: "what is 6*7?", Tools: []string{"calculator"}, Limits: &bus.Limits{MaxCostUsd: 1}})
		fin := f.WaitFinished(id)
		if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonBudgetExceeded {
			t.Fatalf("finished %s/%s (%s), want failed/budget_exceeded", fin.Status, fin.Reason, fin.Error)
		}
		if _, calls, _ := p.stats(); calls != 1 {
			t.Fatalf("%d model calls, want 1", calls)
		}
		if fin.Cost <= 1 {
			t.Fatalf("run_finished cost %v, want what was spent (over $1)", fin.Cost)
		}
		tr := f.Transcript(id)
		last := tr.Messages[len(tr.Messages)-1]
		if last.Role != agent.RoleToolResult {
			t.Fatalf("last message %s, want the tool result of the turn that crossed the budget", last.Role)
		}
	})
	t.Run("model without prices is a bad request", func(t *testing.T) {
		p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
		f := pricedFleet(t, p)
		id := f.Submit("", &bus.RunRequest{Model: &bus.ModelRef{Provider: "openai", ID: "free"}, Prompt: "hi", Limits: &bus.Limits{MaxCostUsd: 1}})
		fin := f.WaitFinished(id)
		if fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, "maxCostUsd") {
			t.Fatalf("finished %s/%s (%s), want a bad request naming maxCostUsd", fin.Status, fin.Reason, fin.Error)
		}
	})
	t.Run("negative is a bad request", func(t *testing.T) {
		req := &bus.RunRequest{Prompt: "hi", Limits: &bus.Limits{MaxCostUsd: -1}}
		if err := req.Validate(""); err == nil || !strings.Contains(err.Error(), "maxCostUsd") {
			t.Fatalf("validate: %v", err)
		}
	})
}
