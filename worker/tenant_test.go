package worker_test

import (
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/budget"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/llm/openai"
	"github.com/agentfleet/agentfleet/worker"
)

// tenantMaxTokens is the priced model's output bound: a call's worst case
// is its input estimate plus this many output tokens.
const tenantMaxTokens = 200

// tenantFleet runs workers with budgets on the provider's model m at
// $1,000 per million tokens.
func tenantFleet(t *testing.T, p *limitedProvider, b *budget.Budgets, workers, slots int, stats *budget.Stats) *fleettest.Fleet {
	f, start := tenantWorkers(t, p, b, stats)
	for range workers {
		start(slots)
	}
	return f
}

// tenantWorkers is tenantFleet with the workers started by the caller.
func tenantWorkers(t *testing.T, p *limitedProvider, b *budget.Budgets, stats *budget.Stats) (*fleettest.Fleet, func(slots int) *fleettest.Worker) {
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	f := newFleet(t)
	return f, func(slots int) *fleettest.Worker {
		prov, err := openai.New(openai.Config{BaseURL: srv.URL + "/v1", Models: []openai.ModelInfo{
			{ID: "m", MaxTokens: tenantMaxTokens, Cost: agent.ModelCost{Input: 1000, Output: 1000}}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(prov.CloseIdleConnections)
		return f.StartWorker(worker.Config{DefaultModel: "openai/m", Concurrency: slots,
			Providers: map[string]worker.Provider{"openai": prov},
			Budgets:   &worker.TenantBudgets{Budgets: b, Stats: stats}})
	}
}

// firstCallWorst is the worst case of a tenantRun's first call at $0.001
// a token: everything it sends, with the calculator, and the model's
// output bound.
func firstCallWorst(prompt string) float64 {
	return float64(worker.CallInputTokens(firstCall(prompt))+tenantMaxTokens) / 1000
}

// firstCall is what a tenantRun's first call sends.
func firstCall(prompt string) agent.Context {
	var tools []*agent.Tool
	for _, t := range worker.BuiltinTools() {
		if t.Name == "calculator" {
			tools = append(tools, t)
		}
	}
	return agent.Context{Messages: []agent.Message{agent.UserText(prompt)}, Tools: tools}
}

func ledger(t *testing.T, f *fleettest.Fleet) *budget.Ledger {
	kv, err := f.Client.Budgets(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	l, err := budget.NewLedger(kv, budget.LedgerConfig{Worker: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func entries(t *testing.T, f *fleettest.Fleet) []budget.Entry {
	kv, err := f.Client.Budgets(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	es, err := budget.List(fleettest.Context(t), kv)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

func tenantRun(tenant string) *bus.RunRequest {
	return &bus.RunRequest{Prompt: "what is 6*7?", Tools: []string{"calculator"}, Metadata: map[string]string{"tenant": tenant}}
}

// A tenant whose period's budget is spent is refused at pickup without a
// model call; once the period rolls over its runs are admitted again.
func TestTenantRefusedUntilThePeriodRollsOver(t *testing.T) {
	t.Parallel()
	const period = 2 * time.Second
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	b := &budget.Budgets{Period: period, Tenants: map[string]budget.Tenant{"acme": {USD: 5, OnExhausted: budget.Refuse}}}
	stats := budget.NewStats(b)
	f := tenantFleet(t, p, b, 1, 4, stats)
	l := ledger(t, f)
	ctx := fleettest.Context(t)

	// Spend the whole period's budget, as other runs would have; then
	// submit. A period boundary in between admits the run: try again.
	var id string
	var fin *bus.RunFinished
	for range 5 {
		acct := budget.AccountAt("acme", b.Tenants["acme"], period, time.Now())
		res, e, err := l.Reserve(ctx, acct, 5)
		if err == nil && res == nil && e != nil && e.Remaining() > 0 {
			// A run of the last round, admitted in this new period,
			// spent some of it: spend the rest.
			left := e.Remaining()
			if res, _, err = l.Reserve(ctx, acct, left); err == nil && res != nil {
				err = res.Settle(ctx, left)
				res = nil
			}
		}
		if err != nil {
			t.Fatalf("reserve: %v", err)
		}
		if res != nil {
			if err := res.Settle(ctx, 5); err != nil {
				t.Fatal(err)
			}
		}
		id = f.Submit("", tenantRun("acme"))
		fin = f.WaitFinished(id)
		if fin.Status != bus.StatusSucceeded {
			break
		}
	}
	if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonBudgetExceeded || !strings.Contains(fin.Error, "no budget left") {
		t.Fatalf("finished %s/%s (%s), want failed/budget_exceeded at pickup", fin.Status, fin.Reason, fin.Error)
	}
	if fin.Turns != 0 {
		t.Fatalf("%d turns, want none: refused at pickup", fin.Turns)
	}
	rec, err := f.Client.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != bus.StatusFailed || rec.Reason != bus.ReasonBudgetExceeded {
		t.Fatalf("record %s/%s, want failed/budget_exceeded", rec.State, rec.Reason)
	}
	_, callsBefore, _ := p.stats()

	// Wait for the next period (the state that matters: the clock).
	_, end := budget.PeriodAt(time.Now(), period)
	time.Sleep(time.Until(end))
	id = f.Submit("", tenantRun("acme"))
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("after the rollover: %s/%s (%s), want succeeded", fin.Status, fin.Reason, fin.Error)
	}
	if _, calls, _ := p.stats(); calls == callsBefore {
		t.Fatal("the admitted run made no model call")
	}
	var charged float64
	for _, e := range entries(t, f) {
		if e.Tenant == "acme" && e.Start >= end.UnixMilli() {
			charged += e.SpentUSD
		}
	}
	if charged <= 0 {
		t.Fatalf("the new period's spending is $%v, want the run's cost", charged)
	}
}

// Eight runs of one tenant at once on two workers: every call reserves
// its worst case before it starts, so together they spend at most the
// budget plus one call's worst case, though each alone could afford its
// first call.
func TestTenantConcurrentRunsDoNotOverspend(t *testing.T) {
	t.Parallel()
	worst := firstCallWorst("what is 6*7?")
	limit := 1.5 * worst
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	b := &budget.Budgets{Period: time.Hour, Default: &budget.Tenant{USD: limit, OnExhausted: budget.Refuse}}
	f := tenantFleet(t, p, b, 2, 4, nil)
	ids := make([]string, 8)
	for i := range ids {
		ids[i] = f.Submit("", tenantRun("acme"))
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var spent float64
	refused := 0
	for _, id := range ids {
		wg.Go(func() {
			fin := f.WaitFinished(id)
			mu.Lock()
			defer mu.Unlock()
			spent += fin.Cost
			if fin.Reason == bus.ReasonBudgetExceeded {
				refused++
			}
		})
	}
	wg.Wait()
	_, calls, _ := p.stats()
	t.Logf("limit $%.3f, worst first call $%.3f: %d calls, $%.3f spent, %d runs refused", limit, worst, calls, spent, refused)
	if calls == 0 || refused == 0 {
		t.Fatalf("%d calls, %d refused: the test measures nothing", calls, refused)
	}
	var charged float64
	for _, e := range entries(t, f) {
		if len(e.Holds) > 0 {
			t.Fatalf("holds left after every run finished: %+v", e.Holds)
		}
		if e.SpentUSD > e.LimitUSD+worst {
			t.Fatalf("period %d: spent $%.4f of $%.4f, more than one call's worst case ($%.4f) over", e.Start, e.SpentUSD, e.LimitUSD, worst)
		}
		charged += e.SpentUSD
	}
	if d := charged - spent; d > 1e-9 || d < -1e-9 {
		t.Fatalf("the ledger charged $%.6f, the runs say they spent $%.6f", charged, spent)
	}
}

// With onExhausted "wait" a run of a spent tenant waits for the next
// period, its record saying so, without holding its slot: a run of another
// tenant on the same one-slot worker runs meanwhile. Then it runs, and its
// events say how long it waited.
func TestTenantWaitsForTheNextPeriodWithoutASlot(t *testing.T) {
	t.Parallel()
	const period = 3 * time.Second
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	b := &budget.Budgets{Period: period, Tenants: map[string]budget.Tenant{
		"acme": {USD: 5, OnExhausted: budget.Wait}, "beta": {USD: 100}}}
	stats := budget.NewStats(b)
	f := tenantFleet(t, p, b, 1, 1, stats)
	l := ledger(t, f)
	ctx := fleettest.Context(t)

	// Spend this period's budget and the next one's: the run waits at
	// least one whole period.
	now := time.Now()
	_, next := budget.PeriodAt(now, period)
	for _, at := range []time.Time{now, next} {
		acct := budget.AccountAt("acme", b.Tenants["acme"], period, at)
		res, _, err := l.Reserve(ctx, acct, 5)
		if err != nil || res == nil {
			t.Fatalf("reserve: %v %v", res, err)
		}
		if err := res.Settle(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}
	_, free := budget.PeriodAt(next, period)
	waiter := f.Submit("", tenantRun("acme"))
	for {
		rec, err := f.Client.Status(ctx, waiter)
		if err == nil && rec.State == bus.StateRunning && rec.Waiting != nil && rec.Waiting.For == bus.WaitingBudget {
			break
		}
		if time.Now().After(free) {
			t.Fatalf("the record never showed waiting %q before the budget came back: %+v %v", bus.WaitingBudget, rec, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The only slot is free: another tenant's run goes through while the
	// first one waits.
	other := f.Submit("", tenantRun("beta"))
	if fin := f.WaitFinished(other); fin.Status != bus.StatusSucceeded {
		t.Fatalf("beta's run: %s/%s (%s)", fin.Status, fin.Reason, fin.Error)
	}
	if rec, err := f.Client.Status(ctx, waiter); err != nil || rec.Finished() {
		t.Fatalf("acme's run finished before beta's could start (%+v, %v): its wait held the only slot", rec, err)
	}
	envs := f.Follow(waiter)
	fin := fleettest.Decode(t, envs[len(envs)-1]).RunFinished
	if fin == nil || fin.Status != bus.StatusSucceeded {
		t.Fatalf("acme's run: %+v", fin)
	}
	if time.Now().Before(free) {
		t.Fatal("acme's run finished before its budget came back")
	}
	waited := false
	for _, e := range envs {
		if ev := fleettest.Decode(t, e); ev.ModelWait != nil && ev.ModelWait.Reason == bus.WaitBudget && ev.ModelWait.WaitedMs >= (period-time.Second).Milliseconds() {
			waited = true
		}
	}
	if !waited {
		t.Fatalf("no model_wait (reason budget) of at least a period:\n%s", fleettest.Dump(envs))
	}
}

// spendPeriods spends a tenant's whole budget in the periods containing
// each of at, as other runs would have.
func spendPeriods(t *testing.T, l *budget.Ledger, tenant string, tb budget.Tenant, period time.Duration, at ...time.Time) {
	for _, a := range at {
		acct := budget.AccountAt(tenant, tb, period, a)
		res, _, err := l.Reserve(fleettest.Context(t), acct, tb.USD)
		if err != nil || res == nil {
			t.Fatalf("reserve: %v %v", res, err)
		}
		if err := res.Settle(fleettest.Context(t), tb.USD); err != nil {
			t.Fatal(err)
		}
	}
}

// waitWaiting waits until the run's record shows it waiting for its
// budget, at the latest until deadline.
func waitWaiting(t *testing.T, f *fleettest.Fleet, id string, attempt int, deadline time.Time) *bus.RunRecord {
	t.Helper()
	for {
		rec, err := f.Client.Status(fleettest.Context(t), id)
		if err == nil && rec.State == bus.StateRunning && rec.Attempt >= attempt && rec.Waiting != nil && rec.Waiting.For == bus.WaitingBudget {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("the record of attempt %d never showed waiting %q: %+v %v", attempt, bus.WaitingBudget, rec, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A worker that drains hands a run waiting for its budget back; the next
// worker's attempt goes on waiting (since the same time) and runs it once
// the budget is back.
func TestTenantWaitingRunHandedBackOnDrain(t *testing.T) {
	t.Parallel()
	const period = 4 * time.Second
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	b := &budget.Budgets{Period: period, Tenants: map[string]budget.Tenant{"acme": {USD: 5, OnExhausted: budget.Wait}}}
	f, start := tenantWorkers(t, p, b, nil)
	first := start(1)
	now := time.Now()
	_, next := budget.PeriodAt(now, period)
	spendPeriods(t, ledger(t, f), "acme", b.Tenants["acme"], period, now, next)
	_, free := budget.PeriodAt(next, period)

	id := f.Submit("", tenantRun("acme"))
	rec := waitWaiting(t, f, id, 1, free)
	since := rec.Waiting.Since
	first.Stop()
	start(1)
	rec = waitWaiting(t, f, id, 2, free)
	// The wait goes on from the run's start (the hand-back's last record
	// no longer shows the first wait), not from the second attempt.
	if d := since.Sub(rec.Waiting.Since); d < 0 || d > time.Second {
		t.Fatalf("the second attempt waits since %v, the first since %v", rec.Waiting.Since, since)
	}
	fin := f.WaitFinished(id)
	if fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %s/%s (%s)", fin.Status, fin.Reason, fin.Error)
	}
	if time.Now().Before(free) {
		t.Fatal("the run finished before its budget came back")
	}
}

// With FromQueue the queue is the tenant, whatever the metadata says.
func TestTenantFromQueue(t *testing.T) {
	t.Parallel()
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	f := newFleet(t)
	prov, err := openai.New(openai.Config{BaseURL: srv.URL + "/v1", Models: []openai.ModelInfo{
		{ID: "m", MaxTokens: tenantMaxTokens, Cost: agent.ModelCost{Input: 1000, Output: 1000}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prov.CloseIdleConnections)
	b := &budget.Budgets{Period: time.Hour, Tenants: map[string]budget.Tenant{"other": {USD: 0}, "default": {USD: 100}}}
	f.StartWorker(worker.Config{DefaultModel: "openai/m", Providers: map[string]worker.Provider{"openai": prov},
		Budgets: &worker.TenantBudgets{Budgets: b, FromQueue: true}})
	// The metadata names the queue with budget: it does not count.
	fin := f.WaitFinished(f.Submit("other", tenantRun("default")))
	if fin.Reason != bus.ReasonBudgetExceeded || !strings.Contains(fin.Error, `tenant "other"`) {
		t.Fatalf("a run on queue other: %s/%s (%s), want budget_exceeded for tenant other", fin.Status, fin.Reason, fin.Error)
	}
	if fin := f.WaitFinished(f.Submit("default", tenantRun("other"))); fin.Status != bus.StatusSucceeded {
		t.Fatalf("a run on queue default: %s/%s (%s)", fin.Status, fin.Reason, fin.Error)
	}
}

// A call's worst case counts everything it sends: the tools' schemas
// too. Eight runs with the calculator, whose calls cost far more than
// their messages alone: the tenant spends no more than its budget.
func TestTenantWorstCaseCountsEverythingSent(t *testing.T) {
	t.Parallel()
	const maxTok = 5 // the provider answers 5 tokens: the input is most of a call
	prompt := "what is 6*7?"
	// Three first calls' worth; by their messages alone, ten or more.
	limit := 3 * float64(worker.CallInputTokens(firstCall(prompt))+maxTok) / 1000
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	b := &budget.Budgets{Period: time.Hour, Default: &budget.Tenant{USD: limit}}
	f := tenantFleet(t, p, b, 2, 4, nil)
	ids := make([]string, 8)
	for i := range ids {
		req := tenantRun("acme")
		req.MaxTokens = maxTok
		ids[i] = f.Submit("", req)
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() { f.WaitFinished(id) })
	}
	wg.Wait()
	if _, calls, _ := p.stats(); calls == 0 {
		t.Fatal("no model call: the test measures nothing")
	}
	for _, e := range entries(t, f) {
		t.Logf("limit $%.4f, spent $%.4f", e.LimitUSD, e.SpentUSD)
		if e.SpentUSD > e.LimitUSD+1e-9 {
			t.Fatalf("spent $%.4f of $%.4f: calls cost more than their reservations", e.SpentUSD, e.LimitUSD)
		}
	}
}

// Another run's call in flight holds the whole budget, though it will
// cost a fraction of it. A run picked up meanwhile is neither refused nor
// parked until the period ends: its first call waits (off its slot) for
// the hold to settle, then runs.
func TestTenantFirstCallWaitsForOtherCallsHolds(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{budget.Refuse, budget.Wait} {
		t.Run(mode, func(t *testing.T) {
			p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
			b := &budget.Budgets{Period: time.Hour, Tenants: map[string]budget.Tenant{"acme": {USD: 5, OnExhausted: mode}}}
			f := tenantFleet(t, p, b, 1, 2, nil)
			ctx := fleettest.Context(t)
			acct := budget.AccountAt("acme", b.Tenants["acme"], b.Period, time.Now())
			res, _, err := ledger(t, f).Reserve(ctx, acct, 5) // another run's call in flight
			if err != nil || res == nil {
				t.Fatalf("reserve: %v %v", res, err)
			}
			id := f.Submit("", tenantRun("acme"))
			waitWaiting(t, f, id, 1, time.Now().Add(20*time.Second))
			if err := res.Settle(ctx, 0.001); err != nil {
				t.Fatal(err)
			}
			envs := f.Follow(id)
			fin := fleettest.Decode(t, envs[len(envs)-1]).RunFinished
			if fin == nil || fin.Status != bus.StatusSucceeded {
				t.Fatalf("finished %+v, want succeeded once the hold settled", fin)
			}
			waited := false
			for _, e := range envs {
				if ev := fleettest.Decode(t, e); ev.ModelWait != nil && ev.ModelWait.Reason == bus.WaitBudget {
					waited = true
				}
			}
			if !waited {
				t.Fatalf("no model_wait (reason budget):\n%s", fleettest.Dump(envs))
			}
		})
	}
}

// Runs of a "wait" tenant picked up together all pass the pickup check;
// those whose first call then does not fit wait instead of failing.
func TestTenantWaitModeFirstCallWaits(t *testing.T) {
	t.Parallel()
	worst := firstCallWorst("what is 6*7?")
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	b := &budget.Budgets{Period: time.Hour, Default: &budget.Tenant{USD: 1.5 * worst, OnExhausted: budget.Wait}}
	f := tenantFleet(t, p, b, 1, 8, nil)
	ids := make([]string, 8)
	for i := range ids {
		ids[i] = f.Submit("", tenantRun("acme"))
	}
	ctx := fleettest.Context(t)
	// Every run ends up finished or waiting (the budget pays two first
	// calls an hour); none fails on its first call (it made no call).
	deadline := time.Now().Add(30 * time.Second)
	var settledAt time.Time
	for {
		waiting, done := 0, 0
		for _, id := range ids {
			rec, err := f.Client.Status(ctx, id)
			switch {
			case err != nil:
			case rec.State == bus.StatusFailed && rec.Reason == bus.ReasonBudgetExceeded && rec.Usage.TotalTokens == 0:
				t.Fatalf("run %s of a \"wait\" tenant failed on its first call: %s", id, rec.Error)
			case rec.Finished():
				done++
			case rec.Waiting != nil && rec.Waiting.For == bus.WaitingBudget:
				waiting++
			}
		}
		// Settled: the period's spending leaves no first call room and no
		// call holds any; the waiting runs wait for the next period. They
		// find that out at their next look (every second): watch them for
		// three.
		settled := false
		for _, e := range entries(t, f) {
			settled = len(e.Holds) == 0 && e.SpentUSD+worst > e.LimitUSD
		}
		switch {
		case !settled || done == 0 || waiting == 0 || done+waiting != len(ids):
			settledAt = time.Time{}
		case settledAt.IsZero():
			settledAt = time.Now()
		case time.Since(settledAt) > 3*time.Second:
			t.Logf("%d runs finished, %d wait for the next period", done, waiting)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs finished, %d wait for the budget, of %d", done, waiting, len(ids))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A model without prices costs nothing a budget counts: a tenant at or
// past its limit still runs it, at pickup as at its calls.
func TestTenantAtItsLimitRunsAFreeModel(t *testing.T) {
	t.Parallel()
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	f := newFleet(t)
	prov, err := openai.New(openai.Config{BaseURL: srv.URL + "/v1", Models: []openai.ModelInfo{{ID: "m", MaxTokens: tenantMaxTokens}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prov.CloseIdleConnections)
	b := &budget.Budgets{Period: time.Hour, Tenants: map[string]budget.Tenant{"acme": {USD: 1}, "zero": {USD: 0}}}
	f.StartWorker(worker.Config{DefaultModel: "openai/m", Providers: map[string]worker.Provider{"openai": prov},
		Budgets: &worker.TenantBudgets{Budgets: b}})
	// acme spent more than its budget (a call cost more than reserved).
	ctx := fleettest.Context(t)
	res, _, err := ledger(t, f).Reserve(ctx, budget.AccountAt("acme", b.Tenants["acme"], b.Period, time.Now()), 1)
	if err != nil || res == nil {
		t.Fatalf("reserve: %v %v", res, err)
	}
	if err := res.Settle(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if fin := f.WaitFinished(f.Submit("", tenantRun("zero"))); fin.Status != bus.StatusSucceeded {
		t.Fatalf("a free model's run of a tenant with usd 0: %s/%s (%s), want succeeded", fin.Status, fin.Reason, fin.Error)
	}
	if fin := f.WaitFinished(f.Submit("", tenantRun("acme"))); fin.Status != bus.StatusSucceeded {
		t.Fatalf("a free model's run: %s/%s (%s), want succeeded", fin.Status, fin.Reason, fin.Error)
	}
}

// A budget wait handed back on drain and resumed counts its time once
// (waitedMs, and so the timeout).
func TestTenantWaitedCountedOnceAcrossHandBacks(t *testing.T) {
	t.Parallel()
	const period = 6 * time.Second
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	b := &budget.Budgets{Period: period, Tenants: map[string]budget.Tenant{"acme": {USD: 5, OnExhausted: budget.Wait}}}
	f, start := tenantWorkers(t, p, b, nil)
	first := start(1)
	now := time.Now()
	_, next := budget.PeriodAt(now, period)
	spendPeriods(t, ledger(t, f), "acme", b.Tenants["acme"], period, now, next)
	_, free := budget.PeriodAt(next, period)
	id := f.Submit("", tenantRun("acme"))
	waitWaiting(t, f, id, 1, free)
	time.Sleep(3 * time.Second)
	first.Stop()
	ctx := fleettest.Context(t)
	rec, _ := f.Client.Status(ctx, id)
	t.Logf("after hand-back: attempt %d waitedMs %d", rec.Attempt, rec.WaitedMs)
	start(1)
	fin := f.WaitFinished(id)
	rec, _ = f.Client.Status(ctx, id)
	life := rec.FinishedAt.Sub(rec.StartedAt)
	t.Logf("finished %s; startedAt %s finishedAt %s (%.1fs); waitedMs %d", fin.Status, rec.StartedAt, rec.FinishedAt, life.Seconds(), rec.WaitedMs)
	if time.Duration(rec.WaitedMs)*time.Millisecond > life {
		t.Errorf("BUG: waitedMs %d exceeds the run's whole life %s: the first attempt's wait counted twice (timeout extended by it)", rec.WaitedMs, life)
	}
}

// Drain hand-backs while a run waits for its budget do not use up
// MaxDeliver: the run is still waiting after more drains than MaxDeliver.
func TestTenantWaitHandBacksDoNotUseMaxDeliver(t *testing.T) {
	t.Parallel()
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Minute}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	f := newFleet(t)
	b := &budget.Budgets{Period: time.Hour, Tenants: map[string]budget.Tenant{"acme": {USD: 5, OnExhausted: budget.Wait}}}
	start := func() *fleettest.Worker {
		prov, err := openai.New(openai.Config{BaseURL: srv.URL + "/v1", Models: []openai.ModelInfo{
			{ID: "m", MaxTokens: tenantMaxTokens, Cost: agent.ModelCost{Input: 1000, Output: 1000}}}})
		if err != nil {
			t.Fatal(err)
		}
		return f.StartWorker(worker.Config{DefaultModel: "openai/m", Concurrency: 1, MaxDeliver: 2,
			Providers: map[string]worker.Provider{"openai": prov}, Budgets: &worker.TenantBudgets{Budgets: b}})
	}
	spendPeriods(t, ledger(t, f), "acme", b.Tenants["acme"], b.Period, time.Now())
	id := f.Submit("", tenantRun("acme"))
	w := start()
	for attempt := 1; attempt <= 2; attempt++ {
		waitWaiting(t, f, id, attempt, time.Now().Add(15*time.Second))
		w.Stop()
		w = start()
	}
	// The requeued request's attempt waits again: the drains did not give
	// the run up.
	waitWaiting(t, f, id, 3, time.Now().Add(30*time.Second))
	rec, err := f.Client.Status(fleettest.Context(t), id)
	if err != nil || rec.Finished() {
		t.Fatalf("run after 2 drain hand-backs (MaxDeliver 2): %+v, %v", rec, err)
	}
}
