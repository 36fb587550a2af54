package worker

import (
	"context"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

type ctlObs struct {
	NopObserver
	got chan string
}

func (o ctlObs) ControlReceived(kind string) { o.got <- kind }

// A follow-up (and a steer) that arrive after the agent's last look at its
// queues, while the run is not finished yet, still run.
func TestLateControlMessagesAreNotLost(t *testing.T) {
	o := ctlObs{got: make(chan string, 10)}
	idle := make(chan string)
	resume := make(chan struct{})
	first := true
	_, c := startInternal(t, Config{Observer: o}, func(w *Worker) {
		w.signals.run.beforeIdleCheck = func(id string) {
			if first {
				first = false
				idle <- id
				<-resume
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	res, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "one", Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.Text("first")}},
			{Content: []agent.Content{agent.Text("second")}},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-idle: // agent_end is out; the agent will not poll again
	case <-ctx.Done():
		t.Fatal("run never went idle")
	}
	if _, err := c.FollowUp(ctx, res.ID, "late"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-o.got:
	case <-ctx.Done():
		t.Fatal("follow-up never received")
	}
	close(resume)
	tr, err := c.LoadTranscript(ctx, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, m := range tr.Messages {
		texts = append(texts, m.Role+":"+m.TextOf())
	}
	want := []string{"user:one", "assistant:first", "user:late", "assistant:second"}
	if len(texts) != len(want) {
		t.Fatalf("transcript %v", texts)
	}
	for i := range want {
		if texts[i] != want[i] {
			t.Fatalf("transcript %v, want %v", texts, want)
		}
	}
	if tr.Finished.Status != bus.StatusSucceeded || len(tr.ControlSeqs()) != 1 {
		t.Fatalf("finished %+v, control seqs %v", tr.Finished, tr.ControlSeqs())
	}
}
