package deploy

import (
	"context"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/budget"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestAccountsBudgets proves the grants of KV agents_budgets: a worker
// with the worker credentials creates it (EnsureStreams) and reserves and
// settles spending in it; an observer lists it (submit budgets) but cannot
// write it; no other role can read or write it.
func TestAccountsBudgets(t *testing.T) {
	url, pw := accountsServer(t)
	wc := connectAs(t, url, "worker", pw["worker"])
	other := connectAs(t, url, "worker", pw["worker"])
	obs := connectAs(t, url, "observer", pw["observer"])
	sub := connectAs(t, url, "submitter", pw["submitter"])
	ts := connectAs(t, url, "toolservice", pw["toolservice"])
	con := connectAs(t, url, "console", pw["console"])

	b := &budget.Budgets{Period: time.Hour, Default: &budget.Tenant{USD: 5}}
	fleettest.RunWorker(t, worker.Config{Client: wc, DrainTimeout: 2 * time.Second, WorkerID: "acl-budgets-worker",
		Budgets: &worker.TenantBudgets{Budgets: b}})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := other.Budgets(ctx)
	if err != nil {
		t.Fatalf("worker: budgets bucket: %v", err)
	}
	l, err := budget.NewLedger(kv, budget.LedgerConfig{Worker: "acl-ledger"})
	if err != nil {
		t.Fatal(err)
	}
	acct := budget.AccountAt("acme", *b.Default, b.Period, time.Now())
	res, _, err := l.Reserve(ctx, acct, 1)
	if err != nil || res == nil {
		t.Fatalf("worker: reserve: %v", err)
	}
	if err := res.Settle(ctx, 0.5); err != nil {
		t.Fatalf("worker: settle: %v", err)
	}

	okv, err := obs.Budgets(ctx)
	if err != nil {
		t.Fatalf("observer: budgets bucket: %v", err)
	}
	es, err := budget.List(ctx, okv)
	if err != nil || len(es) != 1 || es[0].Tenant != "acme" || es[0].SpentUSD != 0.5 {
		t.Fatalf("observer: list: %+v %v", es, err)
	}
	key := budget.Key("acme", acct.Start)
	{
		dctx, cancel := deny()
		_, err := okv.Put(dctx, key, []byte(`{}`))
		cancel()
		denied(t, obs, "observer resets a tenant's spending", "$KV.agents_budgets."+key, err)
	}
	for role, c := range map[string]*bus.Client{"submitter": sub, "toolservice": ts, "console": con} {
		{
			dctx, cancel := deny()
			_, err := c.Budgets(dctx)
			cancel()
			denied(t, c, role+" opens the budgets bucket", "$JS.API.STREAM.INFO.KV_agents_budgets", err)
		}
		{
			dctx, cancel := deny()
			_, err := c.JetStream().Publish(dctx, "$KV.agents_budgets."+key, []byte(`{}`))
			cancel()
			denied(t, c, role+" resets a tenant's spending", "$KV.agents_budgets."+key, err)
		}
		{
			dctx, cancel := deny()
			_, err := c.JetStream().Stream(dctx, "KV_agents_budgets")
			cancel()
			denied(t, c, role+" reads the budgets stream", "$JS.API.STREAM.INFO.KV_agents_budgets", err)
		}
	}
}
