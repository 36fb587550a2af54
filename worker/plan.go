package worker

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/llm/faux"
	"github.com/agentfleet/agentfleet/worker/internal/callkey"
)

// prepare decodes the request and resolves it against the worker (model,
// provider, tools, continueFrom), then builds the Agent. A bad request's
// error is one *bus.RequestError listing every problem, the decoder's and
// the worker's; any other error is NATS trouble (loading continueFrom).
func (r *run) prepare(ctx context.Context) error {
	data := r.request.Data()
	req, err := bus.DecodeRunRequest(data, r.id)
	var bad *bus.RequestError
	if err != nil {
		if !errors.As(err, &bad) {
			return err
		}
		// The worker's checks still run on what decodes leniently (the
		// decoder's reading: an unknown field inside model too), so the
		// error lists every problem at once.
		req = bad.Request
	}
	if req == nil {
		return bad
	}
	r.req = req
	problems, err := r.plan(ctx)
	if err != nil && bad == nil {
		return err
	}
	if bad != nil {
		problems = append(append([]string(nil), bad.Problems...), problems...)
	}
	if len(problems) > 0 {
		return &bus.RequestError{Problems: problems}
	}
	r.agent = r.newAgent()
	return nil
}

// plan resolves the request: it returns the request's problems, or an
// error reading continueFrom's run.
func (r *run) plan(ctx context.Context) ([]string, error) {
	w, req := r.w, r.req
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	r.limits = req.EffectiveLimits()
	r.ceilings(req, add)
	if err := w.names.CheckLane(r.lane, req); err != nil {
		add("%v", err)
	}
	r.checkChildLink(add) // children.go
	if err := w.names.CheckTenant(r.lane, req, bus.TenantMetadataKey); err != nil {
		add("%v", err)
	}
	if c := req.Concurrency; c != nil && c.Key != "" {
		limit, problem := w.keyLimit(c) // keys.go
		if problem != "" {
			add("%s", problem)
		}
		r.key, r.keyLimit = c.Key, limit
	}
	ref := w.defaultModel
	if req.Model != nil {
		ref = *req.Model
	}
	r.modelRef = ref
	// An explicit model that is not faux is the decoder's problem.
	if req.Faux != nil && req.Model == nil && ref.Provider != "faux" {
		add(`"faux" is only for the faux provider, but the model is %s`, ref)
	}
	if w.cfg.NoFaux && (req.Faux != nil || (req.Model != nil && ref.Provider == "faux")) {
		add("this worker does not run faux models or faux scripts (--allow-faux is off)")
	}
	p := w.providers[ref.Provider]
	if p == nil {
		add("unknown model provider %q: this worker has %s", clipString(ref.Provider, 64), w.providerNames())
	}
	problems = append(problems, r.resolveTools(ctx)...) // worker/toolsources.go
	if req.ContinueFrom != "" && bus.ValidID(req.ContinueFrom) && req.ContinueFrom != r.id {
		// The prior messages start the agent's transcript; they are not
		// the run's prompt and are not published (continuation.go).
		prior, err := r.loadPrior(ctx, req.ContinueFrom)
		var bad *bus.RequestError
		switch {
		case errors.As(err, &bad):
			problems = append(problems, bad.Problems...)
		case err != nil:
			return problems, err
		}
		r.prior = prior
	}
	if len(problems) > 0 {
		return problems, nil
	}
	r.gateTools() // worker/approval.go
	r.prompt = append(r.prompt, req.Messages...)
	if req.Prompt != "" {
		r.prompt = append(r.prompt, agent.UserText(req.Prompt, req.Images...))
	}
	r.model = p.Model(ref.ID)
	if r.model.ID == "" {
		r.model.ID = ref.ID
	}
	if r.model.Provider == "" {
		r.model.Provider = ref.Provider
	}
	r.stream = meteredProvider{p}.Stream // worker/settle.go
	if req.Faux != nil {
		r.fauxScript(ref)
	} else if n, ok := p.(Noticer); ok {
		r.notice = n.Notice()
	}
	if ml, ok := w.modelLimit(ref); ok && req.Faux == nil {
		r.modelLimit = &ml
	}
	r.planCompaction(add)                         // worker/compaction.go
	r.resolveTenant()                             // worker/tenant.go
	if r.checkCostBound(add); len(problems) > 0 { // worker/budget.go
		return problems, nil
	}
	return nil, nil
}

// streamFn is the run's model call: the provider's (or the faux script's,
// r.stream) wrapped, from the call out, in the shared rate limits
// (ratelimit.go), the tenant's budget hold (tenant.go), the run's cost
// budget (budget.go), the tool call keys (internal/callkey), the trace's span
// (trace.go) and the observer's count (listener.go). A provider's call is
// metered innermost (meteredProvider, settle.go): each wrapper sees its
// charge.
func (r *run) streamFn() agent.StreamFn {
	return r.wrapStream(r.stream, r.modelLimit, r.modelRef.String())
}

// wrapStream wraps a provider's (or a script's) call in the run's stack
// (streamFn), with limit the called model's shared rate limit (nil:
// none) and name the model the observer reports; a compaction's summary
// call goes through it too.
func (r *run) wrapStream(fn agent.StreamFn, limit *ModelLimit, name string) agent.StreamFn {
	if limit != nil {
		fn = r.limitStream(fn, *limit)
	}
	if r.tenant.budgeted {
		fn = r.tenantStream(fn)
	}
	if usd, root := r.treeLimit(); usd > 0 && r.w.trees != nil {
		fn = r.treeStream(fn, usd, root) // treebudget.go
	}
	if r.limits.MaxCostUsd > 0 {
		fn = r.budgetStream(fn)
	}
	return r.observeStream(r.traceStream(callkey.Stream(fn, r.priorCallKeys)), name)
}

// priorCallKeys is what new call keys avoid besides the context's: the
// earlier attempts' keys and, after a compaction, the summarised calls'.
func (r *run) priorCallKeys() callkey.Prior {
	if c := r.comp; c != nil && c.goneKeys != nil {
		return callkey.Prior{Used: c.goneKeys, Turns: c.goneTurns}
	}
	return callkey.Prior{Used: r.earlier.usedCallKeys}
}

// ceilings applies the operator's ceilings (--max-run-timeout,
// --max-turns): a request asking more is a bad request; a default above a
// ceiling is lowered to it.
func (r *run) ceilings(req *bus.RunRequest, add func(string, ...any)) {
	cfg := r.w.cfg
	var asked bus.Limits
	if req.Limits != nil {
		asked = *req.Limits
	}
	if c := cfg.MaxRunTimeout; c > 0 {
		secs := max(int(c/time.Second), 1)
		switch {
		case asked.TimeoutSeconds > secs:
			add("limits.timeoutSeconds %d is more than this worker's ceiling of %d (--max-run-timeout)", asked.TimeoutSeconds, secs)
		case r.limits.TimeoutSeconds > secs:
			r.limits.TimeoutSeconds = secs
		}
	}
	if c := cfg.MaxTurns; c > 0 {
		switch {
		case asked.MaxTurns > c:
			add("limits.maxTurns %d is more than this worker's ceiling of %d (--max-turns)", asked.MaxTurns, c)
		case r.limits.MaxTurns > c:
			r.limits.MaxTurns = c
		}
	}
}

// fauxScript makes the request's faux script the run's model. A resumed
// run's script goes on at the response after the restored turns (see
// resume): the script is a function of the transcript, as a real model is.
func (r *run) fauxScript(ref bus.ModelRef) {
	f := r.req.Faux
	resps := f.Responses
	opts := fauxOptions(f)
	script := faux.New(opts, resps...).Stream
	r.fauxSkip = func(n int) { script = faux.New(opts, resps[min(n, len(resps)):]...).Stream }
	r.stream = func(ctx context.Context, m agent.Model, llm agent.Context, o agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return script(ctx, m, llm, o)
	}
	r.model = agent.Model{ID: ref.ID, Name: ref.ID, API: "faux", Provider: "faux"}
}

// fauxOptions is the faux model's chunking and pace as the script asks.
func fauxOptions(f *bus.FauxScript) faux.Options {
	return faux.Options{TokenSize: f.TokenSize, TokensPerSecond: f.TokensPerSecond, FixedPace: f.FixedPace}
}

func (r *run) newAgent() *agent.Agent {
	req := r.req
	stream := r.streamFn()
	var transform func(context.Context, []agent.Message) ([]agent.Message, error)
	if c := r.comp; c != nil { // worker/compaction.go
		c.wire()
		stream, transform = c.overflowStream(stream), c.transform
	}
	a := agent.New(agent.Options{
		TransformContext:    transform,
		SystemPrompt:        req.SystemPrompt,
		Model:               r.model,
		ThinkingLevel:       req.ThinkingLevel,
		Tools:               r.tools,
		StreamFn:            stream,
		ShouldStopAfterTurn: r.shouldStop,
		SteeringMode:        req.SteeringMode,
		FollowUpMode:        req.FollowUpMode,
		ToolExecution:       req.ToolExecution,
		SessionID:           r.id,
		Temperature:         req.Temperature,
		MaxTokens:           r.outputReserve(req.MaxTokens), // every call asks for its reserve (budget.go)
	})
	l := &listener{r: r}
	r.listener = l
	if r.prior != nil {
		l.transcriptBytes = int(r.prior.bytes) // the bound is the whole transcript's
	}
	a.Subscribe(l.onEvent)
	return a
}

// shouldStop enforces maxTurns and maxTotalTokens after each turn, when
// the agent would otherwise run another one.
func (r *run) shouldStop(_ context.Context, tc *agent.TurnContext) (bool, error) {
	wantsMore := len(tc.Message.ToolCalls()) > 0 || r.agent.HasQueuedMessages()
	return wantsMore && (r.tally.OverLimit(r.limits) || r.overCostNext(tc)), nil
}
