package worker

import (
	"context"
	"iter"

	"github.com/agentfleet/agentfleet/agent"
)

// A model call's charge: what it cost, worked out once and taken by every
// consumer (the run's tally, hence run_finished and limits.maxCostUsd; the
// tenant's ledger; the shared rate limits; the metrics; the trace).
//
//   - The provider reported usage: that usage, clamped to what the call
//     could have used (usageBounds). The excess is logged once and counted.
//   - The call was sent and ended without usage (cut off by an abort, the
//     run's timeout, a drain's hard stop or a lost lease; or a provider that
//     sends none): its input estimate (callInputTokens, the same the rate
//     limiter reserves and the tenant's hold counts) plus the output it
//     streamed (OutputBytesPerToken), at the model's prices. A call cut
//     off after some usage arrived is charged at least that estimate.
//   - The call was never sent (its run stopped before it), or it ended in
//     an error before any output without usage (the endpoint refused it, or
//     could not be reached): nothing.
//
// The charge replaces the usage of the call's final assistant message, so
// the run's events and transcript, which resumes restore, carry the figure
// the run was charged (the provider's word, where it differs, is in the
// worker's log).
//
// The figure travels in a callMeter that the run's outermost stream
// wrapper (observeStream) puts in the call's context and the provider's
// wrapper (meteredProvider, the innermost) fills, before the final event
// or, for a call whose consumer stopped before one, when the provider
// returns: the wrappers in between (limits, tenant) settle in their defers,
// which run after that.

// Usage sources: how a call's charge was worked out.
const (
	usageReported  = "reported"  // the provider's usage, within the bounds
	usageClamped   = "clamped"   // the provider's usage, cut to the bounds
	usageEstimated = "estimated" // no usage: the estimate
	usageNone      = "none"      // not sent, or refused before any output: nothing
)

// InputClampFactor and InputClampFloor bound the input a provider may
// report for a call whose model has no context window in the table (and,
// when it has one, within it): InputClampFactor times the input estimate
// plus InputClampFloor. The estimate is the bytes the call sends / 4, and a
// byte-level tokenizer (BPE, SentencePiece with byte fallback) never makes
// more tokens of a text than it has bytes, while the JSON of each message
// is longer than the few tokens of framing a provider adds for it; the
// floor leaves room for what some providers add of their own (a tool-use
// system prompt, a few hundred tokens).
const (
	InputClampFactor = 4
	InputClampFloor  = 1024
)

// OutputClampMargin is the margin, in 1/OutputClampMargin of the bound plus
// 64 tokens, that a provider's output count may pass the call's output
// bound by: tokens a provider counts that max_tokens does not stop (the
// end of the turn, a tool call's framing).
const OutputClampMargin = 10

// callCharge is a call's charge.
type callCharge struct {
	usage agent.Usage
	// source is usageReported, usageClamped, usageEstimated or usageNone;
	// "" for a call no provider metered (chargeOf).
	source string
	// excessInput and excessOutput are the reported tokens beyond the
	// bounds (usageClamped).
	excessInput, excessOutput int
	// reported is the provider's usage (when it reported any).
	reported agent.Usage
}

// unreported reports whether the provider's word was not taken (no usage).
func (s callCharge) unreported() bool {
	return s.source == usageEstimated || s.source == usageNone
}

// tokens counts every token of the charge, as the shared rate limits do.
func (s callCharge) tokens() int {
	u := s.usage
	return u.Input + u.Output + u.CacheRead + u.CacheWrite
}

// usageBounds are the most a call could use: input (cached tokens
// included) within the model's context window and within InputClampFactor
// times the estimate plus InputClampFloor; output within its bound (the
// request's maxTokens, else the model table's, else, nothing being sent to
// bound it, the context window, else DefaultOutputReserve) plus the margin.
type usageBounds struct {
	inputEstimate int
	input, output int
	// reserve is the call's output reserve, as its worst case counts it
	// (the request's maxTokens, else the model table's, else
	// DefaultOutputReserve): an estimate counts no more output.
	reserve int
}

func boundsOf(model agent.Model, llm agent.Context, opts agent.StreamOptions) usageBounds {
	est := callInputTokens(llm)
	in := InputClampFactor*est + InputClampFloor
	if w := model.ContextWindow; w > 0 {
		in = min(in, w)
	}
	reserve := DefaultOutputReserve
	switch {
	case opts.MaxTokens > 0:
		reserve = opts.MaxTokens
	case model.MaxTokens > 0:
		reserve = model.MaxTokens
	}
	out := reserve
	if opts.MaxTokens <= 0 && model.MaxTokens <= 0 && model.ContextWindow > 0 {
		out = model.ContextWindow // no maxTokens was sent: the window bounds the answer
	}
	return usageBounds{inputEstimate: min(est, in), input: in, output: out + out/OutputClampMargin + 64, reserve: reserve}
}

// outputSeen counts the bytes a call streamed.
type outputSeen struct {
	text, thinking int // bytes of text and tool calls (names, arguments); of thinking
}

func (o *outputSeen) add(ev agent.StreamEvent) {
	switch ev.Type {
	case agent.StreamTextDelta, agent.StreamToolCallDelta:
		o.text += len(ev.Delta)
	case agent.StreamThinkingDelta:
		o.thinking += len(ev.Delta)
	case agent.StreamToolCallStart:
		o.text += len(ev.Name)
	}
}

// final takes the final message's content when it says more than the
// deltas did (a provider that sends whole blocks).
func (o *outputSeen) final(m *agent.Message) {
	text, thinking := 0, 0
	for i := range m.Content {
		c := &m.Content[i]
		text += len(c.Text)
		thinking += len(c.Thinking)
	}
	o.text, o.thinking = max(o.text, text), max(o.thinking, thinking)
}

func (o outputSeen) any() bool { return o.text+o.thinking > 0 }

// OutputBytesPerToken is how a call's streamed output (text, thinking,
// tool calls' names and arguments) is counted when no usage says: its
// bytes / 3, rounded up. Prose runs about 4 bytes a token, but answers hold
// code, numbers, markup and other languages, whose tokens are shorter, and
// a charge without the provider's word errs high.
const OutputBytesPerToken = 3

func outputTokens(bytes int) int { return (bytes + OutputBytesPerToken - 1) / OutputBytesPerToken }

// settle works out a call's charge. final is its final message (nil: the
// call ended without one), seen what it streamed, unsent that it was
// never sent, aborted that its context ended.
func settle(model agent.Model, b usageBounds, final *agent.Message, seen outputSeen, unsent, aborted bool) callCharge {
	var u agent.Usage
	if final != nil {
		u = nonNegative(final.Usage)
	}
	reported := u.Input+u.Output+u.CacheRead+u.CacheWrite > 0
	refused := final != nil && final.StopReason == agent.StopReasonError && !aborted && !seen.any()
	s := callCharge{source: usageNone}
	if reported {
		s = clampUsage(model, b, u)
	}
	if unsent || refused {
		return s
	}
	outEst := min(outputTokens(seen.text+seen.thinking), b.reserve)
	est := agent.Usage{Input: b.inputEstimate, Output: outEst, Reasoning: min(outputTokens(seen.thinking), outEst)}
	cutOff := final == nil || final.StopReason == agent.StopReasonAborted || final.StopReason == agent.StopReasonError
	switch {
	case !reported:
		s.source, s.usage = usageEstimated, est
	case cutOff:
		// Usage that came before the cut (a provider reporting the prompt
		// first) does not lower the estimate.
		v := s.usage
		if in := v.Input + v.CacheRead + v.CacheWrite; in < est.Input {
			v.Input += est.Input - in
		}
		v.Output, v.Reasoning = max(v.Output, est.Output), max(v.Reasoning, est.Reasoning)
		if v == s.usage {
			return s
		}
		s.usage = v
	default:
		return s
	}
	s.usage.TotalTokens = s.usage.Input + s.usage.Output + s.usage.CacheRead + s.usage.CacheWrite
	model.ComputeCost(&s.usage)
	return s
}

// clampUsage cuts a reported usage to the bounds: input (cache reads
// first, then cache writes, then the rest) to the input bound, output to
// the output bound, reasoning to the output.
func clampUsage(model agent.Model, b usageBounds, u agent.Usage) callCharge {
	s := callCharge{usage: u, source: usageReported, reported: u}
	in := u.Input + u.CacheRead + u.CacheWrite
	if in > b.input {
		s.excessInput = in - b.input
		u.Input = min(u.Input, b.input)
		u.CacheWrite = min(u.CacheWrite, b.input-u.Input)
		u.CacheRead = min(u.CacheRead, b.input-u.Input-u.CacheWrite)
	}
	if u.Output > b.output {
		s.excessOutput = u.Output - b.output
		u.Output = b.output
	}
	u.Reasoning = min(u.Reasoning, u.Output)
	if s.excessInput == 0 && s.excessOutput == 0 {
		return s
	}
	u.TotalTokens = u.Input + u.Output + u.CacheRead + u.CacheWrite
	model.ComputeCost(&u)
	s.usage, s.source = u, usageClamped
	return s
}

// callMeter carries one model call's charge from the provider's
// wrapper to the run's other wrappers. A call's events and its wrappers'
// defers all run on the goroutine that iterates the call: no lock.
type callMeter struct {
	r       *run
	settled bool
	s       callCharge
}

type callMeterKey struct{}

// withCallMeter gives a call a meter.
func (r *run) withCallMeter(ctx context.Context) (context.Context, *callMeter) {
	m := &callMeter{r: r}
	return context.WithValue(ctx, callMeterKey{}, m), m
}

func callMeterOf(ctx context.Context) *callMeter {
	m, _ := ctx.Value(callMeterKey{}).(*callMeter)
	return m
}

// chargeOf is the charge of the call whose context is ctx: its meter's
// charge, or, for a call no provider metered (a faux model, or a call
// a wrapper refused before the provider), the usage of its final message
// as it is, with no source.
func chargeOf(ctx context.Context, final *agent.Message) callCharge {
	if m := callMeterOf(ctx); m != nil && m.settled {
		return m.s
	}
	if final == nil {
		return callCharge{}
	}
	u := nonNegative(final.Usage)
	return callCharge{usage: u, reported: u}
}

// meteredProvider settles each call of its provider in the call's meter,
// and puts the charge into the final message's usage. Faux models (no
// prices, their usage an estimate already) are not metered.
type meteredProvider struct{ Provider }

// Notice passes on the notice of a provider that has one.
func (p meteredProvider) Notice() string {
	if n, ok := p.Provider.(Noticer); ok {
		return n.Notice()
	}
	return ""
}

func (p meteredProvider) Stream(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	m := callMeterOf(ctx)
	if m == nil || m.settled || model.API == "faux" {
		return p.Provider.Stream(ctx, model, llm, opts)
	}
	return func(yield func(agent.StreamEvent) bool) {
		unsent := ctx.Err() != nil // a stopped run's call is not sent
		b := boundsOf(model, llm, opts)
		var seen outputSeen
		defer func() {
			if !m.settled { // no final event: the consumer stopped
				m.settle(settle(model, b, nil, seen, unsent, true))
			}
		}()
		for ev := range p.Provider.Stream(ctx, model, llm, opts) {
			if (ev.Type == agent.StreamDone || ev.Type == agent.StreamError) && ev.Message != nil && !m.settled {
				seen.final(ev.Message)
				s := settle(model, b, ev.Message, seen, unsent, ctx.Err() != nil)
				m.settle(s)
				if s.usage != ev.Message.Usage {
					msg := *ev.Message
					msg.Usage = s.usage
					ev.Message = &msg
				}
			} else {
				seen.add(ev)
			}
			if !yield(ev) {
				return
			}
		}
	}
}

// settle records the call's charge and logs a clamped usage, once.
func (m *callMeter) settle(s callCharge) {
	m.settled, m.s = true, s
	if s.source != usageClamped || m.r == nil {
		return
	}
	m.r.log.Warn("model usage: the provider reported more than the call could use; charging the bound",
		"model", m.r.modelRef.String(),
		"reportedInput", s.reported.Input+s.reported.CacheRead+s.reported.CacheWrite, "reportedOutput", s.reported.Output,
		"excessInput", s.excessInput, "excessOutput", s.excessOutput,
		"chargedInput", s.usage.Input+s.usage.CacheRead+s.usage.CacheWrite, "chargedOutput", s.usage.Output,
		"chargedUsd", s.usage.Cost.Total)
}
