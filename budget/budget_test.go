package budget_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// lossyKV is the real bucket whose next writes are stored but answered
// with an error, as when NATS's answer is lost.
type lossyKV struct {
	jetstream.KeyValue
	mu   sync.Mutex
	lose int
	// down: after a lost answer NATS answers nothing at all.
	down, isDown bool
}

func (k *lossyKV) lost() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lose > 0 {
		k.lose--
		k.isDown = k.down
		return true
	}
	return false
}

func (k *lossyKV) setDown(d bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.isDown, k.down = d, d
}

func (k *lossyKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	k.mu.Lock()
	down := k.isDown
	k.mu.Unlock()
	if down {
		return nil, nats.ErrTimeout
	}
	return k.KeyValue.Get(ctx, key)
}

func (k *lossyKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := k.KeyValue.Create(ctx, key, value, opts...)
	if err == nil && k.lost() {
		return 0, nats.ErrTimeout
	}
	return rev, err
}

func (k *lossyKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	rev, err := k.KeyValue.Update(ctx, key, value, last)
	if err == nil && k.lost() {
		return 0, nats.ErrTimeout
	}
	return rev, err
}

// A reservation whose write was stored behind lost answers is tried
// again and found: one hold, not an error nor two holds.
func TestBudgetReserveRetriesLostAnswers(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default"}}})
	ctx := fleettest.Context(t)
	kv, err := f.Client.Budgets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lossy := &lossyKV{KeyValue: kv}
	l, _ := budget.NewLedger(lossy, budget.LedgerConfig{Worker: "w"})
	acct := budget.AccountAt("acme", budget.Tenant{USD: 1}, time.Hour, time.Now())
	if _, err := l.Open(ctx, acct); err != nil {
		t.Fatal(err)
	}
	lossy.lose = 1
	res, _, err := l.Reserve(ctx, acct, 0.3)
	if err != nil || res == nil {
		t.Fatalf("reserve: %v %v", res, err)
	}
	e, err := l.Open(ctx, acct)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Holds) != 1 || e.Held() != 0.3 {
		t.Fatalf("holds %+v, want one of $0.3", e.Holds)
	}
	if err := res.Settle(ctx, 0.1); err != nil {
		t.Fatal(err)
	}
	if e, _ := l.Open(ctx, acct); len(e.Holds) != 0 || e.SpentUSD < 0.1-1e-9 || e.SpentUSD > 0.1+1e-9 {
		t.Fatalf("after settling: %+v", e)
	}
}

// A reservation that fails for good (its answers lost past RetryFor)
// leaves a stored hold behind: the ledger removes it, uncharged, once
// NATS answers again, though its worker stays alive.
func TestBudgetFailedReservationReleasesItsHold(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default"}}})
	ctx := fleettest.Context(t)
	kv, err := f.Client.Budgets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lossy := &lossyKV{KeyValue: kv, lose: 1, down: true}
	l, _ := budget.NewLedger(lossy, budget.LedgerConfig{Worker: "w", Liveness: 2 * time.Second, MaxHold: time.Hour, RetryFor: 500 * time.Millisecond})
	acct := budget.AccountAt("acme", budget.Tenant{USD: 1}, time.Hour, time.Now())
	if res, _, err := l.Reserve(ctx, acct, 0.3); err == nil || res != nil {
		t.Fatalf("reserve: %v %v, want an error", res, err)
	}
	reader, _ := budget.NewLedger(kv, budget.LedgerConfig{Worker: "reader", MaxHold: time.Hour})
	// Another of the worker's calls keeps its liveness fresh: the orphan
	// would not lapse.
	lossy.setDown(false)
	keep, _, err := l.Reserve(ctx, acct, 0.1)
	if err != nil || keep == nil {
		t.Fatalf("reserve: %v %v", keep, err)
	}
	e, err := reader.Open(ctx, acct)
	if err != nil || len(e.Holds) != 2 {
		t.Fatalf("holds %+v (%v), want the stored orphan and the live one", e, err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err := reader.Open(ctx, acct)
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Holds) == 1 && e.Holds[0].USD == 0.1 {
			if e.SpentUSD != 0 {
				t.Fatalf("the orphan was charged: %+v", e)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orphan hold stays: %+v", e)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = keep.Settle(ctx, 0)
}

// usd 0 with onExhausted "wait" would wait forever: a bad file.
func TestBudgetFileRejectsWaitingForever(t *testing.T) {
	_, err := budget.Parse([]byte(`{"period": "24h", "tenants": {"acme": {"usd": 0, "onExhausted": "wait"}}}`))
	if err == nil || !strings.Contains(err.Error(), "wait forever") {
		t.Fatalf("err %v, want usd 0 with wait refused", err)
	}
	if _, err := budget.Parse([]byte(`{"period": "24h", "tenants": {"acme": {"usd": 0}}}`)); err != nil {
		t.Fatalf("usd 0 refusing: %v", err)
	}
}

// With KeyTTL every write expires: a period's key goes once no worker has
// written it for the TTL, so the bucket does not grow period by period.
func TestBudgetKeysExpire(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default"}}})
	ctx := fleettest.Context(t)
	kv, err := f.Client.Budgets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bus.BudgetsKeyTTL(ctx, kv) {
		t.Fatal("EnsureStreams did not allow per-message TTLs on the budgets bucket")
	}
	l, _ := budget.NewLedger(kv, budget.LedgerConfig{Worker: "w", KeyTTL: 2 * time.Second, JetStream: f.Client.JetStream()})
	acct := budget.AccountAt("acme", budget.Tenant{USD: 1}, time.Hour, time.Now())
	res, _, err := l.Reserve(ctx, acct, 0.3) // creates the key
	if err != nil || res == nil {
		t.Fatalf("reserve: %v %v", res, err)
	}
	if err := res.Settle(ctx, 0.1); err != nil { // updates it
		t.Fatal(err)
	}
	key := budget.Key("acme", acct.Start)
	if _, err := kv.Get(ctx, key); err != nil {
		t.Fatalf("the key is gone at once: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key did not expire: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A new write starts the period again (from zero: it expired).
	if res, _, err := l.Reserve(ctx, acct, 0.3); err != nil || res == nil {
		t.Fatalf("reserve after expiry: %v %v", res, err)
	}
}

// Writes with a TTL are still compare-and-set: reservations racing from
// two workers neither fail nor pass the limit.
func TestBudgetConcurrentReservesWithKeyTTL(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default"}}})
	ctx := fleettest.Context(t)
	kv, err := f.Client.Budgets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acct := budget.AccountAt("acme", budget.Tenant{USD: 1}, time.Hour, time.Now())
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for _, name := range []string{"a", "b"} {
		l, _ := budget.NewLedger(kv, budget.LedgerConfig{Worker: name, KeyTTL: time.Hour, JetStream: f.Client.JetStream()})
		for range 10 {
			wg.Go(func() {
				res, _, err := l.Reserve(ctx, acct, 0.25)
				if err != nil {
					t.Error(err)
				}
				if res != nil {
					mu.Lock()
					granted++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	if granted != 4 {
		t.Fatalf("%d reservations of $0.25 in $1 granted, want 4", granted)
	}
}

// ListLatest reads each tenant's newest period only.
func TestBudgetListLatest(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default"}}})
	ctx := fleettest.Context(t)
	kv, err := f.Client.Budgets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := budget.NewLedger(kv, budget.LedgerConfig{Worker: "w"})
	now := time.Now()
	for _, at := range []time.Time{now.Add(-2 * time.Hour), now.Add(-time.Hour), now} {
		for _, tenant := range []string{"acme", "a b"} {
			if _, err := l.Open(ctx, budget.AccountAt(tenant, budget.Tenant{USD: 1}, time.Hour, at)); err != nil {
				t.Fatal(err)
			}
		}
	}
	all, err := budget.List(ctx, kv)
	if err != nil || len(all) != 6 {
		t.Fatalf("List: %d entries (%v), want 6", len(all), err)
	}
	latest, err := budget.ListLatest(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	start, _ := budget.PeriodAt(now, time.Hour)
	if len(latest) != 2 || latest[0].Start != start.UnixMilli() || latest[1].Start != start.UnixMilli() {
		t.Fatalf("ListLatest: %+v, want the current period of both tenants", latest)
	}
}
