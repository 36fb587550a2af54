package worker

import (
	"context"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// napTool waits off its run's slot through the bare primitive, as any wait
// that is not an approval would (what "nap"), until the test wakes it.
func napTool(wake <-chan struct{}, waiting chan<- struct{}) *agent.Tool {
	return agent.NewTool("nap", "waits off its slot", func(ctx context.Context, _ struct{}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		r := ctx.Value(runKey{}).(*run)
		r.toolBusy(-1)
		defer r.toolBusy(1)
		err := r.waitOffSlot(ctx, "nap", time.Now(), func(wctx context.Context) error {
			waiting <- struct{}{}
			select {
			case <-wake:
				return nil
			case <-wctx.Done():
				return wctx.Err()
			}
		})
		if err != nil {
			return agent.ToolResult{}, err
		}
		return agent.TextResult("rested"), nil
	})
}

// The primitive: a run that waits twice leaves its slot both times (a
// concurrency-1 worker finishes other runs meanwhile), shows what it waits
// for in its record, and its waits do not count against its timeout.
func TestWaitOffSlotPrimitive(t *testing.T) {
	t.Parallel()
	wake, waiting := make(chan struct{}), make(chan struct{}, 1)
	w, c := startInternal(t, Config{Concurrency: 1, HeartbeatInterval: 300 * time.Millisecond,
		Tools: []*agent.Tool{napTool(wake, waiting)}}, nil)
	nap := agent.ScriptedResponse{Content: []agent.Content{agent.ToolCall("n", "nap", map[string]any{})}, StopReason: agent.StopReasonToolUse}
	run := submitRun(t, c, &bus.RunRequest{Prompt: "rest", Tools: []string{"nap"}, Model: fauxModel, Limits: &bus.Limits{TimeoutSeconds: 1},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{nap, nap, {Content: []agent.Content{agent.Text("done")}}}}})
	re := followRun(t, c, run)
	var prevSince time.Time // the first wait's: its last record may still be stored when the second wait starts
	for i := range 2 {
		within(t, waiting, 20*time.Second, "the wait")
		rec := waitRecord(t, c, run, "waiting for a nap", func(r *bus.RunRecord) bool {
			return r.Waiting != nil && r.Waiting.For == "nap" && r.Waiting.Since.After(prevSince) &&
				r.HeartbeatAt.Sub(r.Waiting.Since) > 1200*time.Millisecond
		})
		prevSince = rec.Waiting.Since
		if rec.State != bus.StateRunning || w.OffSlot() != 1 {
			t.Fatalf("wait %d: record %+v, %d off slot", i, rec, w.OffSlot())
		}
		other := submitRun(t, c, &bus.RunRequest{Prompt: "hi", Model: fauxModel, Faux: fauxTexts("hello")})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		tr, err := c.LoadTranscript(ctx, other)
		cancel()
		if err != nil || tr.Finished.Status != bus.StatusSucceeded {
			t.Fatalf("wait %d: the other run: %v", i, err)
		}
		wake <- struct{}{}
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v: the waits counted against the 1s timeout", fin)
	}
	final := waitRecord(t, c, run, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
	if final.Waiting != nil || final.WaitedMs < 2400 || w.OffSlot() != 0 {
		t.Fatalf("final record waiting %+v, waitedMs %d; %d off slot", final.Waiting, final.WaitedMs, w.OffSlot())
	}
}
