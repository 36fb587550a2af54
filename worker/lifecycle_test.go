package worker_test

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker"
)

// A run much longer than AckWait finishes on its first attempt: the finish
// has its own deadline, counted from when the finish starts.
func TestLongRunFinishesOnFirstAttempt(t *testing.T) {
	f := newFleet(t)
	ackWait := 2 * time.Second
	o := newObs()
	f.startWorker(worker.Config{AckWait: ackWait, Observer: o})
	secs := (2*ackWait + time.Second).Seconds()
	id := f.submit("", &bus.RunRequest{Prompt: "wait", Tools: []string{"sleep"}, Model: fauxModel(),
		Faux: &bus.FauxScript{Responses: []bus.FauxResponse{
			toolCall("s1", "sleep", map[string]any{"seconds": secs}),
			textResp("done"),
		}}})
	envs := f.follow(id)
	started, resumed := 0, 0
	for _, e := range envs {
		switch e.Type {
		case bus.EventRunStarted:
			started++
		case bus.EventRunResumed:
			resumed++
		}
	}
	tr := transcriptOf(t, envs)
	if started != 1 || resumed != 0 || tr.Attempt != 1 || tr.Finished == nil || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("run_started %d, run_resumed %d, attempt %d, finished %+v\n%s", started, resumed, tr.Attempt, tr.Finished, dump(envs))
	}
	rec, err := f.c.Status(f.ctx(), id)
	if err != nil || rec.State != bus.StatusSucceeded || rec.Attempt != 1 {
		t.Fatalf("record %+v %v", rec, err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.started != 1 {
		t.Fatalf("%d attempts started, want 1", o.started)
	}
}
