package worker

import (
	"cmp"
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/budget"
	"github.com/agentfleet/agentfleet/bus"
)

// The tree's budget (child runs, protocol 1.10; worker/children.go).
//
// A root run with limits.maxCostUsd that offers run_agent, and every run
// below it, charge one account: the budgets bucket's entry of the tree
// (treeAccount), with the same hold and settle as a tenant's budget
// (tenant.go): before each model call the call's worst case is held, and
// a call without room fails its run as budget_exceeded without calling
// the model; after it the hold is replaced by the call's charge. Parallel
// children therefore cannot overspend the tree together: at most the
// calls already held run over (a charge above its estimate).
// Invariants:
//
//  1. The account is named by the root's id and its tenant, both taken
//     from what no submitter can choose for another's tree: a child's
//     from its sealed request (the link's root, the tenant its parent's
//     worker copied; a link no worker sealed is refused before the run
//     starts, worker/children.go invariant 7), a root's from itself (its
//     own id). Its limit is the root's maxCostUsd, carried to every
//     child in child.treeMaxCostUsd (a child cannot raise it: the worker
//     writes it, from its parent's, under the seal).
//  2. A worker without the budgets bucket runs trees without their
//     account (each run still has its own bound) and says so at start.
//  3. An account does not outlive its tree by long: every write of it
//     expires (the ledger's KeyTTL) after the tenants' two periods with
//     budgets on, else after treeAccountTTL; a tree that makes no model
//     call for that long starts a new account.

// treeAccountTTL is how long a tree's account lives after its last write
// with budgets off (invariant 3): longer than any wait of a run's, so a
// tree's spending is not forgotten while it runs.
const treeAccountTTL = 7 * 24 * time.Hour

// startTreeBudgets opens the trees' ledger: the tenants' when budgets are
// on, else one of its own on the same bucket.
func (w *Worker) startTreeBudgets(ctx context.Context) (stop func(), err error) {
	if w.ledger != nil {
		w.trees = w.ledger
		return func() {}, nil
	}
	kv, err := w.c.Budgets(ctx)
	if err != nil {
		w.log.Warn("child runs' tree budgets off: no budgets bucket (create the streams with EnsureStreams)", "err", err)
		return func() {}, nil
	}
	lc := budget.LedgerConfig{Worker: w.id, RetryFor: min(30*time.Second, w.cfg.AckWait/2)}
	if bus.BudgetsKeyTTL(ctx, kv) { // invariant 3
		lc.KeyTTL, lc.JetStream = cmp.Or(w.cfg.treeTTL, treeAccountTTL), w.c.JetStream()
	} else {
		w.log.Warn("child runs' tree budgets: the budgets bucket does not allow per-message TTLs (NATS server older than 2.11?): trees' accounts are kept; purge them now and then")
	}
	l, err := budget.NewLedger(kv, lc)
	if err != nil {
		return nil, err
	}
	w.trees = l
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); l.Run(lctx) }()
	return func() { cancel(); <-done }, nil
}

// treeLimit is the tree's budget this run charges (0: none), and the
// tree's root.
func (r *run) treeLimit() (usd float64, root string) {
	if c := r.req.Child; c != nil {
		return c.TreeMaxCostUsd, c.RootRunID
	}
	for _, t := range r.toolList {
		if t == bus.ToolRunAgent {
			return r.limits.MaxCostUsd, r.id
		}
	}
	return 0, ""
}

// treeAccount is the tree's ledger account (invariant 1): one period that
// never ends.
func (r *run) treeAccount(usd float64, root string) budget.Account {
	tenant := r.tenant.name
	if r.w.ledger == nil {
		tenant = r.req.Metadata[DefaultTenantKey]
	}
	return budget.Account{Tenant: "tree/" + tenant + "/" + root, Start: time.Unix(0, 0),
		End: time.Unix(0, 0).Add(1 << 62), LimitUSD: usd}
}

// treeStream holds each call's worst case in the tree's account and
// settles its charge (see the top).
func (r *run) treeStream(fn agent.StreamFn, usd float64, root string) agent.StreamFn {
	acct := r.treeAccount(usd, root)
	return func(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			worst := worstCost(model, llm, opts.MaxTokens)
			if worst <= 0 {
				for ev := range fn(ctx, model, llm, opts) {
					if !yield(ev) {
						return
					}
				}
				return
			}
			res, e, err := r.w.trees.Reserve(ctx, acct, worst)
			switch {
			case err != nil:
				yield(callRefused(model, "cannot reserve the call in the run tree's budget: "+err.Error()))
				return
			case res == nil:
				r.tally.Limit(bus.ReasonBudgetExceeded, fmt.Sprintf(
					"the next model call could cost $%.6f; the run tree of %s has $%.6f of its $%.6f budget (the root's limits.maxCostUsd) left",
					worst, root, e.Remaining(), e.LimitUSD))
				_, text := r.tally.LimitState()
				yield(callRefused(model, text))
				return
			}
			var final *agent.Message
			defer func() {
				cost := chargeOf(ctx, final).Usage.Cost.Total
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				if err := res.Settle(sctx, cost); err != nil {
					r.log.Warn("tree budget: cannot settle a call; its reservation is charged in full when it lapses", "err", err)
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
