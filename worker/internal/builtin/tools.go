// Package builtin is the worker's built-in tools: calculator,
// current_time and sleep.
package builtin

import (
	"context"
	"fmt"
	"time"

	"github.com/agentfleet/agentfleet/agent"
)

// maxSleep bounds the sleep tool.
const maxSleep = 60 * time.Second

type calcArgs struct {
	// Commas in a description are escaped: a bare one ends it.
	Expression string `json:"expression" jsonschema:"description=An arithmetic expression: numbers\\, + - * / % ^ and parentheses\\, e.g. (2+3)*4^2"`
}

type timeArgs struct {
	Timezone string `json:"timezone,omitempty" jsonschema:"description=IANA time zone such as Europe/Paris; default UTC"`
}

type sleepArgs struct {
	Seconds float64 `json:"seconds" jsonschema:"description=How long to wait\\, at most 60 seconds,minimum=0,maximum=60"`
}

// Tools returns the built-in tools: calculator, current_time, sleep.
func Tools() []*agent.Tool {
	calc := agent.NewTool("calculator", "Evaluate an arithmetic expression (+ - * / % ^, parentheses, unary minus) and return the number.",
		func(_ context.Context, a calcArgs, _ agent.UpdateFunc) (agent.ToolResult, error) {
			v, err := calculate(a.Expression)
			if err != nil {
				return agent.ToolResult{}, fmt.Errorf("cannot evaluate %q: %w", a.Expression, err)
			}
			return agent.TextResult(formatNumber(v)), nil
		})
	now := agent.NewTool("current_time", "Return the current date and time (RFC 3339) in a time zone (default UTC).",
		func(_ context.Context, a timeArgs, _ agent.UpdateFunc) (agent.ToolResult, error) {
			loc := time.UTC
			if a.Timezone != "" {
				l, err := time.LoadLocation(a.Timezone)
				if err != nil {
					return agent.ToolResult{}, fmt.Errorf("unknown time zone %q", a.Timezone)
				}
				loc = l
			}
			t := time.Now().In(loc)
			return agent.TextResult(t.Format(time.RFC3339) + " (" + t.Weekday().String() + ")"), nil
		})
	sleep := agent.NewTool("sleep", "Wait for a number of seconds (at most 60), then return. For tests and load tests.",
		func(ctx context.Context, a sleepArgs, _ agent.UpdateFunc) (agent.ToolResult, error) {
			if a.Seconds < 0 || a.Seconds > maxSleep.Seconds() {
				return agent.ToolResult{}, fmt.Errorf("seconds must be between 0 and %g", maxSleep.Seconds())
			}
			t := time.NewTimer(time.Duration(a.Seconds * float64(time.Second)))
			defer t.Stop()
			select {
			case <-t.C:
				return agent.TextResult(fmt.Sprintf("slept %gs", a.Seconds)), nil
			case <-ctx.Done():
				return agent.ToolResult{}, ctx.Err()
			}
		})
	return []*agent.Tool{calc, now, sleep}
}
