package worker

import (
	"fmt"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/compaction"
)

// The context size after a compaction counts the summary once: the usage
// a provider reports for a call sent the summary includes it (pi's
// estimateContextTokens); only without such usage is it estimated.
func TestCompactorTokensCountTheSummaryOnce(t *testing.T) {
	summary := strings.Repeat("s", 4000) // 1,000 tokens
	old := agent.UserText(strings.Repeat("o", 40000))
	reply := agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonStop, Content: []agent.Content{agent.Text("ok")},
		Usage: agent.Usage{Input: 1500, Output: 10, TotalTokens: 1510}}
	c := &compactor{summary: summary, dropped: 1, fresh: 2}
	live := []agent.Message{old, agent.UserText("q"), reply, agent.UserText(strings.Repeat("n", 400))}
	next := agent.UserText(strings.Repeat("n", 400))
	if got, want := c.tokens(live), 1510+compaction.EstimateTokens(&next); got != want {
		t.Fatalf("with reported usage: %d tokens, want %d (the usage, which holds the summary, and the message after it)", got, want)
	}
	s := bus.CompactionSummaryMessage(summary, 0)
	q := agent.UserText("q")
	if got, want := c.tokens(live[:2]), compaction.EstimateTokens(&s)+compaction.EstimateTokens(&q); got != want {
		t.Fatalf("without usage: %d tokens, want the estimate %d of the summary and the kept message", got, want)
	}
}

// A compact message is answered only by a successful compaction: one
// whose summary call was cancelled (a drain, a hand-back) is taken again
// by the next attempt. Two before one call are one compaction answering
// both, and a resumed attempt takes neither again.
func TestCompactBookkeeping(t *testing.T) {
	ends := []*bus.CompactionEnd{
		{Reason: bus.CompactionManual, ControlSeq: 3, Error: "compaction: the summary call failed: context canceled"},
		{Reason: bus.CompactionManual, ControlSeq: 5, Summary: "s", FirstKeptIndex: 2},
	}
	_, _, controls, _ := compactionsIn(ends)
	if len(controls) != 1 || controls[0] != 5 {
		t.Fatalf("answered %v, want only 5 (3's compaction was cancelled)", controls)
	}
	c := &compactor{}
	c.requestManual("focus on a", 7)
	c.requestManual("focus on b", 8)
	if m := c.takeManual(); m == nil || m.seq != 8 || m.instructions() != "focus on a; focus on b" {
		t.Fatalf("two compacts before a call: %+v", m)
	}
	c.answered(8)
	c.requestManual("again", 7)
	if m := c.takeManual(); m != nil {
		t.Fatalf("a compact an earlier attempt's compaction answered was taken again: %+v", m)
	}
}

// A resumed attempt that starts from a compacted context still avoids
// the summarised calls' keys and counts their turns (internal/callkey,
// invariant 1): a model repeating "c1" gets a new key.
func TestRestoreKeepsTheSummarisedCallKeys(t *testing.T) {
	call := func(id string) agent.Message {
		return agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonToolUse, Content: []agent.Content{agent.ToolCall(id, "read", nil)}}
	}
	result := func(id string) agent.Message { return agent.Message{Role: agent.RoleToolResult, ToolCallID: id} }
	all := []agent.Message{agent.UserText("q"), call("c1"), result("c1"), call("c1-t2-1"), result("c1-t2-1"), call("c1-t3-1"), result("c1-t3-1")}
	r := &run{}
	r.earlier.usedCallKeys = map[string]bool{"other": true}
	c := &compactor{r: r}
	r.comp = c
	ctx := c.restore(&bus.CompactionEnd{Summary: "s", FirstKeptIndex: 5}, all)
	if len(ctx) != 3 {
		t.Fatalf("context of %d messages, want the summary and 2 kept", len(ctx))
	}
	p := r.priorCallKeys()
	if !p.Used["c1"] || !p.Used["c1-t2-1"] || !p.Used["other"] || p.Turns != 2 {
		t.Fatalf("prior keys %v, %d turns: want c1, c1-t2-1 (summarised), other (earlier) and 2 turns", p.Used, p.Turns)
	}
}

// The instructions of many compact messages before one call are joined
// within bus.MaxCompactionInstructionsJoined, the newest kept whole: their
// sum used to grow the summary prompt without a bound.
func TestCompactManualInstructionsBounded(t *testing.T) {
	c := &compactor{}
	for i := range 100 {
		c.requestManual(fmt.Sprintf("%03d", i)+strings.Repeat("x", bus.MaxCompactionInstructions-3), uint64(i+1))
	}
	m := c.takeManual()
	text := m.instructions()
	if len(text) > bus.MaxCompactionInstructionsJoined || m.seq != 100 {
		t.Fatalf("instructions of %d bytes (limit %d), seq %d, from 100 compact messages", len(text), bus.MaxCompactionInstructionsJoined, m.seq)
	}
	if !strings.HasSuffix(text, "; 099"+strings.Repeat("x", bus.MaxCompactionInstructions-3)) || !strings.HasPrefix(text, "09") {
		t.Fatalf("want the newest messages whole, got %.20q…", text)
	}
}
