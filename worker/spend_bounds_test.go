package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/llm/openai"
	"github.com/agentfleet/agentfleet/ratelimit"
	"github.com/agentfleet/agentfleet/worker"
)

// A request's maxTokens past bus.MaxTokensLimit is a bad request: near
// MaxInt it used to wrap the call's output bound and reservation below
// zero (a reported usage "clamped" to negative output, a reservation of
// nothing).
func TestSpendMaxTokensBeyondTheLimitIsABadRequest(t *testing.T) {
	t.Parallel()
	e := &spendEndpoint{reply: func(int) spendReply { return spendReply{usage: "real"} }}
	f := newSpendFleet(t, e)
	f.startWorker(0, &worker.RateLimits{Window: 10 * time.Second, Models: map[string]worker.ModelLimit{
		"openai/m": {Group: "g", Limits: ratelimit.Limits{RPM: 100, TPM: 100_000}, MaxTokens: spendMaxTokens}}})
	for _, n := range []int{1<<63 - 1, bus.MaxTokensLimit + 1} {
		req := spendRun("huge")
		req.MaxTokens = n
		body, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		// Published raw: the client's Submit checks the request first.
		id := bus.NewRunID()
		if _, err := f.Client.JetStream().Publish(fleettest.Context(t), f.Client.Names().Submit(bus.DefaultQueue, id), body); err != nil {
			t.Fatal(err)
		}
		fin := finishedOf(t, f.Follow(id))
		if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonBadRequest || !strings.Contains(fin.Error, "maxTokens") {
			t.Fatalf("maxTokens %d: finished %s/%s (%s), want failed/bad_request naming maxTokens", n, fin.Status, fin.Reason, fin.Error)
		}
	}
	if n := e.count(); n != 0 {
		t.Fatalf("the endpoint got %d calls, want none", n)
	}
}

// Every call asks for its output reserve (max_tokens): the request's
// maxTokens, else the model table's (at most 32,000), else 4,096; so the
// reserve the budgets and the rate limits count, the clamp of a reported
// output and the cap of an estimated one all describe what was sent. A
// call without maxTokens used to ask for nothing (the model could answer
// up to its window, while an estimate counted at most 4,096 tokens), and
// one whose table says 128,000 asked for 32,000 while its reported
// output was clamped at 128,000 + 10%.
func TestSpendTheCallAsksForItsOutputReserve(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		info      openai.ModelInfo
		request   int // the request's maxTokens
		maxTokens int // what the call asks for
	}{
		{"the table's maxTokens", openai.ModelInfo{ID: "m", MaxTokens: spendMaxTokens, ContextWindow: 128_000}, 0, spendMaxTokens},
		{"the request's maxTokens", openai.ModelInfo{ID: "m", MaxTokens: spendMaxTokens}, 300, 300},
		{"a table's maxTokens past 32,000", openai.ModelInfo{ID: "m", MaxTokens: 128_000, ContextWindow: 200_000}, 0, worker.MaxTableOutputReserve},
		{"no maxTokens anywhere", openai.ModelInfo{ID: "m", ContextWindow: 128_000}, 0, worker.DefaultOutputReserve},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := &spendEndpoint{reply: func(int) spendReply { return spendReply{usage: "forged"} }}
			f := newSpendFleet(t, e)
			f.startWorkerWith(c.info, 0, nil)
			req := spendRun("t")
			req.MaxTokens = c.request
			envs := f.Follow(f.Submit("", req))
			if fin := finishedOf(t, envs); fin.Status != bus.StatusSucceeded {
				t.Fatalf("finished %s/%s (%s)", fin.Status, fin.Reason, fin.Error)
			}
			if got := e.call(0).maxTokens; got != c.maxTokens {
				t.Fatalf("the call asked for max_tokens %d, want %d", got, c.maxTokens)
			}
			// A forged output is clamped to what was asked for, plus the margin.
			if u, want := assistantUsage(t, envs), c.maxTokens+c.maxTokens/worker.OutputClampMargin+64; u.Output != want {
				t.Fatalf("a forged output charged %d tokens, want the clamp of what was asked for: %d", u.Output, want)
			}
		})
	}
}

// A forged usage, clamped, counts in the shared rate limits as the call's
// reservation at most: with a TPM of three reservations, the clamp (about
// four times the input estimate, plus the output bound) used to hold the
// whole window, and the group's next call waited for it to pass.
func TestSpendForgedUsageDoesNotStallASmallGroup(t *testing.T) {
	t.Parallel()
	e := &spendEndpoint{reply: func(n int) spendReply {
		if n == 0 {
			return spendReply{usage: "forged"}
		}
		return spendReply{usage: "real"}
	}}
	f := newSpendFleet(t, e)
	reserve := worker.EstimateTokens(agent.Context{Messages: []agent.Message{agent.UserText(spendPrompt)}}, 0, spendMaxTokens)
	f.startWorker(0, &worker.RateLimits{Window: 10 * time.Second, Models: map[string]worker.ModelLimit{
		"openai/m": {Group: "g", Limits: ratelimit.Limits{RPM: 100, TPM: 3 * reserve}, MaxTokens: spendMaxTokens}}})
	envs := f.Follow(f.Submit("", spendRun("forged")))
	if fin := finishedOf(t, envs); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %s/%s (%s)", fin.Status, fin.Reason, fin.Error)
	}
	if u := assistantUsage(t, envs); u.Input+u.Output <= 3*reserve {
		t.Fatalf("the clamped charge is %d tokens, not more than the TPM (%d): the test shows nothing", u.Input+u.Output, 3*reserve)
	}
	envs = f.Follow(f.Submit("", spendRun("forged")))
	if fin := finishedOf(t, envs); fin.Status != bus.StatusSucceeded {
		t.Fatalf("the next run finished %s/%s (%s)", fin.Status, fin.Reason, fin.Error)
	}
	for _, env := range envs {
		if ev := fleettest.Decode(t, env); ev.ModelWait != nil {
			t.Fatalf("the next run waited %d ms (%s) for its call: the forged usage holds the group's window", ev.ModelWait.WaitedMs, ev.ModelWait.Reason)
		}
	}
}

// brokenProvider streams the start of an answer and then returns without
// a final event, or panics: a broken contract.
type brokenProvider struct{ panics bool }

func (brokenProvider) Model(id string) agent.Model {
	return agent.Model{ID: id, API: "broken", Provider: "broken", Cost: agent.ModelCost{Input: spendInputPrice, Output: spendOutputPrice}}
}

func (p brokenProvider) Stream(_ context.Context, model agent.Model, _ agent.Context, _ agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	return func(yield func(agent.StreamEvent) bool) {
		_ = yield(agent.StreamEvent{Type: agent.StreamStart, Message: &agent.Message{Role: agent.RoleAssistant,
			API: model.API, Provider: model.Provider, Model: model.ID}}) &&
			yield(agent.StreamEvent{Type: agent.StreamTextStart}) &&
			yield(agent.StreamEvent{Type: agent.StreamTextDelta, Delta: "half an answer"})
		if p.panics {
			panic("provider exploded")
		}
	}
}

// A call whose provider returns without a final event, or panics, ends
// with an error event carrying its charge: its message's usage is what
// the run was charged (the estimate). The agent used to build the message
// itself, with no usage, while the run's tally counted the estimate.
func TestSpendBrokenStreamsMessageCarriesTheCharge(t *testing.T) {
	t.Parallel()
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panics=%v", panics), func(t *testing.T) {
			f := newFleet(t)
			f.StartWorker(worker.Config{DefaultModel: "broken/m", Providers: map[string]worker.Provider{"broken": brokenProvider{panics}}})
			envs := f.Follow(f.Submit("", &bus.RunRequest{Prompt: spendPrompt}))
			fin := finishedOf(t, envs)
			if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonModelError {
				t.Fatalf("finished %s/%s (%s), want failed/model_error", fin.Status, fin.Reason, fin.Error)
			}
			var msg *agent.Message
			for _, env := range envs {
				if ev := fleettest.Decode(t, env); ev.Agent != nil && ev.Type == string(agent.EventMessageEnd) && ev.Agent.Message.Role == agent.RoleAssistant {
					msg = ev.Agent.Message
				}
			}
			if msg == nil {
				t.Fatalf("no assistant message:\n%s", fleettest.Dump(envs))
			}
			if msg.Usage != fin.Usage || !(fin.Cost > 0) {
				t.Fatalf("the message's usage %+v, the run's %+v ($%v): want the same charge", msg.Usage, fin.Usage, fin.Cost)
			}
			in := worker.CallInputTokens(agent.Context{Messages: []agent.Message{agent.UserText(spendPrompt)}})
			if msg.Usage.Input != in || msg.Usage.Output != 5 || msg.TextOf() != "half an answer" || msg.StopReason != agent.StopReasonError {
				t.Fatalf("message %+v, want the text streamed, stop reason error and the estimate (%d in, 5 out)", msg, in)
			}
			if panics != strings.Contains(msg.ErrorMessage, "provider exploded") {
				t.Fatalf("error %q", msg.ErrorMessage)
			}
		})
	}
}

// hugeDeltaProvider streams one text delta too large for a NATS message:
// the run's listener fails on it, mid-call.
type hugeDeltaProvider struct{ brokenProvider }

func (hugeDeltaProvider) Stream(_ context.Context, model agent.Model, _ agent.Context, _ agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	return func(yield func(agent.StreamEvent) bool) {
		_ = yield(agent.StreamEvent{Type: agent.StreamStart, Message: &agent.Message{Role: agent.RoleAssistant,
			API: model.API, Provider: model.Provider, Model: model.ID}}) &&
			yield(agent.StreamEvent{Type: agent.StreamTextStart}) &&
			yield(agent.StreamEvent{Type: agent.StreamTextDelta, Delta: strings.Repeat("x", 2<<20)}) &&
			yield(agent.StreamEvent{Type: agent.StreamDone, Message: &agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonStop,
				API: model.API, Provider: model.Provider, Model: model.ID}})
	}
}

// A run stopped mid-call because it could not publish the call's events
// (an event too large for NATS) was charged the call's estimate; the
// error message the agent then ends the run with carries it.
func TestSpendCallStoppedByItsEventsMessageCarriesTheCharge(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{DefaultModel: "broken/m", Providers: map[string]worker.Provider{"broken": hugeDeltaProvider{}}})
	envs := f.Follow(f.Submit("", &bus.RunRequest{Prompt: spendPrompt}))
	fin := finishedOf(t, envs)
	if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonEventTooLarge {
		t.Fatalf("finished %s/%s (%s), want failed/event_too_large", fin.Status, fin.Reason, fin.Error)
	}
	var msg *agent.Message
	for _, env := range envs {
		if ev := fleettest.Decode(t, env); ev.Agent != nil && ev.Type == string(agent.EventMessageEnd) && ev.Agent.Message.Role == agent.RoleAssistant {
			msg = ev.Agent.Message
		}
	}
	if msg == nil {
		t.Fatalf("no assistant message:\n%s", fleettest.Dump(envs))
	}
	if msg.Usage != fin.Usage || !(fin.Cost > 0) {
		t.Fatalf("the message's usage %+v, the run's %+v ($%v): want the same charge", msg.Usage, fin.Usage, fin.Cost)
	}
}
