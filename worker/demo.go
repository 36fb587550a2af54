package worker

import (
	"context"
	"encoding/json"
	"iter"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/llm/faux"
)

// DemoNotice is what the demo model says about itself, in the worker's log
// and in run_started.
const DemoNotice = "DEMO MODEL: no model endpoint is configured on this worker, so replies are canned (set OPENAI_BASE_URL / OPENAI_API_KEY for a real model)"

// FauxProvider serves a faux model as a provider.
type FauxProvider struct {
	M      *faux.Model
	Notice string // reported in run_started, if set
}

// Stream implements Provider.
func (p *FauxProvider) Stream(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	return p.M.Stream(ctx, model, llm, opts)
}

// Model implements Provider.
func (p *FauxProvider) Model(id string) agent.Model {
	return agent.Model{ID: id, Name: id, API: "faux", Provider: "faux"}
}

// noticeProvider adds a notice to a faux provider.
type noticeProvider struct{ *FauxProvider }

func (p noticeProvider) Notice() string { return p.FauxProvider.Notice }

// DemoProvider is the model of a worker with no endpoint: it streams a
// canned reply that says it is a demo and echoes the last user message.
func DemoProvider() Provider {
	m := faux.New(faux.Options{TokenSize: 2, TokensPerSecond: 400, Fallback: demoReply})
	return noticeProvider{&FauxProvider{M: m, Notice: DemoNotice}}
}

func demoReply(llm agent.Context) faux.Response {
	said := ""
	for i := len(llm.Messages) - 1; i >= 0; i-- {
		if llm.Messages[i].Role == agent.RoleUser {
			said = llm.Messages[i].TextOf()
			break
		}
	}
	text := "Hello from agentfleet's demo model. No model endpoint is configured on this worker, " +
		"so this reply is canned; configure OPENAI_BASE_URL and OPENAI_API_KEY (or --openai-base-url) for a real model."
	if said != "" {
		text += "\n\nYou said: " + said
	}
	return faux.Response{Content: []agent.Content{agent.Text(text)}}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
