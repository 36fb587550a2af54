package bus_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
	"github.com/agentfleet/agentfleet/worker"
)

// Following a run: Follow replays the run's events from the start, then
// goes on live, and ends after run_finished. A Transcript folds them into
// the conversation. Here the fleet (an embedded server and a worker with
// the scripted faux model) lives in the same process; against a real fleet
// only bus.Connect's URL changes.
func ExampleClient_Follow() {
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
		done <- worker.Run(wctx, worker.Config{Client: c, PollWait: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	}()
	defer func() { stop(); <-done }()

	res, err := c.Submit(ctx, bus.DefaultQueue, &bus.RunRequest{
		Prompt: "Say hello.",
		Model:  &bus.ModelRef{Provider: "faux", ID: "scripted"},
		Faux:   &bus.FauxScript{Responses: []agent.ScriptedResponse{{Content: []agent.Content{agent.Text("Hello!")}}}},
	})
	if err != nil {
		panic(err)
	}
	tr := &bus.Transcript{}
	for env, err := range c.Follow(ctx, res.ID) {
		if err != nil {
			if bus.IsFatalFollowError(err) {
				panic(err)
			}
			continue // a gap or an event that does not decode: reported, skipped
		}
		_ = tr.Apply(env)
		switch env.Type {
		case bus.EventRunStarted:
			fmt.Println("started, protocol", tr.Started.Protocol)
		case string(agent.EventMessageEnd):
			m := tr.Messages[len(tr.Messages)-1]
			fmt.Printf("%s: %s\n", m.Role, m.TextOf())
		case bus.EventRunFinished:
			fmt.Println("finished:", tr.Finished.Status)
		}
	}
	// Output:
	// started, protocol 1.10
	// user: Say hello.
	// assistant: Hello!
	// finished: succeeded
}
