// Package demo is the reply of the model a worker with no endpoint
// serves (worker.DemoProvider): canned, saying it is a demo, with a
// calculator call when the prompt holds arithmetic so that the offline
// demo shows a tool call.
package demo

import (
	"regexp"
	"strings"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/llm/faux"
)

// Notice is what the demo model says about itself, in the worker's log
// and in run_started.
const Notice = "DEMO MODEL: no model endpoint is configured on this worker, so replies are canned (set OPENAI_BASE_URL / OPENAI_API_KEY for a real model)"

// arithmetic finds an expression with at least one operator in a prompt.
var arithmetic = regexp.MustCompile(`\(*[-+]?\d+(?:\.\d+)?\)*(?:\s*[-+*/%^]\s*\(*[-+]?\d+(?:\.\d+)?\)*)+`)

// Reply answers like a tiny model: with the calculator when the run
// offers it and the prompt holds arithmetic, so the offline demo shows a
// tool call; otherwise with a canned text that says it is a demo.
func Reply(llm agent.Context) faux.Response {
	said := ""
	if n := len(llm.Messages); n > 0 {
		if last := llm.Messages[n-1]; last.Role == agent.RoleToolResult && last.ToolName == "calculator" {
			return faux.Response{Content: []agent.Content{agent.Text("The calculator says: " + last.TextOf())}}
		}
	}
	for i := len(llm.Messages) - 1; i >= 0; i-- {
		if llm.Messages[i].Role == agent.RoleUser {
			said = llm.Messages[i].TextOf()
			break
		}
	}
	if expr := arithmetic.FindString(said); expr != "" && hasTool(llm.Tools, "calculator") {
		return faux.Response{
			Content:    []agent.Content{agent.Text("Let me compute that."), agent.ToolCall("demo-calc-1", "calculator", map[string]any{"expression": strings.TrimSpace(expr)})},
			StopReason: agent.StopReasonToolUse,
		}
	}
	text := "Hello from agentfleet's demo model. No model endpoint is configured on this worker, " +
		"so this reply is canned; configure OPENAI_BASE_URL and OPENAI_API_KEY (or --openai-base-url) for a real model."
	if said != "" {
		text += "\n\nYou said: " + said
	}
	return faux.Response{Content: []agent.Content{agent.Text(text)}}
}

func hasTool(tools []*agent.Tool, name string) bool {
	for _, t := range tools {
		if t.Name == name {
			return true
		}
	}
	return false
}
