package worker

import (
	"math"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/worker/internal/metering"
)

// A provider may write the whole prompt to its cache: a call's worst case
// prices its input at the dearer of the input and cache-write prices.
func TestTenantWorstCasePricesCacheWrites(t *testing.T) {
	t.Parallel()
	r := &run{}
	r.model = agent.Model{Cost: agent.ModelCost{Input: 3, CacheWrite: 3.75, CacheRead: 0.3, Output: 15}}
	llm := agent.Context{SystemPrompt: "be brief", Messages: []agent.Message{agent.UserText("what is 6*7?")}}
	want := (float64(metering.CallInputTokens(llm))*3.75 + 100*15) / 1e6
	if got := worstCost(r.model, llm, 100); math.Abs(got-want) > 1e-12 {
		t.Fatalf("worst case $%.9f, want $%.9f", got, want)
	}
}
