package worker_test

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/llm/faux"
	"github.com/agentfleet/agentfleet/worker"
	"github.com/agentfleet/agentfleet/worker/internal/compaction"
)

// compactScript is a faux model for compaction tests: a summary call (pi's
// summarisation system prompt) answers "## Goal\nsummary N" (or what
// summaryFail says), any other call reads a file until turns calls were
// made, then answers "done". overflowAt makes those calls (1-based) fail
// with a provider's context-length error instead. It records what each
// call was sent.
type compactScript struct {
	turns       int
	gateAt      int // this call (1-based) calls the gate tool instead of read
	overflowAt  map[int]bool
	summaryFail string
	sameID      bool // every call's id is "c1"
	// overflowText is streamed before an overflowAt call's refusal.
	overflowText string

	mu        sync.Mutex
	calls     int
	summaries []string          // the summary calls' prompts
	contexts  [][]agent.Message // the agent's calls' messages
	overflows int
}

const overflowText = "400 Bad Request: This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please reduce the length of the messages."

func (s *compactScript) reply(llm agent.Context) faux.Response {
	s.mu.Lock()
	defer s.mu.Unlock()
	if strings.Contains(llm.SystemPrompt, "context summarization assistant") {
		s.summaries = append(s.summaries, llm.Messages[0].TextOf())
		if s.summaryFail != "" {
			return faux.Response{StopReason: agent.StopReasonError, ErrorMessage: s.summaryFail}
		}
		return fleettest.Text(fmt.Sprintf("## Goal\nsummary %d", len(s.summaries)))
	}
	s.calls++
	if s.overflowAt[s.calls] {
		s.overflows++
		r := faux.Response{StopReason: agent.StopReasonError, ErrorMessage: overflowText}
		if s.overflowText != "" {
			r.Content = []agent.Content{agent.Text(s.overflowText)}
		}
		return r
	}
	s.contexts = append(s.contexts, append([]agent.Message(nil), llm.Messages...))
	if s.calls > s.turns+len(s.overflowAt) {
		return fleettest.Text("done")
	}
	id := fmt.Sprintf("c%d", s.calls)
	if s.sameID {
		id = "c1"
	}
	if s.calls == s.gateAt {
		return fleettest.ToolCall(id, "gate", map[string]any{})
	}
	return fleettest.ToolCall(id, "read", map[string]any{"path": fmt.Sprintf("f%d", s.calls)})
}

// readTool returns resultChars characters (resultChars/4 tokens).
func readTool(resultChars int) *agent.Tool {
	return agent.NewTool("read", "read a file", func(_ context.Context, a struct {
		Path string `json:"path"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		return agent.ToolResult{Content: []agent.Content{agent.Text(a.Path + ":" + strings.Repeat("x", resultChars))}}, nil
	})
}

// compactWorker starts a worker whose faux/small model is s, with a
// context window of window tokens.
func compactWorker(f *fleettest.Fleet, s *compactScript, window, resultChars int, edit func(*worker.Config)) {
	cfg := worker.Config{
		Tools:        []*agent.Tool{readTool(resultChars)},
		Providers:    map[string]worker.Provider{"faux": &worker.FauxProvider{M: faux.New(faux.Options{TokenSize: 64, Fallback: s.reply})}},
		ModelWindows: map[string]worker.ModelWindow{"faux/small": {ContextWindow: window}},
	}
	if edit != nil {
		edit(&cfg)
	}
	f.StartWorker(cfg)
}

func compactRequest(c *bus.Compaction) *bus.RunRequest {
	return &bus.RunRequest{Prompt: "read every file", Tools: []string{"read"}, Model: &bus.ModelRef{Provider: "faux", ID: "small"},
		Compaction: c, Limits: &bus.Limits{MaxTurns: 1000}}
}

// compactionsOf returns the run's compaction_start and compaction_end events.
func compactionsOf(t *testing.T, envs []*bus.Envelope) (starts []*bus.CompactionStart, ends []*bus.CompactionEnd) {
	t.Helper()
	for _, e := range envs {
		switch e.Type {
		case bus.EventCompactionStart:
			starts = append(starts, fleettest.Decode(t, e).CompactionStart)
		case bus.EventCompactionEnd:
			ends = append(ends, fleettest.Decode(t, e).CompactionEnd)
		}
	}
	return starts, ends
}

// checkCuts: every cut lands on a turn boundary of the whole transcript,
// and every context the model was sent after a compaction starts with the
// summary and holds no tool result without its call.
func checkCuts(t *testing.T, full []agent.Message, ends []*bus.CompactionEnd, contexts [][]agent.Message) {
	t.Helper()
	for i, e := range ends {
		if e.FirstKeptIndex <= 0 || e.FirstKeptIndex >= len(full) {
			t.Fatalf("compaction %d: firstKeptIndex %d of %d messages", i, e.FirstKeptIndex, len(full))
		}
		if r := full[e.FirstKeptIndex].Role; r == agent.RoleToolResult {
			t.Fatalf("compaction %d cut at a tool result (message %d)", i, e.FirstKeptIndex)
		}
		if i > 0 && e.FirstKeptIndex <= ends[i-1].FirstKeptIndex {
			t.Fatalf("compaction %d kept from %d, the previous from %d", i, e.FirstKeptIndex, ends[i-1].FirstKeptIndex)
		}
	}
	for n, msgs := range contexts {
		calls := map[string]bool{}
		for _, m := range msgs {
			for _, c := range m.ToolCalls() {
				calls[c.ID] = true
			}
			if m.Role == agent.RoleToolResult && !calls[m.ToolCallID] {
				t.Fatalf("call %d: tool result %s sent without its call", n, m.ToolCallID)
			}
		}
	}
}

// Conformance: a run past its window compacts on turn boundaries, each
// later summary updates the previous one (pi's update prompt with
// <previous-summary>), the summary calls' usage is in the events and the
// run's usage, and the run finishes with every message in its events.
func TestCompactionCutsOnTurnBoundariesAndUpdatesTheSummary(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 24}
	compactWorker(f, s, 8000, 4000, nil)
	id := f.Submit("", compactRequest(&bus.Compaction{Instructions: "keep file names"}))
	envs := f.Follow(id)
	tr := checkRun(t, id, envs)
	starts, ends := compactionsOf(t, envs)
	if len(ends) < 2 || len(starts) != len(ends) {
		t.Fatalf("%d compaction_start, %d compaction_end; want >= 2 each", len(starts), len(ends))
	}
	var summaryUsage int
	for i, e := range ends {
		if e.Error != "" || e.Reason != bus.CompactionThreshold || e.Summary != fmt.Sprintf("## Goal\nsummary %d", i+1) ||
			e.TokensBefore <= 8000-4096 || e.TokensAfter >= e.TokensBefore || e.Usage == nil || e.Usage.Input == 0 || e.Model != "faux/small" {
			t.Fatalf("compaction_end %d: %+v", i, e)
		}
		summaryUsage += e.Usage.TotalTokens
	}
	if len(tr.Messages) != 1+2*24+1 {
		t.Fatalf("the events hold %d messages, want every one (%d)", len(tr.Messages), 1+2*24+1)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	checkCuts(t, tr.Messages, ends, s.contexts)
	if strings.Contains(s.summaries[0], "<previous-summary>") || !strings.Contains(s.summaries[0], "Additional focus: keep file names") {
		t.Fatalf("first summary prompt:\n%s", s.summaries[0])
	}
	for i := 1; i < len(s.summaries); i++ {
		want := fmt.Sprintf("<previous-summary>\n## Goal\nsummary %d\n</previous-summary>", i)
		if !strings.Contains(s.summaries[i], want) || !strings.Contains(s.summaries[i], "incorporate into the existing summary") {
			t.Fatalf("summary %d does not update summary %d:\n%s", i+1, i, s.summaries[i])
		}
	}
	last := s.contexts[len(s.contexts)-1]
	if !strings.HasPrefix(last[0].TextOf(), bus.CompactionSummaryPrefix+fmt.Sprintf("## Goal\nsummary %d", len(ends))) {
		t.Fatalf("the last call did not start from the last summary: %q", last[0].TextOf())
	}
	fin := finishedOf(t, envs)
	var turnsUsage int
	for _, m := range tr.Messages {
		turnsUsage += m.Usage.TotalTokens
	}
	if fin.Usage.TotalTokens != turnsUsage+summaryUsage {
		t.Fatalf("run usage %d, want the turns' %d plus the summaries' %d", fin.Usage.TotalTokens, turnsUsage, summaryUsage)
	}
}

// Call keys stay unique in the run after compactions (internal/callkey,
// invariant 1): a model repeating its call id every turn gets a new key
// each time, also where the earlier calls were summarised away.
func TestCompactionKeepsCallKeysUnique(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 24, sameID: true}
	compactWorker(f, s, 8000, 4000, nil)
	id := f.Submit("", compactRequest(&bus.Compaction{}))
	envs := f.Follow(id)
	tr := checkRun(t, id, envs)
	if _, ends := compactionsOf(t, envs); len(ends) < 2 {
		t.Fatalf("%d compactions, want >= 2", len(ends))
	}
	seen := map[string]int{}
	for i, m := range tr.Messages {
		for _, c := range m.ToolCalls() {
			if j, dup := seen[c.ID]; dup {
				t.Fatalf("call key %q at messages %d and %d", c.ID, j, i)
			}
			seen[c.ID] = i
		}
	}
	if len(seen) != 24 {
		t.Fatalf("%d call keys, want 24", len(seen))
	}
}

// A provider's context-length error compacts and retries the call once;
// a second refusal of the retried call ends the run as the provider said.
func TestCompactionOverflowRetriesOnce(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 4, overflowAt: map[int]bool{5: true}}
	compactWorker(f, s, 1_000_000, 400, nil)
	id := f.Submit("", compactRequest(&bus.Compaction{KeepRecentTokens: 150}))
	envs := f.Follow(id)
	tr := checkRun(t, id, envs)
	_, ends := compactionsOf(t, envs)
	if len(ends) != 1 || ends[0].Reason != bus.CompactionOverflow || ends[0].Error != "" {
		t.Fatalf("compactions %+v, want one after the overflow", ends)
	}
	for _, m := range tr.Messages {
		if m.StopReason == agent.StopReasonError {
			t.Fatalf("the refused call reached the transcript: %+v", m)
		}
	}
	s.mu.Lock()
	if s.overflows != 1 || len(s.summaries) != 1 {
		t.Fatalf("%d refusals, %d summaries", s.overflows, len(s.summaries))
	}
	s.mu.Unlock()

	s2 := &compactScript{turns: 4, overflowAt: map[int]bool{5: true, 6: true}}
	f2 := newFleet(t)
	compactWorker(f2, s2, 1_000_000, 400, nil)
	id = f2.Submit("", compactRequest(&bus.Compaction{KeepRecentTokens: 150}))
	envs = f2.Follow(id)
	fin := finishedOf(t, envs)
	if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonModelError || !strings.Contains(fin.Error, "maximum context length") {
		t.Fatalf("refused twice: %+v", fin)
	}
	if _, ends := compactionsOf(t, envs); len(ends) != 1 {
		t.Fatalf("%d compactions, want exactly one retry", len(ends))
	}
	s2.mu.Lock()
	defer s2.mu.Unlock()
	if s2.overflows != 2 {
		t.Fatalf("%d calls refused, want 2 (the call and its one retry)", s2.overflows)
	}
}

// A summary call that fails fails the run with compaction_failed and the
// call's reason, in run_finished and in compaction_end.
func TestCompactionSummaryFailureFailsCleanly(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 24, summaryFail: "503 Service Unavailable: the summariser is overloaded"}
	compactWorker(f, s, 8000, 4000, nil)
	id := f.Submit("", compactRequest(&bus.Compaction{}))
	envs := f.Follow(id)
	fin := checkEnvelopes(t, id, envs)
	if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonCompactionFailed ||
		fin.Error != "compaction: the summary call failed: 503 Service Unavailable: the summariser is overloaded" {
		t.Fatalf("run_finished %+v", fin)
	}
	if _, ends := compactionsOf(t, envs); len(ends) != 1 || ends[0].Error != fin.Error || ends[0].Summary != "" {
		t.Fatalf("compaction_end %+v", ends)
	}
}

// 300 tool turns in an 8k-token window (reserve and keep at the scaled
// defaults) finish, with the compactions in the events; without
// compaction the same run fails (its context passes the transcript bound
// well before the end).
func TestCompactionLongRunFinishes(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 300}
	bound := func(c *worker.Config) { c.MaxTranscriptBytes = 256 << 10 }
	compactWorker(f, s, 8192, 2000, bound)
	id := f.Submit("", compactRequest(&bus.Compaction{}))
	envs := f.Follow(id)
	tr := checkRun(t, id, envs)
	_, ends := compactionsOf(t, envs)
	if len(ends) < 20 || len(tr.Messages) != 1+2*300+1 {
		t.Fatalf("%d compactions, %d messages", len(ends), len(tr.Messages))
	}
	s.mu.Lock()
	checkCuts(t, tr.Messages, ends, s.contexts)
	s.mu.Unlock()
	fin := finishedOf(t, envs)
	t.Logf("300 tool turns in an 8k window: %d compactions, %d messages in the events, %d tokens in all", len(ends), len(tr.Messages), fin.Usage.TotalTokens)

	f2 := newFleet(t)
	compactWorker(f2, &compactScript{turns: 300}, 8192, 2000, bound)
	id = f2.Submit("", compactRequest(nil))
	if fin := f2.WaitFinished(id); fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonTranscriptTooLarge {
		t.Fatalf("without compaction: %+v", fin)
	}
}

// controlSeen reports the control messages the worker took.
type controlSeen struct {
	worker.NopObserver
	kinds chan string
}

func (c *controlSeen) ControlReceived(kind string) {
	select {
	case c.kinds <- kind:
	default:
	}
}

// The compact verb compacts at the run's next model call with the
// message's instructions, also for a run without "compaction" (its model's
// window is known), and never on its own: the threshold is not checked.
// A run on a model without a known window rejects it.
func TestCompactControlCompactsAtTheNextCall(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 4}
	release := make(chan struct{})
	started := make(chan struct{}, 8)
	gate := agent.NewTool("gate", "waits for the test", func(ctx context.Context, _ struct{}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return agent.ToolResult{Content: []agent.Content{agent.Text("opened")}}, nil
	})
	seen := &controlSeen{kinds: make(chan string, 8)}
	compactWorker(f, s, 100_000, 4000, func(c *worker.Config) {
		c.Tools = append(c.Tools, gate)
		c.Observer = seen
		c.ModelWindows["faux/small"] = worker.ModelWindow{ContextWindow: 100_000, KeepRecentTokens: 1000}
	})
	// Three reads, then the gate holds the run while the compact message
	// is taken.
	s.gateAt = 4
	req := compactRequest(nil)
	req.Tools = []string{"read", "gate"}
	id := f.Submit("", req)
	<-started
	if _, err := f.Client.Compact(fleettest.Context(t), id, "focus on f2"); err != nil {
		t.Fatal(err)
	}
	if k := <-seen.kinds; k != bus.KindCompact {
		t.Fatalf("the worker took %s", k)
	}
	close(release)
	envs := f.Follow(id)
	checkRun(t, id, envs)
	starts, ends := compactionsOf(t, envs)
	if len(ends) != 1 || ends[0].Reason != bus.CompactionManual || starts[0].ControlSeq == 0 || ends[0].ControlSeq != starts[0].ControlSeq {
		t.Fatalf("compactions %+v %+v", starts, ends)
	}
	s.mu.Lock()
	if len(s.summaries) != 1 || !strings.HasSuffix(s.summaries[0], "Additional focus: focus on f2") {
		t.Fatalf("summary prompts %q", s.summaries)
	}
	s.mu.Unlock()

	// No window: the compact message is rejected, the run goes on.
	f2 := newFleet(t)
	s2 := &compactScript{turns: 1, gateAt: 1}
	release2 := make(chan struct{})
	gate2 := agent.NewTool("gate", "waits", func(ctx context.Context, _ struct{}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		started <- struct{}{}
		select {
		case <-release2:
		case <-ctx.Done():
		}
		return agent.ToolResult{}, nil
	})
	compactWorker(f2, s2, 0, 10, func(c *worker.Config) { c.Tools = append(c.Tools, gate2); c.ModelWindows = nil })
	req = compactRequest(nil)
	req.Tools = []string{"read", "gate"}
	id = f2.Submit("", req)
	<-started
	if _, err := f2.Client.Compact(fleettest.Context(t), id, ""); err != nil {
		t.Fatal(err)
	}
	var rejected *bus.ControlRejected
	envs = nil
	for env, err := range f2.Client.Follow(fleettest.Context(t), id) {
		if err != nil {
			t.Fatal(err)
		}
		envs = append(envs, env)
		if env.Type == bus.EventControlRejected {
			rejected = fleettest.Decode(t, env).Control
			close(release2)
		}
		if env.Type == bus.EventRunFinished {
			break
		}
	}
	if rejected == nil || rejected.Kind != bus.KindCompact || !strings.Contains(rejected.Reason, "no known context window") {
		t.Fatalf("control_rejected %+v\n%s", rejected, fleettest.Dump(envs))
	}
	if fin := finishedOf(t, envs); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
}

// A continuation of a compacted run starts from its compacted context:
// the snapshot holds the summary and the kept messages, not the full
// history; without the snapshot the events give the same context.
func TestCompactionContinuationLoadsTheCompactedContext(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 12}
	compactWorker(f, s, 8000, 4000, nil)
	first := f.Submit("", compactRequest(&bus.Compaction{}))
	envs := f.Follow(first)
	full := checkRun(t, first, envs)
	_, ends := compactionsOf(t, envs)
	if len(ends) == 0 {
		t.Fatal("the first run did not compact")
	}
	last := ends[len(ends)-1]
	msgs, h, err := f.Client.LoadSnapshot(fleettest.Context(t), first, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := len(full.Messages) - last.FirstKeptIndex + 1
	if h.Messages != want || !strings.HasPrefix(msgs[0].TextOf(), bus.CompactionSummaryPrefix+last.Summary) || msgs[1].Role == agent.RoleToolResult {
		t.Fatalf("snapshot of %d messages (want %d) starting %q", h.Messages, want, msgs[0].TextOf())
	}
	cont := func(from string) []agent.Message {
		t.Helper()
		s.mu.Lock()
		s.calls, s.turns = 1000, 0 // the next call answers "done"
		n := len(s.contexts)
		s.mu.Unlock()
		id := f.Submit("", &bus.RunRequest{Prompt: "and now?", ContinueFrom: from, Model: &bus.ModelRef{Provider: "faux", ID: "small"}})
		checkRun(t, id, f.Follow(id))
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.contexts[n]
	}
	sent := cont(first)
	if len(sent) != want+1 || !strings.HasPrefix(sent[0].TextOf(), bus.CompactionSummaryPrefix) {
		t.Fatalf("the continuation's model was sent %d messages starting %q, want the %d of the compacted context and its prompt",
			len(sent), sent[0].TextOf(), want)
	}
	obs, err := f.Client.JetStream().ObjectStore(fleettest.Context(t), f.Client.Names().TranscriptsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Delete(fleettest.Context(t), first); err != nil {
		t.Fatal(err)
	}
	if sent = cont(first); len(sent) != want+1 || !strings.HasPrefix(sent[0].TextOf(), bus.CompactionSummaryPrefix+last.Summary) {
		t.Fatalf("from the events: %d messages starting %q", len(sent), sent[0].TextOf())
	}
	// A continuation that compacts again updates the prior's summary
	// (pi's update prompt), not summarise it as the user's text.
	s.mu.Lock()
	s.calls, s.turns = 0, 12
	n := len(s.summaries)
	s.mu.Unlock()
	req := compactRequest(&bus.Compaction{})
	req.ContinueFrom = first
	id := f.Submit("", req)
	envs = f.Follow(id)
	checkRun(t, id, envs)
	if _, ends := compactionsOf(t, envs); len(ends) == 0 {
		t.Fatal("the continuation did not compact")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.summaries[n]; !strings.Contains(p, "<previous-summary>\n"+last.Summary+"\n</previous-summary>") || strings.Contains(p, "[User]: "+bus.CompactionSummaryPrefix[:20]) {
		t.Fatalf("the continuation's first summary prompt does not update the prior's summary:\n%s", p)
	}
}

// A request's compaction problems are listed with its others, the
// decoder's and the worker's (values that do not fit the window); on a
// model without a known window the run goes on without compaction and
// run_started says so.
func TestCompactionRequestProblems(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	compactWorker(f, &compactScript{}, 8000, 10, nil)
	req := compactRequest(&bus.Compaction{ReserveTokens: 9000, KeepRecentTokens: -1, Instructions: strings.Repeat("x", 5000)})
	req.Limits.MaxTurns = -3
	body, err := agent.MarshalJSON(req)
	if err != nil {
		t.Fatal(err)
	}
	// Raw: the Go client refuses what its own checks find.
	id := bus.NewRunID()
	if _, err := f.Client.SubmitRaw(fleettest.Context(t), "", id, body); err != nil {
		t.Fatal(err)
	}
	fin := f.WaitFinished(id)
	for _, want := range []string{"limits.maxTurns -3", "compaction.keepRecentTokens -1 is not in 0..", "compaction.instructions is 5000 bytes"} {
		if fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, want) {
			t.Errorf("bad request %q: no %q", fin.Error, want)
		}
	}
	fin = f.WaitFinished(f.Submit("", compactRequest(&bus.Compaction{ReserveTokens: 9000})))
	if fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, "compaction.reserveTokens 9000 must be less than the model's context window of 8000") ||
		!strings.Contains(fin.Error, "compaction.keepRecentTokens 4000 must be less than the context window less the reserve") {
		t.Errorf("the worker's problems: %+v", fin)
	}

	f2 := newFleet(t)
	compactWorker(f2, &compactScript{}, 0, 10, func(c *worker.Config) { c.ModelWindows = nil })
	id = f2.Submit("", compactRequest(&bus.Compaction{}))
	envs := f2.Follow(id)
	checkRun(t, id, envs)
	if rs := fleettest.Decode(t, envs[0]).RunStarted; !strings.Contains(rs.Notice, "compaction is off: model faux/small has no known context window") {
		t.Fatalf("run_started notice %q", rs.Notice)
	}
}

// compaction.model sends the summary calls to another model (here another
// provider's), named in compaction_end; its usage counts in the run's.
func TestCompactionModelOfAnotherProvider(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 12}
	var mu sync.Mutex
	var asked []string
	other := faux.New(faux.Options{Fallback: func(llm agent.Context) faux.Response {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, llm.SystemPrompt)
		return fleettest.Text("## Goal\nfrom the other model")
	}})
	models := &modelNames{}
	compactWorker(f, s, 8000, 4000, func(c *worker.Config) {
		c.Providers["other"] = &worker.FauxProvider{M: other}
		c.Observer = models
	})
	id := f.Submit("", compactRequest(&bus.Compaction{Model: &bus.ModelRef{Provider: "other", ID: "summariser"}}))
	envs := f.Follow(id)
	checkRun(t, id, envs)
	_, ends := compactionsOf(t, envs)
	if len(ends) == 0 || ends[0].Model != "other/summariser" || ends[0].Summary != "## Goal\nfrom the other model" || ends[0].Usage == nil || ends[0].Usage.TotalTokens == 0 {
		t.Fatalf("compactions %+v", ends)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if len(s.summaries) != 0 || len(asked) != len(ends) || !strings.Contains(asked[0], "context summarization assistant") {
		t.Fatalf("the run's model got %d summary calls, the other %d (of %d compactions)", len(s.summaries), len(asked), len(ends))
	}
	// The summary calls are reported as the other model's.
	models.mu.Lock()
	if models.n["other/summariser"] != len(ends) || models.n["faux/small"] == 0 {
		t.Fatalf("model requests reported %v, want %d of other/summariser", models.n, len(ends))
	}
	models.mu.Unlock()
	// An unknown provider is the request's problem.
	fin := f.WaitFinished(f.Submit("", compactRequest(&bus.Compaction{Model: &bus.ModelRef{Provider: "nosuch", ID: "m"}})))
	if fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, `compaction.model: unknown model provider "nosuch"`) {
		t.Fatalf("unknown provider: %+v", fin)
	}
}

// pricedCompactionFaux is a faux provider whose models have prices ($1,000 per
// million tokens in and out, or usd).
type pricedCompactionFaux struct {
	*worker.FauxProvider
	usd float64
}

func (p pricedCompactionFaux) Model(id string) agent.Model {
	m := p.FauxProvider.Model(id)
	usd := p.usd
	if usd == 0 {
		usd = 1000
	}
	m.Cost = agent.ModelCost{Input: usd, Output: usd}
	return m
}

// limits.maxCostUsd bounds a compacted run by what its calls are sent
// (the compacted context), not by the whole history: a budget a little
// above what the run spends lets it finish.
func TestCompactionMaxCostCountsTheCompactedContext(t *testing.T) {
	t.Parallel()
	run := func(maxCost float64) *bus.RunFinished {
		f := newFleet(t)
		s := &compactScript{turns: 30}
		compactWorker(f, s, 8000, 4000, func(c *worker.Config) {
			c.Providers = map[string]worker.Provider{"faux": pricedCompactionFaux{&worker.FauxProvider{M: faux.New(faux.Options{TokenSize: 64, Fallback: s.reply})}, 0}}
		})
		req := compactRequest(&bus.Compaction{})
		req.MaxTokens = 100
		req.Limits.MaxCostUsd = maxCost
		return f.WaitFinished(f.Submit("", req))
	}
	free := run(0)
	if free.Status != bus.StatusSucceeded || free.Cost <= 0 {
		t.Fatalf("without a budget: %+v", free)
	}
	// 12,000 tokens above the spend: more than any compacted call is sent
	// (window 8,000), less than the history (30 results of 1,000 tokens).
	if fin := run(free.Cost + 12); fin.Status != bus.StatusSucceeded {
		t.Fatalf("with a budget $12 above the $%.2f spent: %s/%s (%s)", free.Cost, fin.Status, fin.Reason, fin.Error)
	}
}

// A summary call the run's cost bound refuses ends the run as
// budget_exceeded, not compaction_failed.
func TestCompactionSummaryRefusedByTheBudget(t *testing.T) {
	t.Parallel()
	run := func(maxCost float64) []*bus.Envelope {
		f := newFleet(t)
		s := &compactScript{turns: 12}
		compactWorker(f, s, 8000, 4000, func(c *worker.Config) {
			c.Providers = map[string]worker.Provider{"faux": pricedCompactionFaux{&worker.FauxProvider{M: faux.New(faux.Options{TokenSize: 64, Fallback: s.reply})}, 0}}
		})
		req := compactRequest(&bus.Compaction{ReserveTokens: 6000, KeepRecentTokens: 500})
		req.MaxTokens = 100
		req.Limits.MaxCostUsd = maxCost
		return f.Follow(f.Submit("", req))
	}
	// The spend before the first compaction, and the summary call's cost.
	var before float64
	var sum *bus.CompactionEnd
	for _, e := range run(0) {
		if e.Type == bus.EventCompactionEnd {
			sum = fleettest.Decode(t, e).CompactionEnd
			break
		}
		if e.Type == string(agent.EventMessageEnd) {
			if m := fleettest.Decode(t, e).Agent.Message; m.Role == agent.RoleAssistant {
				before += m.Usage.Cost.Total
			}
		}
	}
	// Room for the summary call's input and half its output reserve
	// (4,800 tokens): less than its worst case, more than the next turn's.
	envs := run(before + sum.Usage.Cost.Input + 2.4)
	fin := finishedOf(t, envs)
	if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonBudgetExceeded || !strings.Contains(fin.Error, "maxCostUsd") {
		t.Fatalf("run_finished %s/%s (%s), want budget_exceeded", fin.Status, fin.Reason, fin.Error)
	}
	if _, ends := compactionsOf(t, envs); len(ends) != 1 || ends[0].Error == "" {
		t.Fatalf("compaction_end %+v, want the refused one (%s)", ends, fin.Error)
	}
}

// cappedFaux is a faux provider whose models have an output limit (the
// model table's maxTokens) and refuse a call asking more, as providers do.
type cappedFaux struct {
	*worker.FauxProvider
	max int
}

func (p cappedFaux) Model(id string) agent.Model {
	m := p.FauxProvider.Model(id)
	m.MaxTokens = p.max
	return m
}

func (p cappedFaux) Stream(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	if opts.MaxTokens > p.max {
		return func(yield func(agent.StreamEvent) bool) {
			yield(agent.StreamEvent{Type: agent.StreamError, Message: &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonError,
				ErrorMessage: fmt.Sprintf("400 Bad Request: max_tokens %d is more than this model's %d", opts.MaxTokens, p.max)}})
		}
	}
	return p.FauxProvider.Stream(ctx, model, llm, opts)
}

// The summary call asks at most the model's output limit (its maxTokens):
// 0.8 x reserve (1,600 here) would be refused by a model of 1,000.
func TestCompactionSummaryWithinTheModelsOutputLimit(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 12}
	compactWorker(f, s, 8000, 4000, func(c *worker.Config) {
		c.Providers = map[string]worker.Provider{"faux": cappedFaux{&worker.FauxProvider{M: faux.New(faux.Options{TokenSize: 64, Fallback: s.reply})}, 1000}}
	})
	id := f.Submit("", compactRequest(&bus.Compaction{}))
	envs := f.Follow(id)
	checkRun(t, id, envs)
	if _, ends := compactionsOf(t, envs); len(ends) == 0 {
		t.Fatal("no compaction")
	}
}

// countingFaux counts the provider's calls open at once.
type countingFaux struct {
	*worker.FauxProvider
	mu         *sync.Mutex
	open, most *int
}

func (p countingFaux) Stream(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	return func(yield func(agent.StreamEvent) bool) {
		p.mu.Lock()
		*p.open++
		*p.most = max(*p.most, *p.open)
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			*p.open--
			p.mu.Unlock()
		}()
		for ev := range p.FauxProvider.Stream(ctx, model, llm, opts) {
			if !yield(ev) {
				return
			}
		}
	}
}

// Overflow recovery compacts once the refused call's stream is over (its
// holds and reservations released): the summary call never runs inside
// it. A refusal after content was streamed is passed on, not retried.
func TestCompactionOverflowAfterTheRefusedCall(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 4, overflowAt: map[int]bool{5: true}}
	var mu sync.Mutex
	var open, most int
	compactWorker(f, s, 1_000_000, 400, func(c *worker.Config) {
		c.Providers = map[string]worker.Provider{"faux": countingFaux{&worker.FauxProvider{M: faux.New(faux.Options{TokenSize: 64, Fallback: s.reply})}, &mu, &open, &most}}
	})
	id := f.Submit("", compactRequest(&bus.Compaction{KeepRecentTokens: 150}))
	envs := f.Follow(id)
	checkRun(t, id, envs)
	if _, ends := compactionsOf(t, envs); len(ends) != 1 || ends[0].Reason != bus.CompactionOverflow {
		t.Fatalf("compactions %+v, want one after the overflow", ends)
	}
	mu.Lock()
	if most != 1 {
		t.Fatalf("%d provider calls open at once: the summary ran inside the refused call", most)
	}
	mu.Unlock()

	f2 := newFleet(t)
	s2 := &compactScript{turns: 4, overflowAt: map[int]bool{5: true}, overflowText: "partial answer"}
	compactWorker(f2, s2, 1_000_000, 400, nil)
	id = f2.Submit("", compactRequest(&bus.Compaction{KeepRecentTokens: 150}))
	envs = f2.Follow(id)
	if fin := finishedOf(t, envs); fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonModelError {
		t.Fatalf("refused after content: %+v", fin)
	}
	if _, ends := compactionsOf(t, envs); len(ends) != 0 {
		t.Fatalf("%d compactions after a refusal that followed content, want none", len(ends))
	}
}

// A summary call on compaction.model is priced at that model's prices: a
// dear summariser cannot pass the run's budget because the run's model is
// cheap (the call is refused before it is made).
func TestCompactionModelPricedAsItself(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 12}
	dear := faux.New(faux.Options{Fallback: func(agent.Context) faux.Response { return fleettest.Text("## Goal\ndear summary") }})
	compactWorker(f, s, 8000, 4000, func(c *worker.Config) {
		c.Providers = map[string]worker.Provider{
			"faux":  pricedCompactionFaux{&worker.FauxProvider{M: faux.New(faux.Options{TokenSize: 64, Fallback: s.reply})}, 1},
			"other": pricedCompactionFaux{&worker.FauxProvider{M: dear}, 1_000_000}, // $1 a token
		}
	})
	req := compactRequest(&bus.Compaction{Model: &bus.ModelRef{Provider: "other", ID: "dear"}})
	req.MaxTokens = 100
	req.Limits.MaxCostUsd = 100
	fin := f.WaitFinished(f.Submit("", req))
	if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonBudgetExceeded || fin.Cost > 100 {
		t.Fatalf("run_finished %s/%s cost $%.2f (%s), want budget_exceeded within $100", fin.Status, fin.Reason, fin.Cost, fin.Error)
	}
}

// modelNames counts the model requests the observer is told of, by model.
type modelNames struct {
	worker.NopObserver
	mu sync.Mutex
	n  map[string]int
}

func (o *modelNames) ModelRequest(_ worker.RunInfo, mr worker.ModelRequest) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	o.n[mr.Model]++
}

// vllmFaux refuses, as vLLM's OpenAI server does, a call whose prompt
// (estimated) plus max_tokens passes the window, in vLLM's words, which
// llm/overflow recognises. refused counts the refusals.
type vllmFaux struct {
	*worker.FauxProvider
	window  int
	refused *atomic.Int32
}

func (p vllmFaux) Stream(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	in := 0
	for i := range llm.Messages {
		in += compaction.EstimateTokens(&llm.Messages[i])
	}
	if in+opts.MaxTokens > p.window {
		p.refused.Add(1)
		return func(yield func(agent.StreamEvent) bool) {
			yield(agent.StreamEvent{Type: agent.StreamError, Message: &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonError,
				ErrorMessage: fmt.Sprintf("400 Bad Request: This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
					p.window, in+opts.MaxTokens, in, opts.MaxTokens)}})
		}
	}
	return p.FauxProvider.Stream(ctx, model, llm, opts)
}

// vllmRun runs turns tool turns on an 8k window (scaled defaults, calls
// asking the default 4,096 max_tokens) against vllmFaux, with summaries of
// summaryWords words; it returns the events and the refusals.
func vllmRun(t *testing.T, turns, summaryWords int) ([]*bus.Envelope, int) {
	f := newFleet(t)
	s := &compactScript{turns: turns}
	var refused atomic.Int32
	compactWorker(f, s, 8000, 2000, func(c *worker.Config) {
		reply := func(llm agent.Context) faux.Response {
			r := s.reply(llm)
			if summaryWords > 0 && strings.Contains(llm.SystemPrompt, "context summarization assistant") {
				r = fleettest.Text("## Goal\n" + strings.Repeat("note ", summaryWords))
			}
			return r
		}
		c.Providers = map[string]worker.Provider{"faux": vllmFaux{&worker.FauxProvider{M: faux.New(faux.Options{TokenSize: 64, Fallback: reply})}, 8000, &refused}}
	})
	envs := f.Follow(f.Submit("", compactRequest(&bus.Compaction{})))
	return envs, int(refused.Load())
}

// On a server that counts prompt + max_tokens against the window, the
// threshold fires before the server refuses: no compaction is an
// overflow, no call is refused.
func TestCompactionThresholdLeavesRoomForMaxTokens(t *testing.T) {
	t.Parallel()
	envs, refused := vllmRun(t, 20, 0)
	_, ends := compactionsOf(t, envs)
	for _, e := range ends {
		if e.Reason != bus.CompactionThreshold {
			t.Fatalf("a %s compaction (%+v): the threshold, window - reserve, is past what the server accepts with max_tokens", e.Reason, e)
		}
	}
	if fin := finishedOf(t, envs); fin.Status != bus.StatusSucceeded || len(ends) == 0 || refused != 0 {
		t.Fatalf("run_finished %s/%s (%s), %d compactions, %d refused calls", fin.Status, fin.Reason, fin.Error, len(ends), refused)
	}
}

// With summaries of about 1,000 tokens, the compacted context (keep and
// summary) plus max_tokens still fits an 8k window: the run goes on
// through many compactions without a refused call.
func TestCompactionSmallWindowKeepsRoomForTheSummary(t *testing.T) {
	t.Parallel()
	envs, refused := vllmRun(t, 40, 800)
	_, ends := compactionsOf(t, envs)
	fin := finishedOf(t, envs)
	if fin.Status != bus.StatusSucceeded || len(ends) < 5 || refused != 0 {
		t.Fatalf("run_finished %s/%s (%s), %d compactions, %d refused calls", fin.Status, fin.Reason, fin.Error, len(ends), refused)
	}
	for _, e := range ends {
		if e.TokensAfter >= e.TokensBefore {
			t.Errorf("a compaction grew the context: %d to %d tokens", e.TokensBefore, e.TokensAfter)
		}
	}
}

// A manual compaction whose summary call fails is reported
// (compaction_end with error) and the run goes on with its context as it
// was, as pi's /compact does: it used to fail the run compaction_failed.
func TestCompactControlFailureGoesOn(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 5, gateAt: 4, summaryFail: "503 Service Unavailable: the summariser is overloaded"}
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	gate := agent.NewTool("gate", "waits for the test", func(ctx context.Context, _ struct{}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return agent.ToolResult{Content: []agent.Content{agent.Text("opened")}}, nil
	})
	seen := &controlSeen{kinds: make(chan string, 8)}
	compactWorker(f, s, 100_000, 4000, func(c *worker.Config) {
		c.Tools = append(c.Tools, gate)
		c.Observer = seen
		c.ModelWindows["faux/small"] = worker.ModelWindow{ContextWindow: 100_000, KeepRecentTokens: 1000}
	})
	req := compactRequest(nil)
	req.Tools = []string{"read", "gate"}
	id := f.Submit("", req)
	<-started
	if _, err := f.Client.Compact(fleettest.Context(t), id, ""); err != nil {
		t.Fatal(err)
	}
	if k := <-seen.kinds; k != bus.KindCompact {
		t.Fatalf("the worker took %s", k)
	}
	close(release)
	envs := f.Follow(id)
	tr := checkRun(t, id, envs)
	_, ends := compactionsOf(t, envs)
	if len(ends) != 1 || ends[0].Reason != bus.CompactionManual || !strings.Contains(ends[0].Error, "overloaded") || ends[0].Cancelled {
		t.Fatalf("compaction_end %+v, want the failed manual one", ends)
	}
	if len(tr.Messages) != 1+2*5+1 {
		t.Fatalf("the run went on to %d messages, want %d", len(tr.Messages), 1+2*5+1)
	}
}

// blockingSummaries holds every summary call until its context ends,
// telling the test it began.
type blockingSummaries struct {
	*worker.FauxProvider
	began chan struct{}
}

func (p blockingSummaries) Stream(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	if !strings.Contains(llm.SystemPrompt, "context summarization assistant") {
		return p.FauxProvider.Stream(ctx, model, llm, opts)
	}
	return func(yield func(agent.StreamEvent) bool) {
		p.began <- struct{}{}
		<-ctx.Done()
		yield(agent.StreamEvent{Type: agent.StreamError, Message: &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonAborted,
			ErrorMessage: ctx.Err().Error()}})
	}
}

// A summary call cancelled (here by an abort) ends its compaction
// cancelled, not failed: readers show it so, and the run's reason is the
// abort's.
func TestCompactionCancelledIsNotAFailure(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 24}
	began := make(chan struct{}, 1)
	compactWorker(f, s, 8000, 4000, func(c *worker.Config) {
		c.Providers = map[string]worker.Provider{"faux": blockingSummaries{&worker.FauxProvider{M: faux.New(faux.Options{TokenSize: 64, Fallback: s.reply})}, began}}
	})
	id := f.Submit("", compactRequest(&bus.Compaction{}))
	<-began
	if _, err := f.Client.Abort(fleettest.Context(t), id, "stop"); err != nil {
		t.Fatal(err)
	}
	envs := f.Follow(id)
	_, ends := compactionsOf(t, envs)
	if len(ends) != 1 || ends[0].Error == "" || !ends[0].Cancelled {
		t.Fatalf("compaction_end %+v, want one cancelled", ends)
	}
	if fin := finishedOf(t, envs); fin.Status != bus.StatusAborted {
		t.Fatalf("run_finished %+v, want aborted", fin)
	}
}

// compaction.model on the faux provider is refused, as the run's model
// is, by a worker that runs no faux models (--allow-faux off): the demo
// model's echo would grow the context at every compaction.
func TestCompactionModelFauxNeedsAllowFaux(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 1}
	compactWorker(f, s, 8000, 10, func(c *worker.Config) {
		c.NoFaux = true
		c.Providers["other"] = &worker.FauxProvider{M: faux.New(faux.Options{TokenSize: 64, Fallback: s.reply})}
		c.ModelWindows["other/small"] = worker.ModelWindow{ContextWindow: 8000}
	})
	req := compactRequest(&bus.Compaction{Model: &bus.ModelRef{Provider: "faux", ID: "demo"}})
	req.Model = &bus.ModelRef{Provider: "other", ID: "small"}
	fin := f.WaitFinished(f.Submit("", req))
	if fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, "compaction.model faux/demo: this worker does not run faux models (--allow-faux is off)") {
		t.Fatalf("run_finished %+v", fin)
	}
}

// compaction.model's own context window, when known, must hold what a
// summary call may send and ask: a smaller summariser is the request's
// problem, not a compaction_failed later.
func TestCompactionModelWindowChecked(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 1}
	compactWorker(f, s, 100_000, 10, func(c *worker.Config) {
		c.Providers["other"] = &worker.FauxProvider{M: faux.New(faux.Options{TokenSize: 64, Fallback: s.reply})}
		c.ModelWindows["other/tiny"] = worker.ModelWindow{ContextWindow: 8000}
		c.ModelWindows["other/big"] = worker.ModelWindow{ContextWindow: 128_000}
	})
	fin := f.WaitFinished(f.Submit("", compactRequest(&bus.Compaction{Model: &bus.ModelRef{Provider: "other", ID: "tiny"}})))
	if fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, "compaction.model other/tiny has a context window of 8000 tokens, less than the") {
		t.Fatalf("run_finished %+v", fin)
	}
	id := f.Submit("", compactRequest(&bus.Compaction{Model: &bus.ModelRef{Provider: "other", ID: "big"}}))
	checkRun(t, id, f.Follow(id))
}

// A compact message with nothing to cut (the context is the newest turn
// alone: here the prompt, at the first call) is answered with
// control_rejected, so that a resumed attempt does not take it again; it
// used to be consumed silently.
func TestCompactControlNothingToCutIsAnswered(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	s := &compactScript{turns: 0}
	// Stored after the request and before any worker runs it: the pickup's
	// catch-up gives it to the agent before its first model call.
	id := f.Submit("", compactRequest(nil))
	seq, err := f.Client.Compact(fleettest.Context(t), id, "")
	if err != nil {
		t.Fatal(err)
	}
	compactWorker(f, s, 100_000, 10, nil)
	envs := f.Follow(id)
	checkRun(t, id, envs)
	var rejected *bus.ControlRejected
	for _, e := range envs {
		if e.Type == bus.EventControlRejected {
			rejected = fleettest.Decode(t, e).Control
		}
	}
	if rejected == nil || rejected.Kind != bus.KindCompact || rejected.ControlSeq != seq || !strings.Contains(rejected.Reason, "nothing to compact") {
		t.Fatalf("control_rejected %+v, want the compact message (seq %d) answered\n%s", rejected, seq, fleettest.Dump(envs))
	}
	if _, ends := compactionsOf(t, envs); len(ends) != 0 {
		t.Fatalf("compactions %+v, want none", ends)
	}
}
