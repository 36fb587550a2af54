package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
	"github.com/agentfleet/agentfleet/worker"
)

// Embedding a worker: an in-process NATS server, one worker with a tool of
// your own, and a run that uses it. The run's model is the scripted faux
// model, so the example needs no model endpoint; a real embedding sets
// Config.Providers (for instance "openai": openai.New(...)).
func ExampleRun() {
	dir, err := os.MkdirTemp("", "agentfleet-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: dir})
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	type shoutArgs struct {
		Text string `json:"text"`
	}
	shout := agent.NewTool("shout", "Upper-cases a text.",
		func(_ context.Context, a shoutArgs, _ agent.UpdateFunc) (agent.ToolResult, error) {
			return agent.TextResult(strings.ToUpper(a.Text)), nil
		})

	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- worker.Run(wctx, worker.Config{
			Client:   c,
			Tools:    []*agent.Tool{shout},
			PollWait: 100 * time.Millisecond,
			Logger:   slog.New(slog.DiscardHandler),
		})
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			fmt.Println("worker:", err)
		}
	}()

	// The worker creates the streams; a client may submit once they exist.
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		panic(err)
	}
	res, err := c.Submit(ctx, bus.DefaultQueue, &bus.RunRequest{
		Prompt: "Shout hello.",
		Tools:  []string{"shout"},
		Model:  &bus.ModelRef{Provider: "faux", ID: "scripted"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.ToolCall("call-1", "shout", map[string]any{"text": "hello"})}, StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text("The tool says HELLO.")}},
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
	}
	for _, m := range tr.Messages {
		for _, b := range m.Content {
			switch b.Type {
			case agent.ContentText:
				fmt.Printf("%s: %s\n", m.Role, b.Text)
			case agent.ContentToolCall:
				fmt.Printf("%s calls %s(%s)\n", m.Role, b.Name, agent.CanonicalJSON(b.Arguments))
			}
		}
	}
	fmt.Println(tr.Finished.Status)
	// Output:
	// user: Shout hello.
	// assistant calls shout({"text":"hello"})
	// toolResult: HELLO
	// assistant: The tool says HELLO.
	// succeeded
}
