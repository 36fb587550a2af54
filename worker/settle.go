package worker

import (
	"context"
	"fmt"
	"iter"
	"math"
	"runtime/debug"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/worker/internal/outcome"
)

// A model call's charge: what it cost, worked out once and taken by every
// consumer (the run's tally, hence run_finished and limits.maxCostUsd; the
// tenant's ledger; the shared rate limits; the metrics; the trace).
//
//   - The provider reported usage: that usage, clamped to what the call
//     could have used (usageBounds). The excess is logged once and counted.
//     A call that streamed output its provider reported none of is
//     charged the output's estimate.
//   - The call was sent and ended without usage (cut off by an abort, the
//     run's timeout, a drain's hard stop or a lost lease; or a provider that
//     sends none): its input estimate (callInputTokens, the same the rate
//     limiter reserves and the tenant's hold counts) plus the output it
//     streamed (OutputBytesPerToken), or, for a reasoning model that
//     streamed no reasoning, its whole output reserve. A call cut off
//     after some usage arrived is charged at least that estimate.
//   - The call was never sent (its run stopped before it), or it ended in
//     an error before any output without usage (the endpoint refused it, or
//     could not be reached): nothing.
//
// Every charge is priced here, at the model table's prices: a provider's
// word on the cost is not taken.
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
	return satAdd(u.Input, u.Output, u.CacheRead, u.CacheWrite)
}

// usageBounds are the most a call could use: input (cached tokens
// included) within the model's context window and within InputClampFactor
// times the estimate plus InputClampFloor; output within the call's
// output reserve (OutputReserve: what it asked for as max_tokens) plus
// the margin.
type usageBounds struct {
	inputEstimate int
	input, output int
	// reserve is the call's output reserve (OutputReserve), as its worst
	// case counts it and the call asked for it: an estimate counts no
	// more output.
	reserve int
	// reasoning: the model table marks the model as a reasoning model,
	// which may reason without streaming it.
	reasoning bool
}

func boundsOf(model agent.Model, llm agent.Context, opts agent.StreamOptions) usageBounds {
	est := callInputTokens(llm)
	in := satAdd(satMul(InputClampFactor, est), InputClampFloor)
	if w := model.ContextWindow; w > 0 {
		in = min(in, w)
	}
	reserve := OutputReserve(opts.MaxTokens, model.MaxTokens)
	return usageBounds{inputEstimate: min(est, in), input: in, output: satAdd(reserve, reserve/OutputClampMargin, 64), reserve: reserve,
		reasoning: model.Reasoning}
}

// satAdd sums token counts (negative ones count 0) without wrapping: a
// sum past MaxInt is MaxInt. A count a request or a provider chose must
// not turn a bound or a charge negative.
func satAdd(counts ...int) int {
	sum := 0
	for _, n := range counts {
		if n = max(n, 0); n > math.MaxInt-sum {
			return math.MaxInt
		}
		sum += n
	}
	return sum
}

// satMul is k × n (k > 0, n ≥ 0), MaxInt past it.
func satMul(k, n int) int {
	if n > math.MaxInt/k {
		return math.MaxInt
	}
	return k * n
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
// never sent, aborted that its context ended. Whatever the source, the
// charge's total and cost are worked out here, at the model table's
// prices: a provider's word on them is not taken.
func settle(model agent.Model, b usageBounds, final *agent.Message, seen outputSeen, unsent, aborted bool) callCharge {
	s := settleTokens(b, final, seen, unsent, aborted)
	s.usage.Cost = agent.Cost{}
	s.usage.TotalTokens = s.tokens()
	model.ComputeCost(&s.usage)
	return s
}

// settleTokens works out the tokens of a call's charge (settle).
func settleTokens(b usageBounds, final *agent.Message, seen outputSeen, unsent, aborted bool) callCharge {
	var u agent.Usage
	if final != nil {
		u = outcome.NonNegative(final.Usage)
	}
	reported := satAdd(u.Input, u.Output, u.CacheRead, u.CacheWrite) > 0
	refused := final != nil && final.StopReason == agent.StopReasonError && !aborted && !seen.any()
	s := callCharge{source: usageNone}
	if reported {
		s = clampUsage(b, u)
	}
	if unsent || refused {
		return s
	}
	outEst := min(outputTokens(seen.text+seen.thinking), b.reserve)
	est := agent.Usage{Input: b.inputEstimate, Output: outEst, Reasoning: min(outputTokens(seen.thinking), outEst)}
	if b.reasoning && seen.thinking == 0 {
		// A reasoning model that streamed no reasoning may have reasoned
		// unseen (providers that hide it; a call cut off while it
		// reasoned): the whole reserve, which the worst case counts.
		est.Output, est.Reasoning = b.reserve, b.reserve-outEst
	}
	cutOff := final == nil || final.StopReason == agent.StopReasonAborted || final.StopReason == agent.StopReasonError
	switch {
	case !reported:
		s.source, s.usage = usageEstimated, est
	case cutOff:
		// Usage that came before the cut (a provider reporting the prompt
		// first) does not lower the estimate.
		v := &s.usage
		if in := satAdd(v.Input, v.CacheRead, v.CacheWrite); in < est.Input {
			v.Input += est.Input - in
		}
		v.Output, v.Reasoning = max(v.Output, est.Output), max(v.Reasoning, est.Reasoning)
	case s.usage.Output == 0 && seen.any():
		// A provider that reported the prompt only: the output it
		// streamed is not free.
		s.usage.Output, s.usage.Reasoning = est.Output, est.Reasoning
	}
	return s
}

// clampUsage cuts a reported usage (no count negative) to the bounds:
// input (cache reads first, then cache writes, then the rest) to the input
// bound, output to the output bound, reasoning to the output. Each count
// is cut before any is added: a sum of counts near MaxInt would wrap.
func clampUsage(b usageBounds, u agent.Usage) callCharge {
	s := callCharge{usage: u, source: usageReported, reported: u}
	if in := satAdd(u.Input, u.CacheRead, u.CacheWrite); in > b.input {
		s.excessInput = in - b.input // at most MaxInt - the bound: a metric's count
		u.Input = min(u.Input, b.input)
		u.CacheWrite = min(u.CacheWrite, b.input-u.Input)
		u.CacheRead = min(u.CacheRead, b.input-u.Input-u.CacheWrite)
	}
	if u.Output > b.output {
		s.excessOutput = u.Output - b.output
		u.Output = b.output
	}
	u.Reasoning = min(u.Reasoning, u.Output)
	s.usage = u
	if s.excessInput > 0 || s.excessOutput > 0 {
		s.source = usageClamped
	}
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
	u := outcome.NonNegative(final.Usage)
	return callCharge{usage: u, reported: u}
}

// meteredProvider settles each call of its provider in the call's meter,
// and puts the charge into the final message's usage. Faux models (no
// prices, their usage an estimate already) are not metered. A provider
// that breaks the stream's contract, returning without a final event or
// panicking, has its call ended here with an error event whose message
// (what streamed) carries the charge: the agent would otherwise build that
// message itself, without it.
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
	if opts.MaxTokens <= 0 {
		// The call asks for its output reserve, which its bounds count
		// (the run's agent passes it already).
		opts.MaxTokens = OutputReserve(0, model.MaxTokens)
	}
	return func(yield func(agent.StreamEvent) bool) {
		unsent := ctx.Err() != nil // a stopped run's call is not sent
		b := boundsOf(model, llm, opts)
		var seen outputSeen
		var partial agent.MessageBuilder // what streamed, as the agent builds it
		partial.Reset(agent.Message{Role: agent.RoleAssistant, API: model.API, Provider: model.Provider, Model: model.ID})
		started := false
		defer func() {
			if !m.settled { // no final event: the consumer stopped
				m.settle(settle(model, b, nil, seen, unsent, true))
			}
		}()
		// unfinished ends the call with what streamed, as an error.
		unfinished := func(reason agent.StopReason, text string) *agent.Message {
			msg := partial.Message().Clone()
			msg.StopReason, msg.ErrorMessage = reason, text
			if msg.Timestamp == 0 {
				msg.Timestamp = time.Now().UnixMilli()
			}
			return &msg
		}
		inYield, stopped := false, false
		var panicked any
		var stack []byte
		func() {
			defer func() {
				if inYield {
					return // a panic of the consumer's is not the provider's
				}
				if panicked = recover(); panicked != nil {
					stack = debug.Stack()
				}
			}()
			for ev := range p.Provider.Stream(ctx, model, llm, opts) {
				switch {
				case (ev.Type == agent.StreamDone || ev.Type == agent.StreamError) && !m.settled:
					if ev.Message == nil {
						ev.Message = unfinished(agent.StopReasonError, "stream ended without a message")
					}
					seen.final(ev.Message)
					s := settle(model, b, ev.Message, seen, unsent, ctx.Err() != nil)
					m.settle(s)
					if s.usage != ev.Message.Usage {
						msg := *ev.Message
						msg.Usage = s.usage
						ev.Message = &msg
					}
				case ev.Type == agent.StreamStart:
					if !started && ev.Message != nil {
						partial.Reset(*ev.Message)
					}
					started = true
				default:
					seen.add(ev)
					if started {
						partial.Apply(&ev)
					}
				}
				inYield = true
				ok := yield(ev)
				inYield = false
				if !ok {
					stopped = true
					return
				}
			}
		}()
		switch {
		case panicked != nil && (stopped || m.settled):
			panic(panicked) // after the call ended: as it came
		case stopped || m.settled:
			return
		}
		// The provider returned, or panicked, without a final event while
		// the consumer still reads: the call ends here.
		reason, text := agent.StopReasonError, "Stream ended without a final event"
		switch {
		case panicked != nil:
			text = fmt.Sprintf("panic: %v", panicked)
			if m.r != nil {
				m.r.log.Error("model provider panicked; its call ends in an error", "model", m.r.modelRef.String(),
					"panic", panicked, "stack", string(stack))
			}
		case ctx.Err() != nil:
			reason, text = agent.StopReasonAborted, "Request was aborted"
		}
		msg := unfinished(reason, text)
		s := settle(model, b, msg, seen, unsent, ctx.Err() != nil)
		m.settle(s)
		msg.Usage = s.usage
		yield(agent.StreamEvent{Type: agent.StreamError, Reason: reason, Message: msg})
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
