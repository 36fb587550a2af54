package main

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/llm/faux"
	"github.com/agentfleet/agentfleet/toolsource"
	"github.com/agentfleet/agentfleet/worker"
)

// pricedModel is a model with prices (so runs cost something) whose
// replies are scripted per run: reply(prompt, turn) is the model's answer
// in turn turn (0-based) of a run whose first user message is prompt. It
// lists its models, as a provider with a model table does (presence).
type pricedModel struct {
	m      *faux.Model
	models []string
}

func newPricedModel(tokensPerSecond float64, reply func(prompt string, turn int, llm agent.Context) agent.ScriptedResponse, models ...string) *pricedModel {
	return &pricedModel{models: models, m: faux.New(faux.Options{TokenSize: 1, TokensPerSecond: tokensPerSecond,
		Fallback: func(llm agent.Context) agent.ScriptedResponse {
			prompt, turn := "", 0
			for _, m := range llm.Messages {
				switch {
				case m.Role == agent.RoleUser && prompt == "":
					prompt = m.TextOf()
				case m.Role == agent.RoleAssistant:
					turn++
				}
			}
			return reply(prompt, turn, llm)
		}})}
}

// scripted replies from a table: prompt to the responses of its turns.
func scripted(scripts map[string][]agent.ScriptedResponse) func(string, int, agent.Context) agent.ScriptedResponse {
	return func(prompt string, turn int, _ agent.Context) agent.ScriptedResponse {
		if s := scripts[prompt]; turn < len(s) {
			return s[turn]
		}
		return agent.ScriptedResponse{Content: []agent.Content{agent.Text("(the script has no turn " + fmt.Sprint(turn+1) + ")")}}
	}
}

func (p *pricedModel) Stream(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	return p.m.Stream(ctx, model, llm, opts)
}

// Model has prices per million tokens, as a model table gives them.
func (p *pricedModel) Model(id string) agent.Model {
	return agent.Model{ID: id, Name: id, API: "faux", Provider: "priced", Cost: agent.ModelCost{Input: 2.5, Output: 10}}
}

func (p *pricedModel) Models() []string { return p.models }

// newTestFleetWith is newTestFleet with the worker's config made by mk
// (providers, tools, tool sources) for the fleet's server.
func newTestFleetWith(t testing.TB, mk func(url string) worker.Config) *testFleet {
	t.Helper()
	fl := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default", "other"}, AckWait: 5 * time.Second}})
	cfg := mk(fl.URL())
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 64
	}
	cfg.DrainTimeout = 2 * time.Second
	if cfg.WorkerID == "" {
		cfg.WorkerID = "test-worker-1"
	}
	fl.StartWorker(cfg)
	return &testFleet{Fleet: fl, t: t, srv: fl.Server, c: fl.Client}
}

// textService serves two tools as a NATS micro service "text" (a tool
// source of kind service:text), until the test ends.
func textService(t testing.TB, url string) toolsource.Source {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name("text-tools"))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := micro.AddService(nc, micro.Config{Name: "text", Version: "1.0.0", Description: "text tools"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop(); nc.Close() })
	const schema = `{"type":"object","properties":{"text":{"type":"string","description":"The text."}},"required":["text"]}`
	g := svc.AddGroup("agents.tools.text")
	for name, fn := range map[string]func(string) string{
		"upper":       strings.ToUpper,
		"count_words": func(s string) string { return fmt.Sprint(len(strings.Fields(s))) },
	} {
		err := g.AddEndpoint(name, micro.HandlerFunc(func(r micro.Request) {
			var a struct {
				Text string `json:"text"`
			}
			_ = json.Unmarshal(r.Data(), &a)
			_ = r.RespondJSON(map[string]any{"content": []map[string]any{{"type": "text", "text": fn(a.Text)}}})
		}), micro.WithEndpointMetadata(map[string]string{"description": "Text tool " + name + ".", "schema": schema}))
		if err != nil {
			t.Fatal(err)
		}
	}
	wc, err := nats.Connect(url, nats.Name("text-tools-worker"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wc.Close)
	src, err := toolsource.NewServices(wc, toolsource.ServiceOptions{Allowed: []string{"text"}})
	if err != nil {
		t.Fatal(err)
	}
	return src
}
