package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/llm/faux"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testModel = agent.Model{ID: "faux-1", API: "faux", Provider: "faux"}

func text(s string, stop agent.StopReason) faux.Response {
	return faux.Response{Content: []agent.Content{agent.Text(s)}, StopReason: stop}
}

func call(id, name string, args map[string]any) faux.Response {
	return faux.Response{Content: []agent.Content{agent.ToolCall(id, name, args)}, StopReason: agent.StopReasonToolUse}
}

func echoTool(name string) *agent.Tool {
	return &agent.Tool{Name: name, Execute: func(context.Context, string, map[string]any, agent.UpdateFunc) (agent.ToolResult, error) {
		return agent.TextResult(name + " done"), nil
	}}
}

// types records the event types a listener saw.
type recorder struct {
	mu     sync.Mutex
	events []agent.Event
}

func (r *recorder) listen(_ context.Context, ev agent.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ev.Message != nil {
		m := ev.Message.Clone()
		ev.Message = &m
	}
	r.events = append(r.events, ev)
	return nil
}

func (r *recorder) types() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if e.Type != agent.EventMessageUpdate {
			out = append(out, string(e.Type))
		}
	}
	return strings.Join(out, ",")
}

func roles(msgs []agent.Message) string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Role
	}
	return strings.Join(out, ",")
}

func TestDefaultState(t *testing.T) {
	a := agent.New(agent.Options{})
	s := a.State()
	if s.SystemPrompt != "" || s.Model.ID != "unknown" || s.ThinkingLevel != agent.ThinkingOff ||
		len(s.Tools) != 0 || len(s.Messages) != 0 || s.IsStreaming || s.StreamingMessage != nil ||
		len(s.PendingToolCalls) != 0 || s.ErrorMessage != "" {
		t.Fatalf("unexpected default state: %+v", s)
	}
	a.Abort() // idle: no-op
	if err := a.WaitForIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestNoStreamFnFailsRun(t *testing.T) {
	a := agent.New(agent.Options{})
	rec := &recorder{}
	a.Subscribe(rec.listen)
	if err := a.Prompt(context.Background(), "hi"); err != nil {
		t.Fatal(err)
	}
	if got := rec.types(); got != "agent_start,turn_start,message_start,message_end,message_start,message_end,turn_end,agent_end" {
		t.Fatalf("events: %s", got)
	}
	if !strings.Contains(a.State().ErrorMessage, "No stream function") {
		t.Fatalf("error: %q", a.State().ErrorMessage)
	}
}

// State seen from inside listeners (and from another goroutine) during a
// run is consistent with the event being delivered.
func TestStateDuringRun(t *testing.T) {
	model := faux.New(faux.Options{TokenSize: 1},
		faux.Response{Content: []agent.Content{agent.Text("abcdefgh"), agent.ToolCall("c1", "slow", nil)}, StopReason: agent.StopReasonToolUse},
		text("done", agent.StopReasonStop))
	release := make(chan struct{})
	started := make(chan struct{})
	slow := &agent.Tool{Name: "slow", Execute: func(ctx context.Context, _ string, _ map[string]any, _ agent.UpdateFunc) (agent.ToolResult, error) {
		close(started)
		<-release
		return agent.TextResult("ok"), nil
	}}
	a := agent.New(agent.Options{Model: testModel, StreamFn: model.Stream, Tools: []*agent.Tool{slow}})
	var checks []string
	a.Subscribe(func(_ context.Context, ev agent.Event) error {
		s := a.State()
		if !s.IsStreaming {
			checks = append(checks, "not streaming during "+string(ev.Type))
		}
		switch ev.Type {
		case agent.EventMessageUpdate:
			if ev.StreamEvent.Type == agent.StreamTextDelta {
				if s.StreamingMessage == nil || s.StreamingMessage.TextOf() != ev.Message.TextOf() {
					checks = append(checks, "streaming message differs from the event's partial")
				}
			}
		case agent.EventMessageEnd:
			last := s.Messages[len(s.Messages)-1]
			if last.Role != ev.Message.Role || s.StreamingMessage != nil {
				checks = append(checks, "message_end not reduced before listeners")
			}
		case agent.EventToolExecutionStart:
			if !reflect.DeepEqual(s.PendingToolCalls, []string{"c1"}) {
				checks = append(checks, fmt.Sprintf("pending %v", s.PendingToolCalls))
			}
		case agent.EventToolExecutionEnd:
			if len(s.PendingToolCalls) != 0 {
				checks = append(checks, "pending not cleared")
			}
		}
		return nil
	})
	done := make(chan error, 1)
	go func() { done <- a.Prompt(context.Background(), "go") }()
	<-started
	// From another goroutine while the tool runs.
	s := a.State()
	if !s.IsStreaming || roles(s.Messages) != "user,assistant" || len(s.PendingToolCalls) != 1 {
		t.Errorf("mid-run state: streaming=%v roles=%s pending=%v", s.IsStreaming, roles(s.Messages), s.PendingToolCalls)
	}
	if err := a.Reset(); !errors.Is(err, agent.ErrAlreadyRunning) {
		t.Errorf("Reset during run: %v", err)
	}
	if err := a.Prompt(context.Background(), "again"); !errors.Is(err, agent.ErrAlreadyRunning) {
		t.Errorf("Prompt during run: %v", err)
	}
	if err := a.Continue(context.Background()); !errors.Is(err, agent.ErrAlreadyRunning) {
		t.Errorf("Continue during run: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		t.Error(c)
	}
	s = a.State()
	if s.IsStreaming || s.StreamingMessage != nil || roles(s.Messages) != "user,assistant,toolResult,assistant" {
		t.Fatalf("final state: %+v", s)
	}
}

// Listeners run in subscription order, one event at a time, and the run
// (and Prompt, and WaitForIdle) waits for them.
func TestListenerOrderAndBackPressure(t *testing.T) {
	model := faux.New(faux.Options{}, text("hello", agent.StopReasonStop))
	a := agent.New(agent.Options{Model: testModel, StreamFn: model.Stream})
	var mu sync.Mutex
	var order []string
	inEnd := make(chan struct{})
	release := make(chan struct{})
	a.Subscribe(func(_ context.Context, ev agent.Event) error {
		mu.Lock()
		order = append(order, "1:"+string(ev.Type))
		mu.Unlock()
		if ev.Type == agent.EventAgentEnd {
			close(inEnd)
			<-release
		}
		return nil
	})
	unsub := a.Subscribe(func(_ context.Context, ev agent.Event) error {
		mu.Lock()
		order = append(order, "2:"+string(ev.Type))
		mu.Unlock()
		return nil
	})
	done := make(chan error, 1)
	go func() { done <- a.Prompt(context.Background(), "hi") }()
	<-inEnd
	if !a.IsStreaming() {
		t.Error("agent idle while an agent_end listener runs")
	}
	select {
	case <-done:
		t.Fatal("Prompt returned before the agent_end listeners finished")
	default:
	}
	idle := make(chan struct{})
	go func() { _ = a.WaitForIdle(context.Background()); close(idle) }()
	select {
	case <-idle:
		t.Fatal("WaitForIdle returned before the agent_end listeners finished")
	default:
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-idle
	mu.Lock()
	for i := 0; i+1 < len(order); i += 2 {
		if order[i][2:] != order[i+1][2:] || order[i][0] != '1' || order[i+1][0] != '2' {
			t.Fatalf("listeners out of order at %d: %v", i, order)
		}
	}
	mu.Unlock()
	unsub()
	if a.IsStreaming() {
		t.Fatal("still streaming")
	}
}

// Many goroutines hammer every public method while runs go on; -race and
// goleak check the rest.
func TestConcurrentUse(t *testing.T) {
	var responses []faux.Response
	for range 200 {
		responses = append(responses,
			faux.Response{Content: []agent.Content{agent.Text("working"), agent.ToolCall("c1", "t", nil), agent.ToolCall("c2", "t", nil)}, StopReason: agent.StopReasonToolUse},
			text("ok", agent.StopReasonStop))
	}
	model := faux.New(faux.Options{TokenSize: 1}, responses...)
	a := agent.New(agent.Options{Model: testModel, StreamFn: model.Stream, Tools: []*agent.Tool{echoTool("t")}})
	var events atomic.Int64
	a.Subscribe(func(context.Context, agent.Event) error { events.Add(1); return nil })

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				switch (g + i) % 6 {
				case 0:
					a.Steer(agent.UserText("steer"))
				case 1:
					a.FollowUp(agent.UserText("follow"))
				case 2:
					_ = a.State()
				case 3:
					a.HasQueuedMessages()
				case 4:
					if i%50 == 0 {
						a.Abort()
					}
				case 5:
					if i%20 == 0 {
						a.ClearAllQueues()
					}
				}
			}
		})
	}
	for range 20 {
		if err := a.Prompt(context.Background(), "go"); err != nil && !errors.Is(err, agent.ErrAlreadyRunning) {
			t.Error(err)
		}
	}
	cancel()
	wg.Wait()
	if a.IsStreaming() {
		t.Fatal("still streaming after runs")
	}
	if events.Load() == 0 {
		t.Fatal("no events")
	}
}

// panicStream returns a stream function that panics after start.
func panicStream(context.Context, agent.Model, agent.Context, agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	return func(yield func(agent.StreamEvent) bool) {
		yield(agent.StreamEvent{Type: agent.StreamStart, Message: &agent.Message{Role: agent.RoleAssistant}})
		panic("provider exploded")
	}
}

func TestPanicsNeverEscape(t *testing.T) {
	t.Run("stream function", func(t *testing.T) {
		a := agent.New(agent.Options{Model: testModel, StreamFn: panicStream})
		rec := &recorder{}
		a.Subscribe(rec.listen)
		if err := a.Prompt(context.Background(), "hi"); err != nil {
			t.Fatal(err)
		}
		// message_start of the stream, then the synthesized failure.
		if got := rec.types(); got != "agent_start,turn_start,message_start,message_end,message_start,message_start,message_end,turn_end,agent_end" {
			t.Fatalf("events: %s", got)
		}
		s := a.State()
		last := s.Messages[len(s.Messages)-1]
		if last.StopReason != agent.StopReasonError || !strings.Contains(last.ErrorMessage, "provider exploded") || s.ErrorMessage != last.ErrorMessage {
			t.Fatalf("last message %+v, state error %q", last, s.ErrorMessage)
		}
	})
	t.Run("listener", func(t *testing.T) {
		model := faux.New(faux.Options{}, text("hi", agent.StopReasonStop))
		a := agent.New(agent.Options{Model: testModel, StreamFn: model.Stream})
		a.Subscribe(func(_ context.Context, ev agent.Event) error {
			if ev.Type == agent.EventTurnStart {
				panic("listener exploded")
			}
			return nil
		})
		if err := a.Prompt(context.Background(), "hi"); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(a.State().ErrorMessage, "listener exploded") {
			t.Fatalf("error %q", a.State().ErrorMessage)
		}
	})
	t.Run("tool", func(t *testing.T) {
		model := faux.New(faux.Options{}, call("c1", "boom", nil), text("ok", agent.StopReasonStop))
		boom := &agent.Tool{Name: "boom", Execute: func(context.Context, string, map[string]any, agent.UpdateFunc) (agent.ToolResult, error) {
			var m map[string]int
			m["x"] = 1 // nil map write
			return agent.ToolResult{}, nil
		}}
		a := agent.New(agent.Options{Model: testModel, StreamFn: model.Stream, Tools: []*agent.Tool{boom}})
		if err := a.Prompt(context.Background(), "go"); err != nil {
			t.Fatal(err)
		}
		msgs := a.Messages()
		if roles(msgs) != "user,assistant,toolResult,assistant" || !msgs[2].IsError || !strings.Contains(msgs[2].TextOf(), "panic") {
			t.Fatalf("transcript %s, result %+v", roles(msgs), msgs[2])
		}
	})
	t.Run("listener fails again during failure", func(t *testing.T) {
		model := faux.New(faux.Options{}, text("hi", agent.StopReasonStop))
		a := agent.New(agent.Options{Model: testModel, StreamFn: model.Stream})
		a.Subscribe(func(_ context.Context, ev agent.Event) error {
			if ev.Type == agent.EventMessageEnd || ev.Type == agent.EventTurnEnd {
				return errors.New("still broken")
			}
			return nil
		})
		err := a.Prompt(context.Background(), "hi")
		if err == nil || err.Error() != "still broken" {
			t.Fatalf("Prompt error %v", err)
		}
		if a.IsStreaming() {
			t.Fatal("run not finished")
		}
	})
}

func TestAbortCancelsToolsAndLeavesNoGoroutines(t *testing.T) {
	model := faux.New(faux.Options{},
		faux.Response{Content: []agent.Content{agent.ToolCall("c1", "wait", nil), agent.ToolCall("c2", "wait", nil)}, StopReason: agent.StopReasonToolUse},
		text("never", agent.StopReasonStop))
	var running sync.WaitGroup
	running.Add(2)
	wait := &agent.Tool{Name: "wait", Execute: func(ctx context.Context, _ string, _ map[string]any, _ agent.UpdateFunc) (agent.ToolResult, error) {
		running.Done()
		<-ctx.Done()
		return agent.ToolResult{}, ctx.Err()
	}}
	a := agent.New(agent.Options{Model: testModel, StreamFn: model.Stream, Tools: []*agent.Tool{wait}})
	done := make(chan error, 1)
	go func() { done <- a.Prompt(context.Background(), "go") }()
	running.Wait()
	a.Abort()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	msgs := a.Messages()
	// user, assistant, 2 cancelled results, then the aborted model call pi makes.
	if roles(msgs) != "user,assistant,toolResult,toolResult,assistant" || msgs[4].StopReason != agent.StopReasonAborted {
		t.Fatalf("transcript %s", roles(msgs))
	}
}

func TestPromptContextCancelAborts(t *testing.T) {
	model := faux.New(faux.Options{TokenSize: 1, TokensPerSecond: 1000}, text(strings.Repeat("x", 4000), agent.StopReasonStop))
	a := agent.New(agent.Options{Model: testModel, StreamFn: model.Stream})
	ctx, cancel := context.WithCancel(context.Background())
	a.Subscribe(func(_ context.Context, ev agent.Event) error {
		if ev.Type == agent.EventMessageUpdate {
			cancel()
		}
		return nil
	})
	if err := a.Prompt(ctx, "go"); err != nil {
		t.Fatal(err)
	}
	if s := a.State(); s.ErrorMessage != faux.AbortedText {
		t.Fatalf("error %q", s.ErrorMessage)
	}
}

func TestLateToolUpdatesAreDropped(t *testing.T) {
	model := faux.New(faux.Options{}, call("c1", "t", nil))
	var saved agent.UpdateFunc
	tool := &agent.Tool{Name: "t", Execute: func(_ context.Context, _ string, _ map[string]any, update agent.UpdateFunc) (agent.ToolResult, error) {
		update(agent.TextResult("partial"))
		saved = update
		r := agent.TextResult("final")
		r.Terminate = true
		return r, nil
	}}
	a := agent.New(agent.Options{Model: testModel, StreamFn: model.Stream, Tools: []*agent.Tool{tool}})
	var updates atomic.Int32
	a.Subscribe(func(_ context.Context, ev agent.Event) error {
		if ev.Type == agent.EventToolExecutionUpdate {
			updates.Add(1)
		}
		return nil
	})
	if err := a.Prompt(context.Background(), "go"); err != nil {
		t.Fatal(err)
	}
	saved(agent.TextResult("late")) // must neither emit nor panic
	if updates.Load() != 1 {
		t.Fatalf("updates = %d, want 1", updates.Load())
	}
	if model.Calls() != 1 {
		t.Fatalf("terminate ignored: %d model calls", model.Calls())
	}
}

func TestHooksAndContextPipeline(t *testing.T) {
	var seen []string
	var keys []string
	stream := func(_ context.Context, m agent.Model, llm agent.Context, o agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		seen = append(seen, llm.SystemPrompt+":"+roles(llm.Messages))
		keys = append(keys, o.APIKey)
		resp := text("done", agent.StopReasonStop)
		if len(seen) == 1 {
			resp = call("c1", "t", map[string]any{"n": "2"})
		}
		return faux.New(faux.Options{}, resp).Stream(context.Background(), m, llm, o)
	}
	tool := &agent.Tool{Name: "t", Parameters: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`),
		Execute: func(_ context.Context, _ string, args map[string]any, _ agent.UpdateFunc) (agent.ToolResult, error) {
			return agent.TextResult(fmt.Sprintf("%T %v", args["n"], args["n"])), nil
		}}
	keyCalls := 0
	a := agent.New(agent.Options{
		SystemPrompt: "first", Model: testModel, StreamFn: stream, Tools: []*agent.Tool{tool},
		Messages: []agent.Message{{Role: "notification", Raw: json.RawMessage(`{"role":"notification","text":"x"}`)}, agent.UserText("old")},
		TransformContext: func(_ context.Context, msgs []agent.Message) ([]agent.Message, error) {
			return msgs[2:], nil // drop the two oldest messages
		},
		GetAPIKey: func(_ context.Context, provider string) (string, error) {
			keyCalls++
			return fmt.Sprintf("%s-key-%d", provider, keyCalls), nil
		},
		PrepareNextTurn: func(_ context.Context, tc *agent.TurnContext) (*agent.NextTurn, error) {
			c := *tc.Context
			c.SystemPrompt = "second"
			return &agent.NextTurn{Context: &c}, nil
		},
	})
	if err := a.Prompt(context.Background(), "go"); err != nil {
		t.Fatal(err)
	}
	// TransformContext runs on every call; PrepareNextTurn's system prompt
	// reaches turn two.
	if want := []string{"first:user", "second:user,assistant,toolResult"}; !reflect.DeepEqual(seen, want) {
		t.Fatalf("contexts %v, want %v", seen, want)
	}
	if !reflect.DeepEqual(keys, []string{"faux-key-1", "faux-key-2"}) {
		t.Fatalf("api keys %v", keys)
	}
	msgs := a.Messages()
	if got := msgs[4].TextOf(); got != "float64 2" {
		t.Fatalf("coerced argument: %q", got)
	}
}

// A run's new messages are the tail of its context until a hook replaces
// or cuts the context; agent_end and the hooks still get all of them.
func TestNewMessagesSurviveACompactedContext(t *testing.T) {
	model := faux.New(faux.Options{}, call("c1", "t", map[string]any{}), call("c2", "t", map[string]any{}), text("done", agent.StopReasonStop))
	tool := &agent.Tool{Name: "t", Parameters: json.RawMessage(`{"type":"object"}`),
		Execute: func(context.Context, string, map[string]any, agent.UpdateFunc) (agent.ToolResult, error) {
			return agent.TextResult("ok"), nil
		}}
	var hookNew []string
	a := agent.New(agent.Options{
		Model: testModel, StreamFn: model.Stream, Tools: []*agent.Tool{tool},
		Messages: []agent.Message{agent.UserText("old")},
		PrepareNextTurn: func(_ context.Context, tc *agent.TurnContext) (*agent.NextTurn, error) {
			hookNew = append(hookNew, roles(tc.NewMessages))
			tc.NewMessages = append(tc.NewMessages, agent.UserText("stray")) // must not leak into the run
			c := *tc.Context
			c.Messages = append([]agent.Message(nil), c.Messages[len(c.Messages)-1:]...) // compaction
			return &agent.NextTurn{Context: &c}, nil
		},
		ShouldStopAfterTurn: func(_ context.Context, tc *agent.TurnContext) (bool, error) {
			tc.Context.Messages = tc.Context.Messages[:len(tc.Context.Messages):len(tc.Context.Messages)]
			return false, nil
		},
	})
	var end string
	a.Subscribe(func(_ context.Context, ev agent.Event) error {
		if ev.Type == agent.EventAgentEnd {
			end = roles(ev.Messages)
		}
		return nil
	})
	if err := a.Prompt(context.Background(), "go"); err != nil {
		t.Fatal(err)
	}
	want := []string{"user,assistant,toolResult", "user,assistant,toolResult,assistant,toolResult", "user,assistant,toolResult,assistant,toolResult,assistant"}
	if !reflect.DeepEqual(hookNew, want) {
		t.Fatalf("hooks saw new messages %q, want %q", hookNew, want)
	}
	if end != want[2] {
		t.Fatalf("agent_end messages %s, want %s", end, want[2])
	}
	if got := roles(a.Messages()); got != "user,"+want[2] {
		t.Fatalf("state %s", got)
	}
}

// Hooks may rewrite the context in place (Go's filter idiom, a tool
// result cleared to save tokens, a compaction from a tool hook): the run's
// new messages, in agent_end, are still what it added.
func TestNewMessagesSurviveHooksThatRewriteTheContext(t *testing.T) {
	noCustom := func(ms []agent.Message) []agent.Message {
		out := ms[:0]
		for _, m := range ms {
			if !m.IsCustom() {
				out = append(out, m)
			}
		}
		return out
	}
	clearResults := func(ms []agent.Message) []agent.Message {
		for i := range ms {
			if ms[i].Role == agent.RoleToolResult {
				ms[i].Content = []agent.Content{agent.Text("[cleared]")}
			}
		}
		return ms
	}
	for name, hooks := range map[string]agent.Options{
		"filter in PrepareNextTurn": {PrepareNextTurn: func(_ context.Context, tc *agent.TurnContext) (*agent.NextTurn, error) {
			tc.Context.Messages = noCustom(tc.Context.Messages)
			return nil, nil
		}},
		"results cleared in ShouldStopAfterTurn": {ShouldStopAfterTurn: func(_ context.Context, tc *agent.TurnContext) (bool, error) {
			clearResults(tc.Context.Messages)
			return false, nil
		}},
		"compaction in BeforeToolCall": {BeforeToolCall: func(_ context.Context, bc *agent.BeforeToolCallContext) (*agent.BeforeToolCallResult, error) {
			bc.Context.Messages = bc.Context.Messages[len(bc.Context.Messages)-1:]
			return nil, nil
		}},
		"results cleared in ConvertToLLM": {ConvertToLLM: func(_ context.Context, ms []agent.Message) ([]agent.Message, error) {
			return noCustom(clearResults(ms)), nil
		}},
		"compaction in AfterToolCall": {AfterToolCall: func(_ context.Context, ac *agent.AfterToolCallContext) (*agent.AfterToolCallResult, error) {
			ac.Context.Messages = ac.Context.Messages[len(ac.Context.Messages)-1:]
			return nil, nil
		}},
		"results cleared in TransformContext": {TransformContext: func(_ context.Context, ms []agent.Message) ([]agent.Message, error) {
			return noCustom(clearResults(ms)), nil
		}},
	} {
		t.Run(name, func(t *testing.T) {
			model := faux.New(faux.Options{}, call("c1", "t", map[string]any{}), text("done", agent.StopReasonStop))
			hooks.Model, hooks.StreamFn = testModel, model.Stream
			hooks.Tools = []*agent.Tool{{Name: "t", Parameters: json.RawMessage(`{"type":"object"}`),
				Execute: func(context.Context, string, map[string]any, agent.UpdateFunc) (agent.ToolResult, error) {
					return agent.TextResult("ok"), nil
				}}}
			hooks.Messages = []agent.Message{agent.UserText("old1"), {Role: "notification", Raw: json.RawMessage(`{"role":"notification"}`)},
				agent.UserText("old2"), agent.UserText("old3")}
			a := agent.New(hooks)
			var end []agent.Message
			a.Subscribe(func(_ context.Context, ev agent.Event) error {
				if ev.Type == agent.EventAgentEnd {
					end = ev.Messages
				}
				return nil
			})
			if err := a.Prompt(context.Background(), "go"); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range end {
				got = append(got, m.Role+":"+m.TextOf())
			}
			want := []string{"user:go", "assistant:", "toolResult:ok", "assistant:done"}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("agent_end messages %q, want %q", got, want)
			}
		})
	}
}

func TestDefaultConverterDropsCustomMessages(t *testing.T) {
	in := []agent.Message{{Role: "notification"}, agent.UserText("hi"), {Role: agent.RoleSystem}}
	out, err := agent.DefaultConvertToLLM(context.Background(), in)
	if err != nil || roles(out) != "user,system" {
		t.Fatalf("%s %v", roles(out), err)
	}
}

func TestContinueRules(t *testing.T) {
	model := faux.New(faux.Options{}, text("one", agent.StopReasonStop), text("two", agent.StopReasonStop))
	a := agent.New(agent.Options{Model: testModel, StreamFn: model.Stream})
	ctx := context.Background()
	if err := a.Continue(ctx); !errors.Is(err, agent.ErrNoMessages) || err.Error() != "No messages to continue from" {
		t.Fatalf("empty: %v", err)
	}
	if err := a.Prompt(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if err := a.Continue(ctx); !errors.Is(err, agent.ErrCannotContinue) || err.Error() != "Cannot continue from message role: assistant" {
		t.Fatalf("assistant tail: %v", err)
	}
	a.FollowUp(agent.UserText("more"))
	if err := a.Continue(ctx); err != nil {
		t.Fatal(err)
	}
	if got := roles(a.Messages()); got != "user,assistant,user,assistant" {
		t.Fatalf("transcript %s", got)
	}
}

func TestPromptWithImages(t *testing.T) {
	var got agent.Message
	stream := func(ctx context.Context, m agent.Model, llm agent.Context, o agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		got = llm.Messages[len(llm.Messages)-1]
		return faux.New(faux.Options{}, text("a cat", agent.StopReasonStop)).Stream(ctx, m, llm, o)
	}
	a := agent.New(agent.Options{Model: testModel, StreamFn: stream})
	if err := a.Prompt(context.Background(), "what is this?", agent.Image("aGVsbG8=", "image/png")); err != nil {
		t.Fatal(err)
	}
	if len(got.Content) != 2 || got.Content[1].Type != agent.ContentImage || got.Content[1].MimeType != "image/png" {
		t.Fatalf("prompt content %+v", got.Content)
	}
}

func TestTypedTool(t *testing.T) {
	type args struct {
		Expr  string `json:"expr" jsonschema:"description=an expression"`
		Times int    `json:"times"`
	}
	tool := agent.NewTool("repeat", "repeats", func(_ context.Context, a args, _ agent.UpdateFunc) (agent.ToolResult, error) {
		return agent.TextResult(strings.Repeat(a.Expr, a.Times)), nil
	})
	var schema map[string]any
	if err := json.Unmarshal(tool.Parameters, &schema); err != nil {
		t.Fatal(err)
	}
	props, _ := schema["properties"].(map[string]any)
	if schema["type"] != "object" || props["expr"] == nil || props["times"] == nil {
		t.Fatalf("schema %s", tool.Parameters)
	}
	valid, err := tool.ValidateArguments(map[string]any{"expr": "ab", "times": "3"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := tool.Execute(context.Background(), "c1", valid, nil)
	if err != nil || res.Content[0].Text != "ababab" {
		t.Fatalf("%v %v", res, err)
	}
	if _, err := tool.ValidateArguments(map[string]any{"expr": "ab"}); err == nil || !strings.HasPrefix(err.Error(), `Validation failed for tool "repeat":`) {
		t.Fatalf("missing field: %v", err)
	}
	if _, err := tool.ValidateArguments(map[string]any{"expr": "ab", "times": "x"}); err == nil || !strings.Contains(err.Error(), "times") {
		t.Fatalf("bad integer: %v", err)
	}
}

func TestMessageJSONRoundTrip(t *testing.T) {
	const piJSON = `[
 {"role":"user","content":"plain string","timestamp":1},
 {"role":"user","content":[{"type":"text","text":"look"},{"type":"image","data":"AA==","mimeType":"image/png"}],"timestamp":2},
 {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","thinkingSignature":"reasoning_content"},{"type":"text","text":""},{"type":"toolCall","id":"c1","name":"t","arguments":{"a":[1,"x"]}}],"api":"openai-completions","provider":"openai","model":"gpt","usage":{"input":1,"output":2,"cacheRead":0,"cacheWrite":0,"totalTokens":3,"cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}},"stopReason":"toolUse","timestamp":3},
 {"role":"toolResult","toolCallId":"c1","toolName":"t","content":[{"type":"text","text":"r"}],"details":{"k":1},"isError":false,"timestamp":4},
 {"role":"notification","text":"custom","timestamp":5}
]`
	var msgs []agent.Message
	if err := json.Unmarshal([]byte(piJSON), &msgs); err != nil {
		t.Fatal(err)
	}
	if msgs[0].TextOf() != "plain string" || msgs[2].ToolCalls()[0].Arguments["a"] == nil || string(msgs[3].Details) != `{"k":1}` || !msgs[4].IsCustom() {
		t.Fatalf("decoded %+v", msgs)
	}
	out, err := json.Marshal(msgs)
	if err != nil {
		t.Fatal(err)
	}
	var again []agent.Message
	if err := json.Unmarshal(out, &again); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(msgs, again) {
		t.Fatalf("round trip changed messages:\n%s", out)
	}
	// The empty text block keeps its "text" field, as pi writes it.
	if !strings.Contains(string(out), `{"type":"text","text":""}`) {
		t.Fatalf("empty text block lost: %s", out)
	}
	for _, bad := range []string{`{"content":"x"}`, `{"role":"user","content":[{"type":"video"}]}`, `{"role":"user","content":5}`} {
		var m agent.Message
		if err := json.Unmarshal([]byte(bad), &m); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

func TestMessageBuilderRebuildsStream(t *testing.T) {
	resp := faux.Response{Content: []agent.Content{
		{Type: agent.ContentThinking, Thinking: "let me think about it"},
		agent.Text("the answer is 42"),
		agent.ToolCall("c1", "t", map[string]any{"x": "y"}),
	}, StopReason: agent.StopReasonToolUse}
	var b agent.MessageBuilder
	var final *agent.Message
	for ev := range faux.New(faux.Options{TokenSize: 1}, resp).Stream(context.Background(), testModel, agent.Context{}, agent.StreamOptions{}) {
		switch ev.Type {
		case agent.StreamStart:
			b.Reset(*ev.Message)
		case agent.StreamDone, agent.StreamError:
			final = ev.Message
		default:
			b.Apply(&ev)
		}
	}
	if final == nil || !reflect.DeepEqual(b.Message().Content, final.Content) {
		t.Fatalf("rebuilt %+v, final %+v", b.Message().Content, final)
	}
}

func TestWaitForIdleHonoursContext(t *testing.T) {
	release := make(chan struct{})
	stream := func(ctx context.Context, m agent.Model, llm agent.Context, o agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			<-release
			for ev := range faux.New(faux.Options{}, text("x", agent.StopReasonStop)).Stream(ctx, m, llm, o) {
				if !yield(ev) {
					return
				}
			}
		}
	}
	a := agent.New(agent.Options{Model: testModel, StreamFn: stream})
	started := make(chan struct{})
	a.Subscribe(func(_ context.Context, ev agent.Event) error {
		if ev.Type == agent.EventAgentStart {
			close(started)
		}
		return nil
	})
	done := make(chan error, 1)
	go func() { done <- a.Prompt(context.Background(), "go") }()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := a.WaitForIdle(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitForIdle: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Inside a listener the run waits for the listener, so WaitForIdle there
// returns only through its ctx; the run then goes on.
func TestWaitForIdleInsideListener(t *testing.T) {
	a := agent.New(agent.Options{Model: testModel, StreamFn: faux.New(faux.Options{}, text("x", agent.StopReasonStop)).Stream})
	var waitErr error
	a.Subscribe(func(_ context.Context, ev agent.Event) error {
		if ev.Type == agent.EventAgentStart {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			defer cancel()
			waitErr = a.WaitForIdle(ctx)
		}
		return nil
	})
	if err := a.Prompt(context.Background(), "go"); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(waitErr, context.DeadlineExceeded) {
		t.Fatalf("WaitForIdle inside a listener: %v", waitErr)
	}
	if got := roles(a.Messages()); got != "user,assistant" {
		t.Fatalf("messages %s", got)
	}
}
