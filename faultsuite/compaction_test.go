//go:build fault && linux

package faultsuite

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// compactionRun is a faux run on an 8k-token model (faux/small in the
// worker's --models) that compacts twice: three turns of 2,500 tokens
// each pass window - reserve (8192 - 2048: its calls ask max_tokens 2,048,
// no more than the reserve); the summary takes the script's
// 4th reply, the 4th turn sleeps (a window to kill the worker in), and the
// second compaction takes the 6th. The script is paced so that a summary
// streams for about 3 s.
func compactionRun() *bus.RunRequest {
	turn := func(id string, sleep float64) agent.ScriptedResponse {
		return agent.ScriptedResponse{Content: []agent.Content{agent.Text(strings.Repeat("abcd", 2500)),
			agent.ToolCall(id, "sleep", map[string]any{"seconds": sleep})}, StopReason: agent.StopReasonToolUse}
	}
	text := func(s string) agent.ScriptedResponse {
		return agent.ScriptedResponse{Content: []agent.Content{agent.Text(s)}}
	}
	summary := func(n string) agent.ScriptedResponse {
		return text("## Goal\nsummary " + n + "\n" + strings.Repeat("note ", 2400))
	}
	return &bus.RunRequest{Prompt: "work for long", Tools: []string{"sleep"}, Model: &bus.ModelRef{Provider: "faux", ID: "small"},
		Compaction: &bus.Compaction{}, MaxTokens: 2048,
		Faux: &bus.FauxScript{TokenSize: 50, TokensPerSecond: 1000, Responses: []agent.ScriptedResponse{
			turn("t1", 0), turn("t2", 0), turn("t3", 0), summary("1"), turn("t4", 6), summary("2"), text("done")}}}
}

// compactionFleet is a fleet whose workers know faux/small's window.
func compactionFleet(t *testing.T) *fleet {
	dir := workDir(t)
	models := filepath.Join(dir, "models.json")
	if err := os.WriteFile(models, []byte(`[{"id":"faux/small","contextWindow":8192}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, dir, startNATS(t, dir, 1, ""))
	f.extraArgs = append(f.extraArgs, "--models", models)
	return f
}

// killAt runs compactionRun on worker w1, kills it -9 when at says so,
// starts w2 (after then, if set), and returns every stored envelope once
// the run finished.
func killAt(t *testing.T, f *fleet, at func(*bus.Envelope) bool, then func()) []*bus.Envelope {
	t.Helper()
	w1 := f.startWorker("c1")
	ctx, cancel := f.ctx(4 * time.Minute)
	defer cancel()
	res, err := f.c.Submit(ctx, "default", compactionRun())
	if err != nil {
		t.Fatal(err)
	}
	killed := false
	for env, err := range f.c.Follow(ctx, res.ID) {
		if err != nil {
			t.Fatalf("follow: %v\nworker log:\n%s", err, w1.tail(40))
		}
		if !killed && env.Attempt == 1 && at(env) {
			w1.kill()
			killed = true
			if then != nil {
				then()
			}
			f.startWorker("c2")
		}
		if env.Type == bus.EventRunFinished {
			break
		}
	}
	if !killed {
		t.Fatalf("the kill point never came\nworker log:\n%s", w1.tail(40))
	}
	raw, err := rawEvents(ctx, f.c, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

type compactions struct {
	starts  map[int]int // by attempt
	ends    []*bus.CompactionEnd
	attempt []int // of each end
	fin     *bus.RunFinished
	tr      *bus.Transcript
}

func readCompactions(t *testing.T, raw []*bus.Envelope) compactions {
	t.Helper()
	c := compactions{starts: map[int]int{}, tr: &bus.Transcript{}}
	for _, e := range raw {
		_ = c.tr.Apply(e)
		ev, err := e.Decode()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case ev.CompactionStart != nil:
			c.starts[e.Attempt]++
		case ev.CompactionEnd != nil:
			if ev.CompactionEnd.Error != "" {
				t.Fatalf("compaction failed: %+v", ev.CompactionEnd)
			}
			c.ends = append(c.ends, ev.CompactionEnd)
			c.attempt = append(c.attempt, e.Attempt)
		case ev.RunFinished != nil:
			c.fin = ev.RunFinished
		}
	}
	if c.fin == nil || c.fin.Status != bus.StatusSucceeded {
		t.Fatalf("run_finished %+v", c.fin)
	}
	return c
}

// kill -9 while the summary call streams: the compaction_end was never
// stored, so the next attempt compacts the same messages again (the
// script's summary is taken again) and the run finishes with both
// compactions and every message.
func TestKillDuringCompaction(t *testing.T) {
	f := compactionFleet(t)
	raw := killAt(t, f, func(e *bus.Envelope) bool { return e.Type == bus.EventCompactionStart }, nil)
	c := readCompactions(t, raw)
	if c.starts[1] != 1 || len(c.ends) != 2 || c.attempt[0] != 2 {
		t.Fatalf("compaction_start per attempt %v, %d compaction_end (attempts %v): want one start in attempt 1 and both ends in attempt 2",
			c.starts, len(c.ends), c.attempt)
	}
	if c.ends[1].FirstKeptIndex <= c.ends[0].FirstKeptIndex || c.ends[0].Summary[:18] != "## Goal\nsummary 1\n" ||
		c.ends[1].MessagesSummarized != c.ends[1].FirstKeptIndex-c.ends[0].FirstKeptIndex {
		t.Fatalf("compactions kept from %d and %d, the second summarised %d", c.ends[0].FirstKeptIndex, c.ends[1].FirstKeptIndex, c.ends[1].MessagesSummarized)
	}
	if n := len(c.tr.Messages); n != 1+2*4+1 {
		t.Fatalf("%d messages, want every one (10)", n)
	}
}

// kill -9 after a compaction (during the next tool call): the next attempt
// starts from the compaction's summary and kept messages, does not
// compact what it summarised again (the second compaction summarises only
// the messages after the first's cut, taking the script's second
// summary), and finishes.
func TestKillAfterCompaction(t *testing.T) {
	f := compactionFleet(t)
	raw := killAt(t, f, func(e *bus.Envelope) bool {
		return e.Type == string(agent.EventToolExecutionStart) && strings.Contains(string(e.Event), `"t4"`)
	}, nil)
	c := readCompactions(t, raw)
	if len(c.ends) != 2 || c.attempt[0] != 1 || c.attempt[1] != 2 || c.starts[2] != 1 {
		t.Fatalf("compaction_end attempts %v, starts %v: want the first in attempt 1 and only the second in attempt 2", c.attempt, c.starts)
	}
	first, second := c.ends[0], c.ends[1]
	if second.FirstKeptIndex <= first.FirstKeptIndex || second.MessagesSummarized != second.FirstKeptIndex-first.FirstKeptIndex ||
		!strings.HasPrefix(second.Summary, "## Goal\nsummary 2") {
		t.Fatalf("the resumed attempt's compaction kept from %d, summarised %d messages, summary %.20q (the first kept from %d)",
			second.FirstKeptIndex, second.MessagesSummarized, second.Summary, first.FirstKeptIndex)
	}
	if second.TokensBefore >= 8192+2500 {
		t.Fatalf("the resumed attempt's context was %d tokens: the full transcript, not the compacted one", second.TokensBefore)
	}
	// The run's usage counts every call: the turns', both summaries'
	// (attempt 1's too) and those cut off.
	want := c.tr.CutOffUsage().TotalTokens
	for _, m := range c.tr.Messages {
		want += m.Usage.TotalTokens
	}
	for _, e := range c.ends {
		want += e.Usage.TotalTokens
	}
	if c.fin.Usage.TotalTokens != want {
		t.Fatalf("run usage %d tokens, want %d (messages, summaries, cut off)", c.fin.Usage.TotalTokens, want)
	}
}

// A worker that does not know the model's window (no compaction of its
// own) still resumes a compacted run from its compacted context, not from
// the full transcript, which would overflow the window.
func TestKillAfterCompactionResumedWithoutAWindow(t *testing.T) {
	f := compactionFleet(t)
	raw := killAt(t, f, func(e *bus.Envelope) bool {
		return e.Type == string(agent.EventToolExecutionStart) && strings.Contains(string(e.Event), `"t4"`)
	}, func() { f.extraArgs = nil })
	c := readCompactions(t, raw)
	if len(c.ends) != 1 || c.attempt[0] != 1 {
		t.Fatalf("compaction_end attempts %v: want only attempt 1's", c.attempt)
	}
	// The resumed call is sent the compacted context (tokensAfter) and t4's
	// turn (2,500 tokens of text, a short tool result). The script's
	// summary is longer than what it replaced, so the full transcript
	// would be less (tokensBefore and t4's turn).
	last := c.tr.Messages[len(c.tr.Messages)-1]
	if d := last.Usage.Input - c.ends[0].TokensAfter; last.Role != agent.RoleAssistant || d < 2500 || d > 2700 {
		t.Fatalf("the resumed attempt's call was sent %d tokens, the compacted context %d and t4's turn: not the compacted context (the full transcript was %d before t4)",
			last.Usage.Input, c.ends[0].TokensAfter, c.ends[0].TokensBefore)
	}
}
