package worker_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/ratelimit"
	"github.com/agentfleet/agentfleet/worker"
)

// A request's maxTokens past bus.MaxTokensLimit is a bad request: near
// MaxInt it used to wrap the call's output bound and reservation below
// zero (a reported usage "clamped" to negative output, a reservation of
// nothing).
func TestSpendMaxTokensBeyondTheLimitIsABadRequest(t *testing.T) {
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
