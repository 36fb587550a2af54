package bus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
	"github.com/agentfleet/agentfleet/worker"
)

// exampleFleet starts an embedded server and one worker with cfg's tools
// and observer, for the examples; stop ends both.
func exampleFleet(cfg worker.Config) (c *bus.Client, stop func()) {
	dir, err := os.MkdirTemp("", "agentfleet-example")
	if err != nil {
		panic(err)
	}
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: dir})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c, err = bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()}); err != nil {
		panic(err)
	}
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		panic(err)
	}
	cfg.Client, cfg.PollWait, cfg.Logger = c, 100*time.Millisecond, slog.New(slog.DiscardHandler)
	wctx, stopWorker := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- worker.Run(wctx, cfg) }()
	return c, func() {
		stopWorker()
		<-done
		c.Close()
		srv.Shutdown()
		_ = os.RemoveAll(dir)
	}
}

// steered tells when the worker has put a steer into its run's queue.
type steered struct {
	worker.NopObserver
	ch chan struct{}
}

func (o steered) ControlReceived(kind string) {
	if kind == bus.KindSteer {
		close(o.ch)
	}
}

// Steering a run: the message goes into the run's queue and the agent
// takes it before its next model call. Here a tool call is under way when
// the steer comes; the tool waits until the worker has queued it, so the
// example's output is always the same.
func ExampleClient_Steer() {
	obs := steered{ch: make(chan struct{})}
	lookup := agent.NewTool("lookup", "Looks a city up.", func(context.Context, struct{}, agent.UpdateFunc) (agent.ToolResult, error) {
		<-obs.ch
		return agent.TextResult("Lyon: 520,000 people"), nil
	})
	c, stop := exampleFleet(worker.Config{Tools: []*agent.Tool{lookup}, Observer: obs})
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	res, err := c.Submit(ctx, bus.DefaultQueue, &bus.RunRequest{
		Prompt: "How big is Lyon?",
		Tools:  []string{"lookup"},
		Model:  &bus.ModelRef{Provider: "faux", ID: "scripted"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.ToolCall("call-1", "lookup", nil)}, StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text("About half a million; in French: environ un demi-million.")}},
		}},
	})
	if err != nil {
		panic(err)
	}
	tr := &bus.Transcript{}
	for env, err := range c.Follow(ctx, res.ID) {
		if err != nil {
			panic(err)
		}
		_ = tr.Apply(env)
		if env.Type == string(agent.EventToolExecutionStart) {
			if _, err := c.Steer(ctx, res.ID, "Answer in French too."); err != nil {
				panic(err)
			}
		}
	}
	for _, m := range tr.Messages {
		if calls := m.ToolCalls(); len(calls) > 0 {
			fmt.Printf("%s calls %s\n", m.Role, calls[0].Name)
			continue
		}
		fmt.Printf("%s: %s\n", m.Role, m.TextOf())
	}
	// Output:
	// user: How big is Lyon?
	// assistant calls lookup
	// toolResult: Lyon: 520,000 people
	// user: Answer in French too.
	// assistant: About half a million; in French: environ un demi-million.
}

// Approving a gated call: the request names the tools that ask first
// (Approval.Tools); the run publishes tool_approval_requested with the
// call's id and waits, without a worker slot, until someone answers.
func ExampleClient_Answer() {
	deploy := agent.NewTool("deploy", "Deploys a service.", func(_ context.Context, a struct {
		Target string `json:"target"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		return agent.TextResult("deployed " + a.Target), nil
	})
	c, stop := exampleFleet(worker.Config{Tools: []*agent.Tool{deploy}})
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	res, err := c.Submit(ctx, bus.DefaultQueue, &bus.RunRequest{
		Prompt:   "Deploy the shop.",
		Tools:    []string{"deploy"},
		Approval: &bus.Approval{Tools: []string{"deploy"}},
		Model:    &bus.ModelRef{Provider: "faux", ID: "scripted"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.ToolCall("call-1", "deploy", map[string]any{"target": "shop"})}, StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text("The shop is deployed.")}},
		}},
	})
	if err != nil {
		panic(err)
	}
	for env, err := range c.Follow(ctx, res.ID) {
		if err != nil {
			panic(err)
		}
		switch env.Type {
		case bus.EventToolApprovalRequested:
			var asked struct {
				ToolCallID string         `json:"toolCallId"`
				ToolName   string         `json:"toolName"`
				Args       map[string]any `json:"args"`
			}
			if err := json.Unmarshal(env.Event, &asked); err != nil {
				panic(err)
			}
			fmt.Println("asked:", asked.ToolName, asked.Args["target"])
			if _, err := c.Answer(ctx, res.ID, bus.ApprovalAnswer{ToolCallID: asked.ToolCallID, Decision: bus.DecisionApprove, By: "ops"}); err != nil {
				panic(err)
			}
		case bus.EventToolApprovalResolved:
			var resolved struct {
				Decision string `json:"decision"`
				By       string `json:"by"`
			}
			if err := json.Unmarshal(env.Event, &resolved); err != nil {
				panic(err)
			}
			fmt.Println("resolved:", resolved.Decision, "by", resolved.By)
		case string(agent.EventToolExecutionEnd):
			fmt.Println("the call ran")
		case bus.EventRunFinished:
			fmt.Println("finished")
		}
	}
	// Output:
	// asked: deploy shop
	// resolved: approve by ops
	// the call ran
	// finished
}
