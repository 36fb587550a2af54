package worker

import (
	"context"
	"iter"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/llm/faux"
	"github.com/agentfleet/agentfleet/worker/internal/demo"
)

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
	m := faux.New(faux.Options{TokenSize: 2, TokensPerSecond: 400, Fallback: demo.Reply})
	return noticeProvider{&FauxProvider{M: m, Notice: demo.Notice}}
}
