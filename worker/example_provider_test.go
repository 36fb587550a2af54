package worker_test

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
	"github.com/agentfleet/agentfleet/worker"
)

// echoProvider is a model endpoint of your own: it answers every call
// with the last user message, reversed. A real one calls its endpoint in
// Stream and yields what comes back, ending with one done (or error)
// event that carries the whole message.
type echoProvider struct{}

func (echoProvider) Model(id string) agent.Model {
	return agent.Model{ID: id, Name: id, API: "echo", Provider: "echo"}
}

func (echoProvider) Stream(_ context.Context, model agent.Model, llm agent.Context, _ agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	return func(yield func(agent.StreamEvent) bool) {
		var last string
		for _, m := range llm.Messages {
			if m.Role == agent.RoleUser {
				last = m.TextOf()
			}
		}
		r := []rune(last)
		for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
			r[i], r[j] = r[j], r[i]
		}
		text := string(r)
		head := agent.Message{Role: agent.RoleAssistant, API: model.API, Provider: model.Provider, Model: model.ID}
		final := head
		final.Content = []agent.Content{agent.Text(text)}
		final.StopReason = agent.StopReasonStop
		final.Usage = agent.Usage{Input: len(last) / 4, Output: len(text) / 4}
		for _, ev := range []agent.StreamEvent{
			{Type: agent.StreamStart, Message: &head},
			{Type: agent.StreamTextStart},
			{Type: agent.StreamTextDelta, Delta: text},
			{Type: agent.StreamTextEnd, Content: text},
			{Type: agent.StreamDone, Reason: agent.StopReasonStop, Message: &final},
		} {
			if !yield(ev) {
				return
			}
		}
	}
}

// A worker with a model provider of its own: Config.Providers names it,
// and a run asks for it by that name (or it is the DefaultModel's).
func ExampleRun_customProvider() {
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
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		panic(err)
	}

	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- worker.Run(wctx, worker.Config{
			Client:       c,
			Providers:    map[string]worker.Provider{"echo": echoProvider{}},
			DefaultModel: "echo/backwards",
			PollWait:     100 * time.Millisecond,
			Logger:       slog.New(slog.DiscardHandler),
		})
	}()
	defer func() { stop(); <-done }()

	res, err := c.Submit(ctx, bus.DefaultQueue, &bus.RunRequest{Prompt: "stressed"})
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
		fmt.Printf("%s: %s\n", m.Role, strings.TrimSpace(m.TextOf()))
	}
	fmt.Println(tr.Started.Model, tr.Finished.Status)
	// Output:
	// user: stressed
	// assistant: desserts
	// echo/backwards succeeded
}
