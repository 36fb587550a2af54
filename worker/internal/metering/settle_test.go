package metering

import (
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
)

// The charge of one call in each case: what the provider reported,
// clamped; the estimate of a call without usage; nothing for a call never
// sent or refused before any output.
func TestSettleCharges(t *testing.T) {
	model := agent.Model{ID: "m", Cost: agent.ModelCost{Input: 1000, Output: 2000, CacheRead: 100, CacheWrite: 1250}}
	llm := agent.Context{SystemPrompt: "be brief", Messages: []agent.Message{agent.UserText(strings.Repeat("word ", 400))}}
	opts := agent.StreamOptions{MaxTokens: 200}
	b := BoundsOf(model, llm, opts)
	est := CallInputTokens(llm)
	if b.inputEstimate != est || b.input != 4*est+1024 || b.output != 200+20+64 || b.reserve != 200 {
		t.Fatalf("bounds %+v, want input estimate %d, input %d, output 284, reserve 200", b, est, 4*est+1024)
	}
	cost := func(in, out, cr, cw int) float64 {
		return (float64(in)*1000 + float64(out)*2000 + float64(cr)*100 + float64(cw)*1250) / 1e6
	}
	done := func(reason agent.StopReason, u agent.Usage) *agent.Message {
		model.ComputeCost(&u)
		u.TotalTokens = u.Input + u.Output + u.CacheRead + u.CacheWrite
		return &agent.Message{Role: agent.RoleAssistant, StopReason: reason, Usage: u}
	}
	seen := OutputSeen{text: 400, thinking: 40} // 147 tokens

	for _, c := range []struct {
		name            string
		final           *agent.Message
		seen            OutputSeen
		unsent, abort   bool
		source          string
		in, out, cr     int
		excessIn, exOut int
	}{
		{name: "reported", final: done(agent.StopReasonStop, agent.Usage{Input: 300, Output: 50, CacheRead: 200}), seen: seen,
			source: SourceReported, in: 300, out: 50, cr: 200},
		{name: "forged", final: done(agent.StopReasonStop, agent.Usage{Input: 1 << 53, Output: 1 << 53}), seen: seen,
			source: SourceClamped, in: 4*est + 1024, out: 284, excessIn: 1<<53 - (4*est + 1024), exOut: 1<<53 - 284},
		{name: "forged cache", final: done(agent.StopReasonStop, agent.Usage{Input: 10, CacheRead: 1 << 53}), seen: seen,
			source: SourceClamped, in: 10, out: 147, cr: 4*est + 1024 - 10, excessIn: 1<<53 + 10 - (4*est + 1024)}, // no output reported: the output seen
		{name: "no usage", final: done(agent.StopReasonStop, agent.Usage{}), seen: seen,
			source: SourceEstimated, in: est, out: 147},
		{name: "aborted", final: done(agent.StopReasonAborted, agent.Usage{}), seen: seen, abort: true,
			source: SourceEstimated, in: est, out: 147},
		{name: "aborted before any output", final: done(agent.StopReasonAborted, agent.Usage{}), abort: true,
			source: SourceEstimated, in: est},
		{name: "consumer stopped", seen: seen, abort: true, source: SourceEstimated, in: est, out: 147},
		{name: "aborted after the prompt's usage", final: done(agent.StopReasonAborted, agent.Usage{Input: est / 2}), seen: seen, abort: true,
			source: SourceReported, in: est, out: 147},
		{name: "aborted after more input than the estimate", final: done(agent.StopReasonAborted, agent.Usage{Input: est + 7}), seen: seen, abort: true,
			source: SourceReported, in: est + 7, out: 147},
		{name: "error midway", final: done(agent.StopReasonError, agent.Usage{}), seen: seen,
			source: SourceEstimated, in: est, out: 147},
		{name: "error before any output", final: done(agent.StopReasonError, agent.Usage{}), source: SourceNone},
		{name: "never sent", final: done(agent.StopReasonAborted, agent.Usage{}), unsent: true, abort: true, source: SourceNone},
		{name: "output past the reserve", final: done(agent.StopReasonAborted, agent.Usage{}), seen: OutputSeen{text: 4000}, abort: true,
			source: SourceEstimated, in: est, out: 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := Settle(model, b, c.final, c.seen, c.unsent, c.abort)
			u := s.Usage
			if s.Source != c.source || u.Input != c.in || u.Output != c.out || u.CacheRead != c.cr || u.CacheWrite != 0 {
				t.Fatalf("charged %s %+v, want %s input %d output %d cacheRead %d", s.Source, u, c.source, c.in, c.out, c.cr)
			}
			if s.ExcessInput != c.excessIn || s.ExcessOutput != c.exOut {
				t.Fatalf("excess %d/%d, want %d/%d", s.ExcessInput, s.ExcessOutput, c.excessIn, c.exOut)
			}
			if want := cost(c.in, c.out, c.cr, 0); !near(u.Cost.Total, want) {
				t.Fatalf("cost %v, want %v", u.Cost.Total, want)
			}
			if u.TotalTokens != c.in+c.out+c.cr {
				t.Fatalf("total tokens %d, want %d", u.TotalTokens, c.in+c.out+c.cr)
			}
			// A charge without the provider's word never passes the
			// call's worst case (what the tenant's hold reserved).
			if worst := (float64(est)*1250 + 200*2000) / 1e6; c.source == SourceEstimated && u.Cost.Total > worst {
				t.Fatalf("estimate $%v over the worst case $%v", u.Cost.Total, worst)
			}
			if u.Reasoning > u.Output {
				t.Fatalf("reasoning %d over output %d", u.Reasoning, u.Output)
			}
		})
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// A model with a context window bounds the input by it (within the
// multiple of the estimate); the output is bounded by what the call asks
// for (OutputReserve), window or not.
func TestSettleBoundsWithAContextWindow(t *testing.T) {
	llm := agent.Context{Messages: []agent.Message{agent.UserText(strings.Repeat("x", 40000))}}
	est := CallInputTokens(llm)
	b := BoundsOf(agent.Model{ContextWindow: 16000}, llm, agent.StreamOptions{})
	if b.input != 16000 || b.inputEstimate != est || b.output != DefaultOutputReserve*11/10+64 || b.reserve != DefaultOutputReserve {
		t.Fatalf("bounds %+v, want input 16000 (the window), output %d, reserve %d", b, DefaultOutputReserve*11/10+64, DefaultOutputReserve)
	}
	b = BoundsOf(agent.Model{ContextWindow: 200000, MaxTokens: 128000}, llm, agent.StreamOptions{})
	if b.reserve != MaxTableOutputReserve || b.output != MaxTableOutputReserve*11/10+64 {
		t.Fatalf("bounds %+v, want the reserve at most %d", b, MaxTableOutputReserve)
	}
	b = BoundsOf(agent.Model{ContextWindow: 8000}, llm, agent.StreamOptions{})
	if b.inputEstimate != 8000 {
		t.Fatalf("input estimate %d, want the window (8000)", b.inputEstimate)
	}
	b = BoundsOf(agent.Model{ContextWindow: 1 << 20, MaxTokens: 300}, llm, agent.StreamOptions{})
	if b.input != 4*est+1024 || b.output != 300+30+64 {
		t.Fatalf("bounds %+v, want input %d, output 394", b, 4*est+1024)
	}
	b = BoundsOf(agent.Model{}, llm, agent.StreamOptions{})
	if b.output != DefaultOutputReserve+DefaultOutputReserve/10+64 {
		t.Fatalf("output bound %d without maxTokens or window", b.output)
	}
}
