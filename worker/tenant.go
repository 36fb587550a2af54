package worker

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/budget"
	"github.com/agentfleet/agentfleet/bus"
)

// Tenant budgets: every model call of a run whose tenant has a budget
// reserves its worst case (the input estimate and the whole output
// reserve at the model's prices) in the tenant's ledger entry for the
// current period before it starts, by compare-and-set, and settles to its
// charge (settle.go: the reported usage clamped to what the call could
// use, or for a call cut off or without usage its estimate; the cost
// the metrics count) after. A call that does not fit is refused as
// budget_exceeded, like limits.maxCostUsd's check before a call. So
// concurrent runs of a tenant cannot together reserve past its budget;
// only a call costing more than its worst case can pass it, by the
// difference.

// TenantBudgets configure per-tenant spending budgets. Every worker of a
// fleet should be given the same ones.
type TenantBudgets struct {
	Budgets *budget.Budgets
	// Key is the request metadata key naming the tenant; default "tenant".
	Key string
	// FromQueue makes the queue name the tenant instead of the metadata
	// (the metadata is what the submitter says; a queue can be restricted
	// by subject permissions).
	FromQueue bool
	// Liveness and MaxHold bound a dead worker's reservations (see
	// budget.LedgerConfig); defaults 15 s and 10 min.
	Liveness, MaxHold time.Duration
	// Stats, when set, counts spending, refusals and waits by tenant.
	Stats *budget.Stats
}

// DefaultTenantKey is the metadata key naming a run's tenant.
const DefaultTenantKey = "tenant"

// tenancy is a run's tenant and budget.
type tenancy struct {
	name     string
	budget   budget.Tenant
	budgeted bool
	// mustWait: the pickup found no budget and the tenant's runs wait for
	// the next period (onExhausted "wait").
	mustWait bool
	// charged: a call of this attempt reserved its cost (later calls
	// are not the run's first).
	charged atomic.Bool
}

// startBudgets opens the ledger and keeps this worker's reservations
// alive until the returned stop is called. Without budgets it does
// nothing.
func (w *Worker) startBudgets(ctx context.Context) (stop func(), err error) {
	tb := w.cfg.Budgets
	if tb == nil || tb.Budgets == nil {
		return func() {}, nil
	}
	kv, err := w.c.Budgets(ctx)
	if err != nil {
		return nil, err
	}
	// A call tries NATS again for a while, within the run's delivery.
	retry := min(30*time.Second, w.cfg.AckWait/2)
	lc := budget.LedgerConfig{Worker: w.id, Liveness: tb.Liveness, MaxHold: tb.MaxHold, RetryFor: retry}
	if bus.BudgetsKeyTTL(ctx, kv) {
		// A key outlives its period by one: submit budgets --all shows
		// the last period, and the bucket does not grow.
		lc.KeyTTL, lc.JetStream = 2*tb.Budgets.Period, w.c.JetStream()
	} else {
		w.log.Warn("tenant budgets: the budgets bucket does not allow per-message TTLs (NATS server older than 2.11?): keys of past periods are kept; purge them now and then")
	}
	l, err := budget.NewLedger(kv, lc)
	if err != nil {
		return nil, err
	}
	w.ledger = l
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); l.Run(lctx) }()
	return func() { cancel(); <-done }, nil
}

// resolveTenant finds the run's tenant and its budget.
func (r *run) resolveTenant() {
	tb := r.w.cfg.Budgets
	if r.w.ledger == nil || tb == nil {
		return
	}
	name := r.queue
	if !tb.FromQueue {
		key := tb.Key
		if key == "" {
			key = DefaultTenantKey
		}
		name = r.req.Metadata[key]
		if name == "" && key == DefaultTenantKey && bus.ValidTenant(r.lane.Tenant) {
			name = r.lane.Tenant // the subject's tenant lane (since 1.10; Names.CheckTenant)
		}
	}
	r.tenant.name = name
	r.tenant.budget, r.tenant.budgeted = tb.Budgets.For(name)
}

func (r *run) account(now time.Time) budget.Account {
	return budget.AccountAt(r.tenant.name, r.tenant.budget, r.w.cfg.Budgets.Budgets.Period, now)
}

func tenantLabel(name string) string {
	if name == "" {
		return "(no tenant)"
	}
	return fmt.Sprintf("%q", clipString(name, 64))
}

// checkTenant is the pickup check of a run that has not had a turn yet:
// its tenant's settled spending must leave room for its first call's
// worst case. Other calls' open holds do not count here: they settle
// within seconds, and the first call's reservation counts them (it waits
// for them, tenantStream). It returns the refusal's text, and the end of
// the period, when there is no room; an error is NATS trouble. A model
// without prices always passes: its calls cost nothing a budget counts,
// as tenantStream lets them through.
func (r *run) checkTenant(ctx context.Context) (text string, resets time.Time, err error) {
	if !r.tenant.budgeted || r.hadTurns() {
		// A run that has had turns is charged call by call.
		return "", time.Time{}, nil
	}
	worst := r.firstCallWorst()
	if worst <= 0 {
		return "", time.Time{}, nil
	}
	acct := r.account(time.Now())
	e, err := r.w.ledger.Open(ctx, acct)
	if err != nil {
		return "", time.Time{}, err
	}
	if e.SpentUSD+worst <= e.LimitUSD {
		return "", time.Time{}, nil
	}
	return fmt.Sprintf("tenant %s has no budget left for this period: $%.6f of $%.6f spent, the first model call could cost $%.6f; the budget resets at %s",
		tenantLabel(r.tenant.name), e.SpentUSD, e.LimitUSD, worst, acct.End.Format(time.RFC3339)), acct.End, nil
}

// hadTurns reports whether an earlier attempt of the run had turns.
func (r *run) hadTurns() bool { return r.prev != nil && r.prev.Turns > 0 }

// firstCallWorst is the worst case of the run's first model call.
func (r *run) firstCallWorst() float64 {
	return worstCost(r.model, agent.Context{SystemPrompt: r.req.SystemPrompt, Messages: r.prompt, Tools: r.tools}, r.req.MaxTokens)
}

// holdsRecheck is how often a first call that found the budget held by
// other calls looks again.
const holdsRecheck = time.Second

// tenantStream charges each call of fn to the run's tenant: it reserves
// the call's worst case first and settles to the real cost after. A call
// that does not fit is refused as budget_exceeded, except the run's first
// call when it may wait: other calls' holds would leave it room once they
// settle (any tenant), or the tenant's runs wait for the next period
// ("wait"). A later call that does not fit always ends the run: it has
// spent, and waiting a period in the middle of a run helps nobody.
func (r *run) tenantStream(fn agent.StreamFn) agent.StreamFn {
	stats := r.w.cfg.Budgets.Stats
	return func(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			worst := worstCost(model, llm, opts.MaxTokens)
			if worst <= 0 {
				// A model without prices costs nothing the budget counts.
				for ev := range fn(ctx, model, llm, opts) {
					if !yield(ev) {
						return
					}
				}
				return
			}
			res, e, err := r.w.ledger.Reserve(ctx, r.account(time.Now()), worst)
			if err == nil && res == nil && !r.hadTurns() && !r.tenant.charged.Load() && r.mayWaitFirst(e, worst) {
				res, e, err = r.waitToReserve(ctx, worst, e)
			}
			switch {
			case errors.Is(err, errWaitHandedBack) || (err != nil && ctx.Err() != nil):
				yield(agent.StreamEvent{Type: agent.StreamError, Message: &agent.Message{Role: agent.RoleAssistant,
					StopReason: agent.StopReasonAborted, ErrorMessage: "stopped while waiting for the tenant's budget",
					Timestamp: time.Now().UnixMilli(), API: model.API, Provider: model.Provider, Model: model.ID}})
				return
			case err != nil:
				yield(callRefused(model, "cannot reserve the call in the tenant's budget: "+err.Error()))
				return
			case res == nil:
				stats.Refused(r.tenant.name)
				r.tally.Limit(bus.ReasonBudgetExceeded, fmt.Sprintf(
					"the next model call could cost $%.6f; tenant %s has $%.6f of its $%.6f budget left for this period (it resets at %s)",
					worst, tenantLabel(r.tenant.name), e.Remaining(), e.LimitUSD, e.ResetsAt().Format(time.RFC3339)))
				_, text := r.tally.LimitState()
				yield(callRefused(model, text))
				return
			}
			r.tenant.charged.Store(true)
			var final *agent.Message
			defer func() {
				// The call's charge (settle.go): a call cut off, or
				// without usage, is charged its estimate.
				cost := chargeOf(ctx, final).Usage.Cost.Total
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				stats.Spent(r.tenant.name, cost)
				if err := res.Settle(sctx, cost); err != nil {
					r.log.Warn("tenant budget: cannot settle a call; its reservation is charged in full when it lapses", "err", err)
				}
			}()
			for ev := range fn(ctx, model, llm, opts) {
				if (ev.Type == agent.StreamDone || ev.Type == agent.StreamError) && ev.Message != nil {
					final = ev.Message
				}
				if !yield(ev) {
					return
				}
			}
		}
	}
}

// mayWaitFirst reports whether a refused first call waits: the tenant's
// settled spending leaves it room (other calls' holds are in the way), or
// its runs wait for the next period, whose budget can pay the call.
func (r *run) mayWaitFirst(e *budget.Entry, worst float64) bool {
	if e == nil || worst > e.LimitUSD {
		return false
	}
	return e.SpentUSD+worst <= e.LimitUSD || r.tenant.budget.OnExhausted == budget.Wait
}

// waitToReserve waits, without the run's slot (waitOffSlot), until the
// first call's reservation fits: every holdsRecheck while other calls'
// holds are in the way, else ("wait" tenants) until the period rolls
// over. A "refuse" tenant whose spending meanwhile leaves no room gets no
// reservation. Once it has one, the run gets a model_wait event (reason
// "budget").
func (r *run) waitToReserve(ctx context.Context, worst float64, e *budget.Entry) (*budget.Reservation, *budget.Entry, error) {
	r.w.cfg.Budgets.Stats.Waited(r.tenant.name)
	since := time.Now()
	var res *budget.Reservation
	err := r.waitOffSlot(ctx, bus.WaitingBudget, since, func(wctx context.Context) error {
		for {
			until := time.Now().Add(holdsRecheck)
			if e.SpentUSD+worst > e.LimitUSD {
				if r.tenant.budget.OnExhausted != budget.Wait {
					return nil
				}
				until = e.ResetsAt()
				r.log.Info("tenant budget spent: the run's first call waits for the next period", "tenant", clipString(r.tenant.name, 64), "until", until)
			}
			if err := sleepUntil(wctx, until); err != nil {
				return err
			}
			got, now, err := r.w.ledger.Reserve(wctx, r.account(time.Now()), worst)
			if err != nil || got != nil {
				res = got
				return err
			}
			e = now
		}
	})
	if err != nil {
		if res != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = res.Settle(sctx, 0) // the call will not be made
			cancel()
		}
		if errors.Is(err, errWaitHandedBack) {
			r.handBackWhileWaiting() // approval.go
		}
		return nil, e, err
	}
	if res != nil {
		_, _ = r.pub.Fleet(bus.EventModelWait, bus.ModelWait{Type: bus.EventModelWait,
			Reason: bus.WaitBudget, WaitedMs: time.Since(since).Milliseconds()})
	}
	return res, e, nil
}

func callRefused(model agent.Model, text string) agent.StreamEvent {
	return agent.StreamEvent{Type: agent.StreamError, Message: &agent.Message{Role: agent.RoleAssistant,
		StopReason: agent.StopReasonError, ErrorMessage: text, Timestamp: time.Now().UnixMilli(),
		API: model.API, Provider: model.Provider, Model: model.ID}}
}

// admitTenant is the pickup's budget check. A run whose tenant cannot pay
// its first call is refused as budget_exceeded (onExhausted "refuse"), or
// marked to wait for the next period once it holds its lease ("wait"). It
// reports whether the run may go on; if not, the request is settled. A
// "wait" tenant whose whole budget could not pay the first call is
// refused: no period would.
func (r *run) admitTenant(ctx context.Context) bool {
	text, _, err := r.checkTenant(ctx)
	switch {
	case err != nil:
		r.log.Warn("cannot read the tenant's budget; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return false
	case text == "":
		return true
	case r.tenant.budget.OnExhausted == budget.Wait && r.firstCallWorst() <= r.tenant.budget.USD:
		r.tenant.mustWait = true
		return true
	case r.prev != nil:
		// An earlier attempt started the run: its first call is refused
		// instead (the run's events already began).
		return true
	}
	if r.refuseAtPickup(bus.ReasonBudgetExceeded, text) {
		// Counted once stored: a redelivery of a refusal whose record was
		// not written is refused again.
		r.w.cfg.Budgets.Stats.Refused(r.tenant.name)
	}
	return false
}

// awaitBudget waits until the run's tenant can pay its first call: until
// the period rolls over, then checks again (other runs may have spent
// the new period's budget first). It waits without the run's slot and
// with its timeout paused (waitOffSlot, waiting.go); the record shows
// waiting "budget", and once the run proceeds it gets a model_wait event
// (reason "budget"). It returns an error if the run was stopped meanwhile
// (handed back when the worker drains).
func (r *run) awaitBudget(ctx context.Context) error {
	if !r.tenant.mustWait {
		return nil
	}
	r.w.cfg.Budgets.Stats.Waited(r.tenant.name)
	since := time.Now()
	var earlier time.Duration // waited by earlier attempts, for the event
	switch p := r.prev; {
	case p != nil && p.Waiting != nil && p.Waiting.For == bus.WaitingBudget && !p.Waiting.Since.IsZero():
		// An earlier attempt's wait goes on (it crashed): its record's
		// waitedMs leaves out the wait in progress.
		since = p.Waiting.Since
	case p != nil && p.Turns == 0 && p.WaitedMs > 0:
		// An earlier attempt waited and was handed back: its waitedMs,
		// already on the clock (prevWaited), counts that wait, so this
		// attempt's pause starts now.
		earlier = time.Duration(p.WaitedMs) * time.Millisecond
	}
	err := r.waitOffSlot(ctx, bus.WaitingBudget, since, func(wctx context.Context) error {
		for {
			text, resets, err := r.checkTenant(wctx)
			if err == nil && text == "" {
				return nil
			}
			if err != nil {
				r.log.Warn("cannot read the tenant's budget; checking again shortly", "err", err)
				resets = time.Now().Add(2 * time.Second)
			} else {
				r.log.Info("tenant budget spent: waiting for the next period", "tenant", clipString(r.tenant.name, 64), "until", resets)
			}
			if err := sleepUntil(wctx, resets); err != nil {
				return err
			}
		}
	})
	if errors.Is(err, errWaitHandedBack) {
		r.handBackWhileWaiting() // approval.go
	}
	if err != nil {
		return err
	}
	_, _ = r.pub.Fleet(bus.EventModelWait, bus.ModelWait{Type: bus.EventModelWait,
		Reason: bus.WaitBudget, WaitedMs: (earlier + time.Since(since)).Milliseconds()})
	return nil
}

// sleepUntil waits until t, plus up to 250 ms so that the waiting runs of
// a fleet do not all check the ledger at the same instant.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t) + time.Duration(rand.Int64N(int64(250*time.Millisecond)))
	timer := time.NewTimer(max(d, time.Millisecond))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
