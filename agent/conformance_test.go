package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/llm/faux"
)

// The conformance scenarios (format: testdata/conformance/README.md) are the
// traces the reference printed; the Go agent must print the same lines.

type scenario struct {
	Name  string `json:"name"`
	Agent struct {
		SystemPrompt  string            `json:"systemPrompt"`
		ToolExecution string            `json:"toolExecution"`
		SteeringMode  string            `json:"steeringMode"`
		FollowUpMode  string            `json:"followUpMode"`
		Messages      []json.RawMessage `json:"messages"`
	} `json:"agent"`
	Model struct {
		TokenSize       int     `json:"tokenSize"`
		TokensPerSecond float64 `json:"tokensPerSecond"`
	} `json:"model"`
	Tools []struct {
		Name          string          `json:"name"`
		Description   string          `json:"description"`
		Parameters    json.RawMessage `json:"parameters"`
		ExecutionMode string          `json:"executionMode"`
		Updates       []string        `json:"updates"`
		DelayMs       int             `json:"delayMs"`
		Throws        string          `json:"throws"`
		Result        *string         `json:"result"`
		EchoArgs      bool            `json:"echoArgs"`
		Terminate     bool            `json:"terminate"`
	} `json:"tools"`
	Hooks struct {
		BeforeToolCall []struct {
			Tool      string `json:"tool"`
			Block     bool   `json:"block"`
			Reason    string `json:"reason"`
			Terminate bool   `json:"terminate"`
		} `json:"beforeToolCall"`
		AfterToolCall []struct {
			Tool      string  `json:"tool"`
			Text      *string `json:"text"`
			IsError   *bool   `json:"isError"`
			Terminate *bool   `json:"terminate"`
		} `json:"afterToolCall"`
		ShouldStopAfterTurn *struct {
			Turn int `json:"turn"`
		} `json:"shouldStopAfterTurn"`
	} `json:"hooks"`
	Responses []faux.Response `json:"responses"`
	Triggers  []struct {
		On struct {
			Event string `json:"event"`
			Nth   int    `json:"nth"`
		} `json:"on"`
		step
	} `json:"triggers"`
	Script []step `json:"script"`
}

type step struct {
	Do       string            `json:"do"`
	Text     string            `json:"text"`
	Messages []json.RawMessage `json:"messages"`
}

func TestConformance(t *testing.T) {
	dirs := []string{filepath.Join("testdata", "conformance")}
	if extra := os.Getenv("AGENT_CONFORMANCE_DIR"); extra != "" {
		dirs = append(dirs, extra)
	}
	total := 0
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			total++
			name := strings.TrimSuffix(filepath.Base(f), ".json")
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				want, err := os.ReadFile(strings.TrimSuffix(f, ".json") + ".trace")
				if err != nil {
					t.Fatal(err)
				}
				got := runScenario(t, f)
				wantLines := strings.Split(strings.TrimRight(string(want), "\n"), "\n")
				if d := lineDiff(wantLines, got); d != "" {
					t.Errorf("trace differs (-want +got):\n%s", d)
				}
			})
		}
	}
	if total == 0 {
		t.Fatal("no conformance scenarios found")
	}
}

func parseMessages(t *testing.T, raws []json.RawMessage) []agent.Message {
	t.Helper()
	var out []agent.Message
	for _, raw := range raws {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			out = append(out, agent.Message{Role: agent.RoleUser, Content: []agent.Content{agent.Text(s)}})
			continue
		}
		var m agent.Message
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("message %s: %v", raw, err)
		}
		out = append(out, m)
	}
	return out
}

// tracer turns events into trace lines, folding repeated message_update lines.
type tracer struct {
	mu    sync.Mutex
	lines []string
	reps  []int
}

func (tr *tracer) add(line string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := len(tr.lines)
	if n > 0 && tr.lines[n-1] == line && strings.HasPrefix(line, "message_update ") {
		tr.reps[n-1]++
		return
	}
	tr.lines = append(tr.lines, line)
	tr.reps = append(tr.reps, 1)
}

func (tr *tracer) result() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := make([]string, len(tr.lines))
	for i, l := range tr.lines {
		if tr.reps[i] > 1 {
			l = fmt.Sprintf("%s x%d", l, tr.reps[i])
		}
		out[i] = l
	}
	return out
}

func runScenario(t *testing.T, path string) []string {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var sc scenario
	if err := json.Unmarshal(raw, &sc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	model := faux.New(faux.Options{TokenSize: sc.Model.TokenSize, TokensPerSecond: sc.Model.TokensPerSecond}, sc.Responses...)
	var tools []*agent.Tool
	order := newDelayOrder()
	for _, st := range sc.Tools {
		st := st
		result := "ok"
		if st.Result != nil {
			result = *st.Result
		}
		tools = append(tools, &agent.Tool{
			Name: st.Name, Description: st.Description, Parameters: st.Parameters,
			ExecutionMode: agent.ExecutionMode(st.ExecutionMode),
			Execute: func(ctx context.Context, _ string, args map[string]any, update agent.UpdateFunc) (agent.ToolResult, error) {
				for _, u := range st.Updates {
					update(agent.TextResult(u))
				}
				if st.DelayMs > 0 {
					done := order.start(st.DelayMs)
					defer done()
					select {
					case <-time.After(time.Duration(st.DelayMs) * time.Millisecond):
					case <-ctx.Done():
						return agent.ToolResult{}, errors.New("Operation aborted")
					}
					if !order.waitShorter(ctx, st.DelayMs) {
						return agent.ToolResult{}, errors.New("Operation aborted")
					}
				}
				if st.Throws != "" {
					return agent.ToolResult{}, errors.New(st.Throws)
				}
				text := result
				if st.EchoArgs {
					text += agent.CanonicalJSON(args)
				}
				r := agent.TextResult(text)
				r.Terminate = st.Terminate
				return r, nil
			},
		})
	}

	opts := agent.Options{
		SystemPrompt:  sc.Agent.SystemPrompt,
		Model:         agent.Model{ID: "faux-1", API: "faux", Provider: "faux"},
		Tools:         tools,
		Messages:      parseMessages(t, sc.Agent.Messages),
		StreamFn:      model.Stream,
		ToolExecution: agent.ExecutionMode(sc.Agent.ToolExecution),
		SteeringMode:  agent.QueueMode(sc.Agent.SteeringMode),
		FollowUpMode:  agent.QueueMode(sc.Agent.FollowUpMode),
	}
	if hooks := sc.Hooks.BeforeToolCall; len(hooks) > 0 {
		opts.BeforeToolCall = func(_ context.Context, c *agent.BeforeToolCallContext) (*agent.BeforeToolCallResult, error) {
			for _, h := range hooks {
				if h.Tool == c.ToolCall.Name {
					return &agent.BeforeToolCallResult{Block: h.Block, Reason: h.Reason, Terminate: h.Terminate}, nil
				}
			}
			return nil, nil
		}
	}
	if hooks := sc.Hooks.AfterToolCall; len(hooks) > 0 {
		opts.AfterToolCall = func(_ context.Context, c *agent.AfterToolCallContext) (*agent.AfterToolCallResult, error) {
			for _, h := range hooks {
				if h.Tool == c.ToolCall.Name {
					r := &agent.AfterToolCallResult{IsError: h.IsError, Terminate: h.Terminate}
					if h.Text != nil {
						r.Content = []agent.Content{agent.Text(*h.Text)}
					}
					return r, nil
				}
			}
			return nil, nil
		}
	}
	if s := sc.Hooks.ShouldStopAfterTurn; s != nil {
		var mu sync.Mutex
		calls := 0
		opts.ShouldStopAfterTurn = func(context.Context, *agent.TurnContext) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			return calls >= s.Turn, nil
		}
	}
	a := agent.New(opts)
	tr := &tracer{}

	counts := map[string]int{}
	a.Subscribe(func(_ context.Context, ev agent.Event) error {
		tr.add(traceLine(ev))
		checkEventMessagesJSON(t, ev)
		counts[string(ev.Type)]++
		keys := []string{string(ev.Type)}
		if ev.Type == agent.EventMessageUpdate {
			k := "message_update:" + string(ev.StreamEvent.Type)
			counts[k]++
			keys = append(keys, k)
		}
		for _, tg := range sc.Triggers {
			for _, k := range keys {
				if tg.On.Event == k && tg.On.Nth == counts[k] {
					if tg.Do == "throw" {
						return errors.New(tg.Text)
					}
					tr.add(callLine(tg.Do, perform(ctx, t, a, tg.step)))
				}
			}
		}
		return nil
	})

	for _, st := range sc.Script {
		err := perform(ctx, t, a, st)
		tr.add(callLine(st.Do, err))
		if err := a.WaitForIdle(ctx); err != nil {
			t.Fatalf("waiting for idle: %v", err)
		}
	}
	s := a.State()
	roles := make([]string, len(s.Messages))
	for i, m := range s.Messages {
		roles[i] = m.Role
	}
	tr.add(fmt.Sprintf("state messages=[%s] streaming=%t error=%s pending=%d queued=%t",
		strings.Join(roles, ","), s.IsStreaming, quote(s.ErrorMessage), len(s.PendingToolCalls), a.HasQueuedMessages()))
	return tr.result()
}

func perform(ctx context.Context, t *testing.T, a *agent.Agent, st step) error {
	switch st.Do {
	case "prompt":
		if st.Messages != nil {
			return a.PromptMessages(ctx, parseMessages(t, st.Messages)...)
		}
		return a.Prompt(ctx, st.Text)
	case "continue":
		return a.Continue(ctx)
	case "steer":
		a.Steer(agent.UserText(st.Text))
	case "followUp":
		a.FollowUp(agent.UserText(st.Text))
	case "abort":
		a.Abort()
	case "reset":
		return a.Reset()
	case "clearQueues":
		a.ClearAllQueues()
	default:
		t.Fatalf("unknown step %q", st.Do)
	}
	return nil
}

func callLine(do string, err error) string {
	switch {
	case err == nil:
		return "call " + do + " ok"
	case errors.Is(err, agent.ErrAlreadyRunning):
		return "call " + do + " error already-running"
	case errors.Is(err, agent.ErrNoMessages):
		return "call " + do + " error no-messages"
	case errors.Is(err, agent.ErrCannotContinue):
		return "call " + do + " error cannot-continue"
	}
	return "call " + do + " error " + quote(err.Error())
}

func traceLine(ev agent.Event) string {
	switch ev.Type {
	case agent.EventAgentStart, agent.EventTurnStart:
		return string(ev.Type)
	case agent.EventAgentEnd:
		return fmt.Sprintf("agent_end n=%d", len(ev.Messages))
	case agent.EventTurnEnd:
		return fmt.Sprintf("turn_end %s results=%d", ev.Message.StopReason, len(ev.ToolResults))
	case agent.EventMessageUpdate:
		return "message_update " + string(ev.StreamEvent.Type)
	case agent.EventMessageStart, agent.EventMessageEnd:
		m := ev.Message
		switch m.Role {
		case agent.RoleAssistant:
			if ev.Type == agent.EventMessageStart {
				return "message_start assistant"
			}
			line := fmt.Sprintf("message_end assistant %s text=%s", m.StopReason, quote(m.TextOf()))
			if th := m.ThinkingOf(); th != "" {
				line += " thinking=" + quote(th)
			}
			if calls := m.ToolCalls(); len(calls) > 0 {
				parts := make([]string, len(calls))
				for i, c := range calls {
					parts[i] = fmt.Sprintf("%s(%s)", c.Name, c.ID)
				}
				line += " tools=[" + strings.Join(parts, ",") + "]"
			}
			if m.ErrorMessage != "" {
				line += " error=" + quote(m.ErrorMessage)
			}
			return line
		case agent.RoleToolResult:
			return fmt.Sprintf("%s toolResult %s %s error=%t %s", ev.Type, m.ToolName, m.ToolCallID, m.IsError, quote(resultText(m.TextOf())))
		default:
			return fmt.Sprintf("%s %s %s", ev.Type, m.Role, quote(m.TextOf()))
		}
	case agent.EventToolExecutionStart:
		return fmt.Sprintf("tool_execution_start %s %s %s", ev.ToolCallID, ev.ToolName, canonical(ev.Args))
	case agent.EventToolExecutionUpdate:
		return fmt.Sprintf("tool_execution_update %s %s", ev.ToolCallID, quote(joinText(ev.Result.Content)))
	case agent.EventToolExecutionEnd:
		return fmt.Sprintf("tool_execution_end %s %s error=%t %s", ev.ToolCallID, ev.ToolName, ev.IsError, quote(resultText(joinText(ev.Result.Content))))
	}
	return "unknown " + string(ev.Type)
}

func canonical(args map[string]any) string {
	if args == nil {
		args = map[string]any{}
	}
	return agent.CanonicalJSON(args)
}

func joinText(blocks []agent.Content) string {
	var b strings.Builder
	for _, c := range blocks {
		if c.Type == agent.ContentText {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

func resultText(s string) string {
	if strings.HasPrefix(s, "Validation failed for tool") {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			return s[:i]
		}
	}
	return s
}

// quote writes s as JSON.stringify does (no HTML escaping).
func quote(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

// lineDiff returns a unified-style diff of two line lists, "" when equal.
func lineDiff(a, b []string) string {
	n, m := len(a), len(b)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	changed := false
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			out = append(out, "  "+a[i])
			i++
			j++
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			out = append(out, "+ "+b[j])
			j++
			changed = true
		default:
			out = append(out, "- "+a[i])
			i++
			changed = true
		}
	}
	if !changed {
		return ""
	}
	return strings.Join(out, "\n")
}

// delayOrder makes parallel tools finish in the order of their delays, as
// the reference's timers did when it printed the traces: on a loaded
// machine a 5 ms timer can fire after a 25 ms one.
type delayOrder struct {
	mu      sync.Mutex
	running map[int]int // delay -> tools with that delay not finished
	changed chan struct{}
}

func newDelayOrder() *delayOrder {
	return &delayOrder{running: map[int]int{}, changed: make(chan struct{})}
}

// start registers a tool with delay d; done unregisters it.
func (o *delayOrder) start(d int) (done func()) {
	o.mu.Lock()
	o.running[d]++
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		o.running[d]--
		close(o.changed)
		o.changed = make(chan struct{})
		o.mu.Unlock()
	}
}

// waitShorter waits until no tool with a shorter delay is running; false
// when ctx ends first.
func (o *delayOrder) waitShorter(ctx context.Context, d int) bool {
	for {
		o.mu.Lock()
		shorter := false
		for delay, n := range o.running {
			if delay < d && n > 0 {
				shorter = true
			}
		}
		changed := o.changed
		o.mu.Unlock()
		if !shorter {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}
