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
//
// # Where things are
//
// The worker and its parts:
//
//	worker.go       Worker, New, Run: the pull loops, slots, drain
//	services.go     the parts Run starts before it pulls and stops after the runs
//	config.go       Config, Provider, Observer
//	presence.go     the worker's entry in agents_workers
//	orphans.go      requests no consumer will deliver: swept, with a reason
//	pickupread.go   which queues' first deliveries skip the record read
//	coverage.go     keeping the control coverage (internal/intake) current
//	giveup.go       MAX_DELIVERIES advisories: the I/O of internal/giveup's decision
//	metrics.go      MetricsObserver (Prometheus)
//
// A run, from pickup to its end (run.go's execute reads top down):
//
//	run.go          run: handle, execute, pickup, acquire, drive
//	plan.go         the request resolved: model, tools, limits; streamFn
//	heartbeat.go    the heartbeat: InProgress, the lease's renewal, the catch-up kick
//	control.go      the control owner: steer, follow-up, abort, approve, idle checks
//	listener.go     the agent's events into the run's envelopes
//	resume.go       a later attempt restores the transcript
//	waiting.go      runs that wait without a slot (approvals), MaxWaiting
//	approval.go     gated tool calls: ask, wait, answer (approval_set.go: the answers)
//	endings.go      every way an attempt ends: finish, hand back, abandon, refuse
//
// A model call, in the order streamFn wraps it:
//
//	settle.go       the call's meter (meteredProvider); the rules in internal/metering
//	ratelimit.go    shared model rate limits
//	tenant.go       tenants' budgets
//	budget.go       a run's cost bound
//	trace.go        a run's OpenTelemetry spans (made by internal/runtrace)
//
// Tools: tools.go (a call's timeout, caps and metrics), toolsources.go
// (tools served over NATS and MCP), demo.go (the demo model).
//
// Internal packages, which never import this one:
//
//	internal/eventpub   an attempt's events: ordered, acknowledged, re-sent, batched
//	internal/intake     pull requests, request acks, the pickup's read skips
//	internal/callkey    tool call keys, unique within a run
//	internal/builtin    the built-in tools: calculator, current_time, sleep
//	internal/runclock   a run's timeout, waits left out
//	internal/outcome    what a run did and why it stops: its run_finished
//	internal/lease      the run record as an attempt's lease: take, renew, final write
//	internal/metering   what a model call is charged: estimates, bounds, settle
//	internal/peers      the other workers' presence: who serves a tool, mixed tools
//	internal/giveup     what a give-up does with a request, from the run's record alone
//	internal/eventread  bounded reads of runs' stored events: slots, a time each, retries
//	internal/runtrace   an attempt's OpenTelemetry spans: invoke_agent, calls, waits, steps
//	internal/genai      the GenAI conventions' span content: messages, usage, finish reasons
//	internal/demo       the demo model's reply: canned, with a calculator call for arithmetic
package worker
