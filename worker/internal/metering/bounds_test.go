package metering

import (
	"math"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
)

// boundsLLM is a call's context: about 2 KB of prompt.
var boundsLLM = agent.Context{Messages: []agent.Message{agent.UserText(strings.Repeat("word ", 400))}}

// Bounds near MaxInt (a request's maxTokens before requests were bounded,
// a model table's window or maxTokens) saturate: the output bound, the
// reservation and the charge never wrap below zero.
func TestSettleBoundsDoNotWrap(t *testing.T) {
	model := agent.Model{ID: "m", Cost: agent.ModelCost{Input: 1000, Output: 1000}}
	for _, c := range []struct {
		name  string
		model agent.Model
		opts  agent.StreamOptions
	}{
		{"request maxTokens", model, agent.StreamOptions{MaxTokens: math.MaxInt}},
		{"table maxTokens", agent.Model{ID: "m", MaxTokens: math.MaxInt, Cost: model.Cost}, agent.StreamOptions{}},
		{"table window", agent.Model{ID: "m", ContextWindow: math.MaxInt, Cost: model.Cost}, agent.StreamOptions{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := BoundsOf(c.model, boundsLLM, c.opts)
			if b.input < 0 || b.output < b.reserve || b.reserve <= 0 || b.inputEstimate <= 0 {
				t.Fatalf("bounds %+v wrapped", b)
			}
			for _, u := range []agent.Usage{{Input: 300, Output: 50}, {Input: math.MaxInt, Output: math.MaxInt, CacheRead: math.MaxInt}} {
				s := Settle(c.model, b, &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonStop, Usage: u},
					OutputSeen{text: 150}, false, false)
				if s.Usage.Input < 0 || s.Usage.Output < 0 || s.Usage.TotalTokens < 0 || s.Tokens() < 0 || !(s.Usage.Cost.Total >= 0) {
					t.Fatalf("reported %+v: charge %s %+v, tokens %d", u, s.Source, s.Usage, s.Tokens())
				}
			}
			s := Settle(c.model, b, nil, OutputSeen{text: 150}, false, true)
			if s.Usage.Input <= 0 || s.Usage.Output <= 0 || s.Tokens() <= 0 || !(s.Usage.Cost.Total > 0) {
				t.Fatalf("cut off: charge %s %+v", s.Source, s.Usage)
			}
		})
	}
	if n := Reservation(boundsLLM, math.MaxInt, 0); n < CallInputTokens(boundsLLM) {
		t.Fatalf("estimateTokens with maxTokens MaxInt: %d, less than its input estimate", n)
	}
	if n := Reservation(boundsLLM, 0, math.MaxInt); n < CallInputTokens(boundsLLM) {
		t.Fatalf("estimateTokens with the table's maxTokens MaxInt: %d", n)
	}
}

// A reported usage whose fields sum past MaxInt (Input 2^62+2, CacheRead
// 2^62, CacheWrite MaxInt wrap to 1) is clamped field by field: it used to
// pass the input bound and be charged as reported.
func TestSettleClampsUsageWhoseSumWraps(t *testing.T) {
	model := agent.Model{ID: "m", Cost: agent.ModelCost{Input: 1000, Output: 1000, CacheRead: 1000, CacheWrite: 1000}}
	b := BoundsOf(model, boundsLLM, agent.StreamOptions{MaxTokens: 200})
	for _, u := range []agent.Usage{
		{Input: 1<<62 + 2, CacheRead: 1 << 62, CacheWrite: math.MaxInt, Output: 10},
		{Input: math.MaxInt, Output: math.MaxInt, CacheRead: math.MaxInt, CacheWrite: math.MaxInt},
		{Input: 10, Output: math.MaxInt - 5, CacheRead: 10},
	} {
		model.ComputeCost(&u)
		s := Settle(model, b, &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonStop, Usage: u}, OutputSeen{}, false, false)
		v := s.Usage
		if s.Source != SourceClamped || SatAdd(v.Input, v.CacheRead, v.CacheWrite) > b.input || v.Output > b.output ||
			min(v.Input, v.CacheRead, v.CacheWrite, v.Output) < 0 {
			t.Fatalf("reported %+v: charged %s %+v, want clamped within input %d, output %d", u, s.Source, v, b.input, b.output)
		}
		if max := (float64(b.input) + float64(b.output)) * 1000 / 1e6; !(v.Cost.Total <= max+1e-9) {
			t.Fatalf("reported %+v: charged $%v, more than the bounds' $%v", u, v.Cost.Total, max)
		}
	}
}

// A reported usage within the bounds is charged at the model table's
// prices, its total counted again: the provider's cost (NaN, nothing,
// +Inf, a trillion dollars) and total are not the charge.
func TestSettleRecomputesAReportedUsagesCost(t *testing.T) {
	model := agent.Model{ID: "m", Cost: agent.ModelCost{Input: 1000, Output: 1000, CacheRead: 100}}
	b := BoundsOf(model, boundsLLM, agent.StreamOptions{MaxTokens: 200})
	want := (300*1000 + 50*1000 + 20*100) / 1e6
	for _, c := range []float64{math.NaN(), 0, math.Inf(1), math.Inf(-1), 1e12} {
		u := agent.Usage{Input: 300, Output: 50, CacheRead: 20, TotalTokens: 1 << 40,
			Cost: agent.Cost{Input: c, Output: c, Total: c}}
		s := Settle(model, b, &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonStop, Usage: u}, OutputSeen{text: 150}, false, false)
		if s.Source != SourceReported || !near(s.Usage.Cost.Total, want) || !near(s.Usage.Cost.Input, 0.3) || s.Usage.TotalTokens != 370 {
			t.Errorf("provider cost %v: charged %s $%v (input $%v), total tokens %d; want the table's $%v and 370 tokens",
				c, s.Source, s.Usage.Cost.Total, s.Usage.Cost.Input, s.Usage.TotalTokens, want)
		}
	}
}

// A call that completed after streaming an answer, whose provider reported
// the prompt only (output 0), is charged the answer's estimate: it used to
// be free.
func TestSettleReportedPromptOnlyChargesTheOutputSeen(t *testing.T) {
	model := agent.Model{ID: "m", Cost: agent.ModelCost{Input: 1000, Output: 1000}}
	b := BoundsOf(model, boundsLLM, agent.StreamOptions{MaxTokens: 200})
	answer := strings.Repeat("y", 450) // 150 tokens at bytes / 3
	for _, stop := range []agent.StopReason{agent.StopReasonStop, agent.StopReasonToolUse, agent.StopReasonLength} {
		final := &agent.Message{Role: agent.RoleAssistant, StopReason: stop, Usage: agent.Usage{Input: 300},
			Content: []agent.Content{agent.Text(answer)}}
		s := Settle(model, b, final, OutputSeen{text: len(answer)}, false, false)
		if s.Usage.Input != 300 || s.Usage.Output != 150 || !near(s.Usage.Cost.Total, (300+150)*1000/1e6) {
			t.Errorf("stop %s: charged %s %+v, want the reported 300 input and the 150 output tokens seen", stop, s.Source, s.Usage)
		}
	}
	// Output reported: the provider's word.
	final := &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonStop, Usage: agent.Usage{Input: 300, Output: 90}}
	if s := Settle(model, b, final, OutputSeen{text: len(answer)}, false, false); s.Usage.Output != 90 || s.Source != SourceReported {
		t.Errorf("output 90 reported: charged %s %+v", s.Source, s.Usage)
	}
	// No output reported, none streamed (an empty answer), even of a
	// reasoning model: as reported.
	model.Reasoning = true
	final = &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonStop, Usage: agent.Usage{Input: 300}}
	if s := Settle(model, BoundsOf(model, boundsLLM, agent.StreamOptions{MaxTokens: 200}), final, OutputSeen{}, false, false); s.Usage.Output != 0 || s.Usage.Input != 300 {
		t.Errorf("an empty answer: charged %s %+v", s.Source, s.Usage)
	}
}

// A reasoning model's call cut off, or answered without usage, before it
// streamed any reasoning may have reasoned unseen (a provider that hides
// it): its output is charged at the whole reserve, which the worst case
// counts. It used to be charged the visible output only (nothing, when it
// was cut off while reasoning).
func TestSettleReasoningUnseenIsChargedTheReserve(t *testing.T) {
	reasoning := agent.Model{ID: "o", Reasoning: true, Cost: agent.ModelCost{Input: 1000, Output: 4000}}
	plain := reasoning
	plain.Reasoning = false
	b := BoundsOf(reasoning, boundsLLM, agent.StreamOptions{MaxTokens: 200})
	cut := &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonAborted}
	for _, c := range []struct {
		name           string
		model          agent.Model
		final          *agent.Message
		seen           OutputSeen
		out, reasoning int
	}{
		{"cut off before any output", reasoning, cut, OutputSeen{}, 200, 200},
		{"consumer gone before any output", reasoning, nil, OutputSeen{}, 200, 200},
		{"cut off after some text", reasoning, cut, OutputSeen{text: 150}, 200, 150},
		{"no usage", reasoning, &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonStop}, OutputSeen{text: 150}, 200, 150},
		{"cut off after the prompt's usage", reasoning, &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonAborted,
			Usage: agent.Usage{Input: 10}}, OutputSeen{}, 200, 200},
		{"reasoning streamed", reasoning, cut, OutputSeen{text: 150, thinking: 300}, 150, 100},
		{"not a reasoning model", plain, cut, OutputSeen{text: 150}, 50, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := Settle(c.model, BoundsOf(c.model, boundsLLM, agent.StreamOptions{MaxTokens: 200}), c.final, c.seen, false, true)
			if s.Usage.Output != c.out || s.Usage.Reasoning != c.reasoning || s.Usage.Input < b.inputEstimate {
				t.Fatalf("charged %s %+v, want output %d (reasoning %d)", s.Source, s.Usage, c.out, c.reasoning)
			}
			if worst := (float64(b.inputEstimate)*1000 + 200*4000) / 1e6; s.Usage.Cost.Total > worst+1e-9 {
				t.Fatalf("charged $%v, more than the worst case $%v", s.Usage.Cost.Total, worst)
			}
		})
	}
}
