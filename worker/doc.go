// Package worker is agentfleet's worker runtime: it takes run requests from
// NATS JetStream work queues (bus), drives one agent.Agent per run, publishes
// every event of the run to the run's subject, and applies the steering,
// follow-up and abort messages sent to it. Embed it with your own tools:
//
//	c, _ := bus.Connect(ctx, bus.ConnectOptions{URL: "nats://127.0.0.1:4222"})
//	err := worker.Run(ctx, worker.Config{Client: c, Tools: myTools,
//		Providers: map[string]worker.Provider{"openai": provider}, DefaultModel: "openai/gpt-4o-mini"})
//
// See docs/architecture.md for the data flow and docs/protocol.md for the
// wire protocol.
package worker
