package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/budget"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// A worker process with --budgets refuses a tenant without budget at
// pickup and runs another; submit budgets lists both with the limits the
// worker wrote into the ledger, and the spending charged to them.
func TestBudgetsEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "budgets.json")
	if err := os.WriteFile(file, []byte(`{"period": "24h", "tenants": {"acme": {"usd": 0}, "beta": {"usd": 5}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// A priced model (a model without prices runs whatever the budget):
	// its answers report no usage, so they cost their estimate.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	models := filepath.Join(dir, "models.json")
	if err := os.WriteFile(models, []byte(`[{"id": "m", "maxTokens": 100, "cost": {"input": 1, "output": 2}}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	stop, url, err := startWorkerProcess(filepath.Join(dir, "worker.log"), []string{"AGENTS_BUDGETS=" + file,
		"AGENTS_MODELS=" + models, "OPENAI_BASE_URL=" + srv.URL + "/v1", "OPENAI_API_KEY=k", "AGENTS_DEFAULT_MODEL=openai/m"},
		"--nats-listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--worker-id", "e2e-budgets")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("worker: %v", err)
		}
	}()
	nats := func(args ...string) []string { return append([]string{"--nats", url}, args...) }

	out, errOut, code := submit(t, nats("--meta", "tenant=acme", "hello")...)
	if code != 1 {
		t.Fatalf("acme's run: exit %d, want 1 (failed)\n%s\n%s", code, out, errOut)
	}
	expect(t, out+errOut, "budget_exceeded", `tenant "acme" has no budget left`)
	if out, errOut, code := submit(t, nats("--meta", "tenant=beta", "hello")...); code != 0 {
		t.Fatalf("beta's run: exit %d\n%s\n%s", code, out, errOut)
	}

	// Spending charged by another worker shows.
	c := fleettest.Connect(t, url)
	kv, err := c.Budgets(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	var ran float64 // what beta's run was charged: a call without usage costs its estimate
	es, err := budget.List(fleettest.Context(t), kv)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Tenant == "beta" {
			ran = e.SpentUSD
		}
	}
	if ran <= 0 {
		t.Fatalf("beta's run charged $%v, want its estimate", ran)
	}
	l, _ := budget.NewLedger(kv, budget.LedgerConfig{Worker: "other"})
	acct := budget.AccountAt("beta", budget.Tenant{USD: 5}, 24*time.Hour, time.Now())
	res, _, err := l.Reserve(fleettest.Context(t), acct, 2)
	if err != nil || res == nil {
		t.Fatalf("reserve: %v", err)
	}
	if err := res.Settle(fleettest.Context(t), 1.25); err != nil {
		t.Fatal(err)
	}

	js, errOut, code := submit(t, nats("budgets", "--json")...)
	if code != 0 {
		t.Fatalf("budgets --json: exit %d\n%s", code, errOut)
	}
	var lines []struct {
		Tenant                                        string
		Period                                        string
		SpentUSD, LimitUSD, RemainingUSD, ReservedUSD float64
		ResetsAt                                      time.Time
	}
	if err := json.Unmarshal([]byte(js), &lines); err != nil {
		t.Fatalf("%v\n%s", err, js)
	}
	if len(lines) != 2 || lines[0].Tenant != "acme" || lines[1].Tenant != "beta" {
		t.Fatalf("lines %+v", lines)
	}
	_, end := budget.PeriodAt(time.Now(), 24*time.Hour)
	if a := lines[0]; a.LimitUSD != 0 || a.RemainingUSD != 0 || a.Period != "24h" || !a.ResetsAt.Equal(end) {
		t.Fatalf("acme %+v", a)
	}
	spent := ran + 1.25
	if b := lines[1]; b.LimitUSD != 5 || b.SpentUSD != spent || b.RemainingUSD != 5-spent || b.ReservedUSD != 0 {
		t.Fatalf("beta %+v, want $%v spent", b, spent)
	}
	table, errOut, code := submit(t, nats("budgets")...)
	if code != 0 {
		t.Fatalf("budgets: exit %d\n%s", code, errOut)
	}
	expect(t, table, "TENANT", "SPENT", "LIMIT", "REMAINING", "RESETS", "acme", "beta", fmt.Sprintf("$%.4f", spent), "$5.0000",
		fmt.Sprintf("$%.4f", 5-spent), end.Format(time.RFC3339))
}
