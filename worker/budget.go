package worker

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/metering"
)

// A run's cost bound (limits.maxCostUsd): before each model call, the
// spent cost plus the call's worst case (its reservation at the model's
// prices) must stay within it, else the run fails as budget_exceeded
// without the call; after a call that crossed it, the turn's tool calls
// still run and the run then stops.

// checkCostBound is a planning problem: a bound needs prices to count.
func (r *run) checkCostBound(add func(string, ...any)) {
	if r.limits.MaxCostUsd <= 0 {
		return
	}
	if c := r.model.Cost; c.Input <= 0 && c.Output <= 0 {
		add("limits.maxCostUsd needs a model with prices in the worker's model table; %s has none", r.modelRef)
	}
}

// outputReserve is the output reserve of the run's calls.
func (r *run) outputReserve(requestMax int) int { return OutputReserve(requestMax, r.model.MaxTokens) }

// worstCost is what the next call of model may cost at most: everything
// it sends (metering.CallInputTokens) at the dearer of the input and
// cache-write prices (a provider may write the whole prompt to its cache)
// and its whole output reserve at the output price. model is the call's
// own: a summary call on compaction.model is priced as that model.
func worstCost(model agent.Model, llm agent.Context, requestMax int) float64 {
	c := model.Cost
	return (float64(metering.CallInputTokens(llm))*max(c.Input, c.CacheWrite) + float64(OutputReserve(requestMax, model.MaxTokens))*c.Output) / 1e6
}

// priced reports whether the run's model has prices: calls of a model
// without any cost nothing a budget counts.
func (r *run) priced() bool {
	c := r.model.Cost
	return c.Input > 0 || c.Output > 0 || c.CacheRead > 0 || c.CacheWrite > 0
}

// spent is the run's cost so far.
func (r *run) spent() float64 {
	_, u := r.tally.Counts()
	return u.Cost.Total
}

// overCost records budget_exceeded when the run spent its bound, or when
// the next call (llm to model) could cross it; it reports whether it did.
func (r *run) overCost(model agent.Model, llm agent.Context, requestMax int) bool {
	max := r.limits.MaxCostUsd
	if max <= 0 {
		return false
	}
	spent := r.spent()
	switch worst := worstCost(model, llm, requestMax); {
	case spent > max:
		return r.tally.Limit(bus.ReasonBudgetExceeded, fmt.Sprintf("the run spent $%.6f, its budget (limits.maxCostUsd) is $%.6f", spent, max))
	case spent+worst > max:
		return r.tally.Limit(bus.ReasonBudgetExceeded, fmt.Sprintf(
			"the next model call could cost $%.6f; with $%.6f spent that would pass the run's budget (limits.maxCostUsd) of $%.6f", worst, spent, max))
	}
	return false
}

// budgetStream refuses a call whose worst case would pass the run's cost
// bound: the run ends as budget_exceeded without calling the model.
func (r *run) budgetStream(fn agent.StreamFn) agent.StreamFn {
	return func(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		if !r.overCost(model, llm, opts.MaxTokens) {
			return fn(ctx, model, llm, opts)
		}
		return func(yield func(agent.StreamEvent) bool) {
			_, text := r.tally.LimitState()
			yield(agent.StreamEvent{Type: agent.StreamError, Message: &agent.Message{Role: agent.RoleAssistant,
				StopReason: agent.StopReasonError, ErrorMessage: text, Timestamp: time.Now().UnixMilli(),
				API: model.API, Provider: model.Provider, Model: model.ID}})
		}
	}
}

// overCostNext checks the cost bound after a turn whose model wants
// another: the next call's context is this turn's, as the model is sent
// it (compacted, compaction.go), not the whole history.
func (r *run) overCostNext(tc *agent.TurnContext) bool {
	if r.limits.MaxCostUsd <= 0 {
		return false
	}
	var llm agent.Context
	if tc.Context != nil {
		llm = *tc.Context
		if r.comp != nil {
			llm.Messages = r.comp.view(llm.Messages)
		}
	}
	return r.overCost(r.model, llm, r.req.MaxTokens)
}
