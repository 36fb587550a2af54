// Package metering works out a model call's charge: what it cost, worked
// out once and taken by every consumer (the run's tally, hence
// run_finished and limits.maxCostUsd; the tenant's ledger; the shared rate
// limits; the metrics; the trace).
//
//   - The provider reported usage: that usage, clamped to what the call
//     could have used (Bounds). The excess is logged once and counted.
//     A call that streamed output its provider reported none of is
//     charged the output's estimate.
//   - The call was sent and ended without usage (cut off by an abort, the
//     run's timeout, a drain's hard stop or a lost lease; or a provider that
//     sends none): its input estimate (CallInputTokens, the same the rate
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
// In the worker the figure travels in a callMeter (worker/settle.go) that
// the run's outermost stream wrapper (observeStream) puts in the call's
// context and the provider's wrapper (meteredProvider, the innermost)
// fills, before the final event or, for a call whose consumer stopped
// before one, when the provider returns: the wrappers in between (limits,
// tenant) settle in their defers, which run after that.
package metering

import (
	"encoding/json"
	"math"

	"github.com/agentfleet/agentfleet/agent"
)

// Usage sources: how a call's charge was worked out.
const (
	SourceReported  = "reported"  // the provider's usage, within the bounds
	SourceClamped   = "clamped"   // the provider's usage, cut to the bounds
	SourceEstimated = "estimated" // no usage: the estimate
	SourceNone      = "none"      // not sent, or refused before any output: nothing
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

// Charge is a call's charge.
type Charge struct {
	Usage agent.Usage
	// Source is SourceReported, SourceClamped, SourceEstimated or
	// SourceNone; "" for a call no provider metered.
	Source string
	// ExcessInput and ExcessOutput are the reported tokens beyond the
	// bounds (SourceClamped).
	ExcessInput, ExcessOutput int
	// Reported is the provider's usage (when it reported any).
	Reported agent.Usage
}

// Unreported reports whether the provider's word was not taken (no usage).
func (s Charge) Unreported() bool {
	return s.Source == SourceEstimated || s.Source == SourceNone
}

// Tokens counts every token of the charge, as the shared rate limits do.
func (s Charge) Tokens() int {
	u := s.Usage
	return SatAdd(u.Input, u.Output, u.CacheRead, u.CacheWrite)
}

// Bounds are the most a call could use: input (cached tokens
// included) within the model's context window and within InputClampFactor
// times the estimate plus InputClampFloor; output within the call's
// output reserve (OutputReserve: what it asked for as max_tokens) plus
// the margin.
type Bounds struct {
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

func BoundsOf(model agent.Model, llm agent.Context, opts agent.StreamOptions) Bounds {
	est := CallInputTokens(llm)
	in := SatAdd(satMul(InputClampFactor, est), InputClampFloor)
	if w := model.ContextWindow; w > 0 {
		in = min(in, w)
	}
	reserve := OutputReserve(opts.MaxTokens, model.MaxTokens)
	return Bounds{inputEstimate: min(est, in), input: in, output: SatAdd(reserve, reserve/OutputClampMargin, 64), reserve: reserve,
		reasoning: model.Reasoning}
}

// SatAdd sums token counts (negative ones count 0) without wrapping: a
// sum past MaxInt is MaxInt. A count a request or a provider chose must
// not turn a bound or a charge negative.
func SatAdd(counts ...int) int {
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

// OutputSeen counts the bytes a call streamed.
type OutputSeen struct {
	text, thinking int // bytes of text and tool calls (names, arguments); of thinking
}

func (o *OutputSeen) Add(ev agent.StreamEvent) {
	switch ev.Type {
	case agent.StreamTextDelta, agent.StreamToolCallDelta:
		o.text += len(ev.Delta)
	case agent.StreamThinkingDelta:
		o.thinking += len(ev.Delta)
	case agent.StreamToolCallStart:
		o.text += len(ev.Name)
	}
}

// Final takes the final message's content when it says more than the
// deltas did (a provider that sends whole blocks).
func (o *OutputSeen) Final(m *agent.Message) {
	text, thinking := 0, 0
	for i := range m.Content {
		c := &m.Content[i]
		text += len(c.Text)
		thinking += len(c.Thinking)
	}
	o.text, o.thinking = max(o.text, text), max(o.thinking, thinking)
}

func (o OutputSeen) Any() bool { return o.text+o.thinking > 0 }

// OutputBytesPerToken is how a call's streamed output (text, thinking,
// tool calls' names and arguments) is counted when no usage says: its
// bytes / 3, rounded up. Prose runs about 4 bytes a token, but answers hold
// code, numbers, markup and other languages, whose tokens are shorter, and
// a charge without the provider's word errs high.
const OutputBytesPerToken = 3

func outputTokens(bytes int) int { return (bytes + OutputBytesPerToken - 1) / OutputBytesPerToken }

// Settle works out a call's charge. final is its final message (nil: the
// call ended without one), seen what it streamed, unsent that it was
// never sent, aborted that its context ended. Whatever the source, the
// charge's total and cost are worked out here, at the model table's
// prices: a provider's word on them is not taken.
func Settle(model agent.Model, b Bounds, final *agent.Message, seen OutputSeen, unsent, aborted bool) Charge {
	s := settleTokens(b, final, seen, unsent, aborted)
	s.Usage.Cost = agent.Cost{}
	s.Usage.TotalTokens = s.Tokens()
	model.ComputeCost(&s.Usage)
	return s
}

// settleTokens works out the tokens of a call's charge (Settle).
func settleTokens(b Bounds, final *agent.Message, seen OutputSeen, unsent, aborted bool) Charge {
	var u agent.Usage
	if final != nil {
		u = NonNegative(final.Usage)
	}
	reported := SatAdd(u.Input, u.Output, u.CacheRead, u.CacheWrite) > 0
	refused := final != nil && final.StopReason == agent.StopReasonError && !aborted && !seen.Any()
	s := Charge{Source: SourceNone}
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
		s.Source, s.Usage = SourceEstimated, est
	case cutOff:
		// Usage that came before the cut (a provider reporting the prompt
		// first) does not lower the estimate.
		v := &s.Usage
		if in := SatAdd(v.Input, v.CacheRead, v.CacheWrite); in < est.Input {
			v.Input += est.Input - in
		}
		v.Output, v.Reasoning = max(v.Output, est.Output), max(v.Reasoning, est.Reasoning)
	case s.Usage.Output == 0 && seen.Any():
		// A provider that reported the prompt only: the output it
		// streamed is not free.
		s.Usage.Output, s.Usage.Reasoning = est.Output, est.Reasoning
	}
	return s
}

// clampUsage cuts a reported usage (no count negative) to the bounds:
// input (cache reads first, then cache writes, then the rest) to the input
// bound, output to the output bound, reasoning to the output. Each count
// is cut before any is added: a sum of counts near MaxInt would wrap.
func clampUsage(b Bounds, u agent.Usage) Charge {
	s := Charge{Usage: u, Source: SourceReported, Reported: u}
	if in := SatAdd(u.Input, u.CacheRead, u.CacheWrite); in > b.input {
		s.ExcessInput = in - b.input // at most MaxInt - the bound: a metric's count
		u.Input = min(u.Input, b.input)
		u.CacheWrite = min(u.CacheWrite, b.input-u.Input)
		u.CacheRead = min(u.CacheRead, b.input-u.Input-u.CacheWrite)
	}
	if u.Output > b.output {
		s.ExcessOutput = u.Output - b.output
		u.Output = b.output
	}
	u.Reasoning = min(u.Reasoning, u.Output)
	s.Usage = u
	if s.ExcessInput > 0 || s.ExcessOutput > 0 {
		s.Source = SourceClamped
	}
	return s
}

// RequestOverheadTokens is what a call's worst case adds to the bytes it
// sends for what the provider counts beside them (its own framing of
// roles, messages and tools, and the request's other fields).
const RequestOverheadTokens = 64

// CallInputTokens is a call's input estimate: everything it sends (the
// system prompt, the messages as JSON, the tools as JSON) in bytes / 4,
// rounded up, plus RequestOverheadTokens. The shared rate limits reserve
// it (Reservation), the budgets' worst case counts it, and a call that
// ends without usage is charged it (Settle).
func CallInputTokens(llm agent.Context) int {
	n := len(llm.SystemPrompt)
	if b, err := json.Marshal(llm.Messages); err == nil {
		n += len(b)
	}
	n += toolsJSONBytes(llm.Tools)
	return (n+3)/4 + RequestOverheadTokens
}

// toolsJSONBytes is the size of the tools as a request carries them: the
// name, description and parameters' schema of each, in a function wrapper.
func toolsJSONBytes(tools []*agent.Tool) int {
	type function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	}
	n := 0
	for _, t := range tools {
		if t == nil {
			continue
		}
		fn := struct {
			Type     string   `json:"type"`
			Function function `json:"function"`
		}{"function", function{t.Name, t.Description, t.Parameters}}
		if b, err := json.Marshal(fn); err == nil {
			n += len(b) + 1
		} else {
			// Parameters that are not JSON still go out as some bytes.
			n += len(t.Name) + len(t.Description) + len(t.Parameters) + 64
		}
	}
	return n
}

// MaxTableOutputReserve caps the output reserve a call takes from the
// model table: the default pi's OpenAI-compatible provider asks for.
const MaxTableOutputReserve = 32000

// OutputReserve is a call's output reserve: the request's maxTokens, else
// the model table's (at most MaxTableOutputReserve), else
// DefaultOutputReserve. Every call asks for it (max_tokens: the run's
// agent passes it, meteredProvider when nobody did), so the worst case,
// the rate limits' reservation, the clamp of a reported output and the cap
// of an estimated one all count what the call asked for.
func OutputReserve(requestMax, modelMax int) int {
	switch {
	case requestMax > 0:
		return requestMax
	case modelMax > 0:
		return min(modelMax, MaxTableOutputReserve)
	}
	return DefaultOutputReserve
}

// DefaultOutputReserve is the output reserve of a call, and what it asks
// for, when neither the request nor the model table bounds the output.
const DefaultOutputReserve = 4096

// Reservation is a call's rate-limit reservation: its input estimate
// (CallInputTokens: everything it sends, in bytes / 4 rounded up, plus
// RequestOverheadTokens; the same estimate the tenant's hold counts and a
// call cut off is charged) plus the output reserve (OutputReserve: the
// request's maxTokens, else the model table's, at most
// MaxTableOutputReserve, else DefaultOutputReserve).
func Reservation(llm agent.Context, requestMax, modelMax int) int {
	return SatAdd(CallInputTokens(llm), OutputReserve(requestMax, modelMax))
}

// NonNegative clamps negative counts and costs (a hostile endpoint's, or a
// forged transcript's) to zero, so usage only ever grows.
func NonNegative(u agent.Usage) agent.Usage {
	for _, p := range []*int{&u.Input, &u.Output, &u.CacheRead, &u.CacheWrite, &u.Reasoning, &u.TotalTokens} {
		*p = max(*p, 0)
	}
	for _, p := range []*float64{&u.Cost.Input, &u.Cost.Output, &u.Cost.CacheRead, &u.Cost.CacheWrite, &u.Cost.Total} {
		if !(*p > 0) { // also NaN
			*p = 0
		}
	}
	return u
}
