package budget_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/budget"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	b, err := budget.Parse([]byte(`{"period": "24h", "tenants": {"acme": {"usd": 50, "onExhausted": "wait"}, "beta": {"usd": 0}}, "default": {"usd": 5}}`))
	if err != nil {
		t.Fatal(err)
	}
	if b.Period != 24*time.Hour || b.Tenants["acme"] != (budget.Tenant{USD: 50, OnExhausted: budget.Wait}) ||
		b.Tenants["beta"].OnExhausted != budget.Refuse || b.Default == nil || b.Default.USD != 5 {
		t.Fatalf("parsed %+v", b)
	}
	if got, ok := b.For("zeta"); !ok || got.USD != 5 {
		t.Fatalf("default for an unlisted tenant: %+v %v", got, ok)
	}
	if _, ok := (&budget.Budgets{Period: time.Hour, Tenants: map[string]budget.Tenant{}}).For("x"); ok {
		t.Fatal("a tenant with neither its own budget nor a default has one")
	}
}

// A bad file's error lists every problem at once.
func TestParseListsEveryProblem(t *testing.T) {
	_, err := budget.Parse([]byte(`{"period": "daily", "tenants": {"acme": {"usd": -1, "onExhausted": "later"}, "beta": {"dollars": 3}, "": {"usd": 1}}, "default": {"usd": "5"}, "extra": 1}`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`"period" "daily"`, `tenants["acme"]: usd must be 0 or more`, `tenants["acme"]: onExhausted must be "refuse" or "wait"`,
		`tenants["beta"]: unknown field "dollars"`, `tenants["beta"]: usd is required`, `tenants[""]: a tenant name`,
		`"default": usd must be a number`, `unknown field "extra"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	for _, bad := range []string{`[]`, `{"period": "0s", "default": {"usd": 1}}`, `{"period": "24h"}`, `{"default": {"usd": 1}}`} {
		if _, err := budget.Parse([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestPeriodsAreAlignedToTheEpoch(t *testing.T) {
	at := time.Date(2026, 12, 1, 13, 45, 7, 0, time.FixedZone("x", 3600))
	start, end := budget.PeriodAt(at, 24*time.Hour)
	if want := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC); !start.Equal(want) || !end.Equal(want.Add(24*time.Hour)) {
		t.Fatalf("period %v..%v", start, end)
	}
	if start, _ := budget.PeriodAt(at, 7*time.Second); start.UnixMilli()%7000 != 0 {
		t.Fatalf("7s period starts at %v", start)
	}
}

func TestKeysNameOneTenant(t *testing.T) {
	at := time.Unix(1764547200, 0)
	for _, tenant := range []string{"acme", "", "_x", "a.b", "a b", "ünï", strings.Repeat("x", 300)} {
		k := budget.Key(tenant, at)
		if !strings.HasPrefix(k, "1764547200.") || strings.Count(k, ".") != 1 {
			t.Errorf("key %q of %q", k, tenant)
		}
		if got, ok := budget.TenantOfKey(k); !ok || got != tenant {
			t.Errorf("key %q decodes to %q, want %q", k, got, tenant)
		}
	}
	if budget.Key("_x", at) == budget.Key("x", at) {
		t.Fatal("two tenants share a key")
	}
}

// A reservation of a worker that died lapses after its liveness and is
// charged at its worst case: it does not block the budget forever.
func TestReservationOfADeadWorkerLapses(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default"}}})
	ctx := fleettest.Context(t)
	kv, err := f.Client.Budgets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dead, _ := budget.NewLedger(kv, budget.LedgerConfig{Worker: "dead", Liveness: 300 * time.Millisecond})
	live, _ := budget.NewLedger(kv, budget.LedgerConfig{Worker: "live", Liveness: 300 * time.Millisecond})
	acct := budget.AccountAt("acme", budget.Tenant{USD: 1}, time.Hour, time.Now())
	if res, _, err := dead.Reserve(ctx, acct, 0.8); err != nil || res == nil {
		t.Fatalf("reserve: %v", err)
	}
	if res, e, err := live.Reserve(ctx, acct, 0.5); err != nil || res != nil {
		t.Fatalf("a second reservation fit (%v, %+v): the first does not count", err, e)
	}
	// The dead worker never refreshes: once its hold lapses it is charged,
	// and the rest of the budget is free again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err := live.Open(ctx, acct)
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Holds) == 0 {
			if e.SpentUSD < 0.8-1e-9 {
				t.Fatalf("the lapsed hold was dropped, not charged: spent $%v", e.SpentUSD)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead worker's hold did not lapse: %+v", e)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res, _, err := live.Reserve(ctx, acct, 0.2)
	if err != nil || res == nil {
		t.Fatalf("the remaining budget is not free after the lapse: %v", err)
	}
	// A settle corrects a charged reservation to the call's cost.
	if err := res.Settle(ctx, 0.05); err != nil {
		t.Fatal(err)
	}
	if e, _ := live.Open(ctx, acct); len(e.Holds) != 0 || e.SpentUSD < 0.85-1e-9 || e.SpentUSD > 0.85+1e-9 {
		t.Fatalf("after settling: %+v", e)
	}
}

// Only the tenants of the budgets file get their own label.
func TestStatsLabelsAreBounded(t *testing.T) {
	s := budget.NewStats(&budget.Budgets{Period: time.Hour, Tenants: map[string]budget.Tenant{"acme": {USD: 1}}})
	s.Spent("acme", 0.25)
	s.Spent("mallory-1", 1)
	s.Spent("mallory-2", 2)
	s.Refused("acme")
	s.Waited("zeta")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collector("agentfleet"))
	want := `
# HELP agentfleet_tenant_budget_refusals_total Runs and model calls refused because the tenant's budget was spent.
# TYPE agentfleet_tenant_budget_refusals_total counter
agentfleet_tenant_budget_refusals_total{tenant="acme"} 1
# HELP agentfleet_tenant_budget_waits_total Runs that waited for the tenant's next budget period.
# TYPE agentfleet_tenant_budget_waits_total counter
agentfleet_tenant_budget_waits_total{tenant="other"} 1
# HELP agentfleet_tenant_spend_usd_total Cost of model calls charged to tenants' budgets (the model table's prices); tenants outside the budgets file are "other".
# TYPE agentfleet_tenant_spend_usd_total counter
agentfleet_tenant_spend_usd_total{tenant="acme"} 0.25
agentfleet_tenant_spend_usd_total{tenant="other"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

func TestFormatPeriod(t *testing.T) {
	for d, want := range map[time.Duration]string{24 * time.Hour: "24h", 720 * time.Hour: "720h", 90 * time.Minute: "90m", 2 * time.Second: "2s", 1500 * time.Millisecond: "1.5s"} {
		if got := budget.FormatPeriod(d); got != want {
			t.Errorf("%v: %q, want %q", d, got, want)
		}
	}
}
