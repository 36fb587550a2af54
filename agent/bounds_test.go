package agent_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/llm/faux"
)

const (
	maxArgsBytes  = 64 << 10 // the worker's default cap on tool-call arguments
	maxResultText = 8 << 10  // what any tool_execution_end may carry here
)

// boundedTool validates an expression and fails quoting it, so both
// validation errors and tool errors see whatever the model sent.
func boundedTool() *agent.Tool {
	return &agent.Tool{
		Name: "calc",
		Parameters: []byte(`{"type":"object","properties":{"expression":{"type":"string"}},` +
			`"required":["expression"],"additionalProperties":{"type":"number"}}`),
		Execute: func(_ context.Context, _ string, args map[string]any, _ agent.UpdateFunc) (agent.ToolResult, error) {
			return agent.ToolResult{}, fmt.Errorf("cannot evaluate %v", args["expression"])
		},
	}
}

// runCall runs one call of calc with args and returns the end event's text.
func runCall(t testing.TB, args map[string]any) string {
	model := faux.New(faux.Options{TokenSize: 1 << 30},
		faux.Response{Content: []agent.Content{agent.ToolCall("c1", "calc", args)}, StopReason: agent.StopReasonToolUse},
		faux.Response{Content: []agent.Content{agent.Text("done")}})
	a := agent.New(agent.Options{Model: testModel, StreamFn: model.Stream, Tools: []*agent.Tool{boundedTool()}})
	var end string
	ends := 0
	a.Subscribe(func(_ context.Context, ev agent.Event) error {
		if ev.Type == agent.EventToolExecutionEnd {
			ends++
			for _, c := range ev.Result.Content {
				end += c.Text
			}
		}
		return nil
	})
	if err := a.Prompt(context.Background(), "go"); err != nil {
		t.Fatal(err)
	}
	if ends != 1 {
		t.Fatalf("%d tool_execution_end events", ends)
	}
	return end
}

func deepArrays(depth int, leaf any) any {
	v := leaf
	for range depth {
		v = []any{v}
	}
	return v
}

func deepObjects(depth int) any {
	var v any = "x"
	for range depth {
		v = map[string]any{"a": v}
	}
	return v
}

// randomValue returns a random JSON value of about budget bytes or less.
func randomValue(r *rand.Rand, budget, depth int) any {
	if budget < 8 || depth > 80 {
		return r.Float64()
	}
	switch r.IntN(6) {
	case 0:
		return strings.Repeat("<&>\"x", r.IntN(budget/5+1))
	case 1:
		return fmt.Sprint(r.IntN(1000))
	case 2:
		n := r.IntN(20) + 1
		a := make([]any, n)
		for i := range a {
			a[i] = randomValue(r, budget/n-2, depth+1)
		}
		return a
	case 3:
		n := r.IntN(20) + 1
		m := make(map[string]any, n)
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = randomValue(r, budget/n-8, depth+1)
		}
		return m
	case 4:
		return nil
	}
	return r.IntN(2) == 0
}

// Whatever the arguments (up to the worker's 64 KiB cap), the result text of
// the call stays under a fixed bound.
func TestToolResultTextIsBounded(t *testing.T) {
	many := map[string]any{"expression": "1"}
	for i := len(many); ; i++ {
		many[fmt.Sprintf("key%d", i)] = "not a number"
		if i > 2500 {
			break
		}
	}
	cases := map[string]map[string]any{
		"9900-deep arrays":         {"expression": deepArrays(9900, 1.0)},
		"9900-deep objects":        {"expression": deepObjects(9900)},
		"65-deep arrays":           {"expression": deepArrays(64, 1.0)},
		"64-deep arrays":           {"expression": deepArrays(63, "x")},
		"long expression":          {"expression": strings.Repeat("9*", 30<<10)},
		"long wrong expression":    {"expression": float64(1), "pad": strings.Repeat("<", 60<<10)},
		"many keys, many problems": many,
		"many extra numbers": func() map[string]any {
			m := map[string]any{"expression": strings.Repeat("&", 10<<10)}
			for i := range 3000 {
				m[fmt.Sprint("n", i)] = float64(i)
			}
			return m
		}(),
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 40; {
		args := map[string]any{"expression": randomValue(r, maxArgsBytes, 0)}
		if raw, _ := agent.MarshalJSON(args); len(raw) <= maxArgsBytes {
			cases[fmt.Sprint("random ", i)] = args
			i++
		}
	}
	for name, args := range cases {
		raw, err := agent.MarshalJSON(args)
		if err != nil {
			t.Fatal(err)
		}
		if len(raw) > maxArgsBytes {
			t.Fatalf("%s: arguments are %d bytes", name, len(raw))
		}
		if text := runCall(t, args); len(text) >= maxResultText {
			t.Errorf("%s: %d bytes of arguments gave a result of %d bytes", name, len(raw), len(text))
		}
	}
}

// Deeply nested arguments are refused before validation, with a clear
// error, and cost little memory.
func TestDeepArgumentsTakeLittleMemory(t *testing.T) {
	args := map[string]any{"expression": deepArrays(9900, 1.0)}
	runCall(t, args) // warm up: schema compilation, lazily built tables
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	text := runCall(t, args)
	runtime.ReadMemStats(&after)
	if !strings.Contains(text, agent.ErrArgumentsTooDeep.Error()) {
		t.Fatalf("result %q", text)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("one call with 9,900-deep arguments allocated %d bytes", alloc)
	if alloc > 4<<20 {
		t.Fatalf("one call with 9,900-deep arguments allocated %d bytes", alloc)
	}
	if _, err := boundedTool().ValidateArguments(args); !errors.Is(err, agent.ErrArgumentsTooDeep) {
		t.Fatalf("ValidateArguments: %v", err)
	}
	if _, err := boundedTool().ValidateArguments(map[string]any{"expression": "1", "n": deepArrays(63, 1.0)}); errors.Is(err, agent.ErrArgumentsTooDeep) {
		t.Fatalf("64 levels refused: %v", err)
	}
}
