package worker

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// A read that waits for its slot longer than a read may take still reads:
// its time limit starts with the slot (a worker taking over thousands of
// runs queues most of their resumes).
func TestEventReadTimeLimitStartsWithItsSlot(t *testing.T) {
	w, c := startInternal(t, Config{}, func(w *Worker) { w.eventReadTimeout = 300 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, _ := json.Marshal(bus.RunStarted{Type: bus.EventRunStarted, Attempt: 1})
	env := &bus.Envelope{Run: "r", Seq: 1, Attempt: 1, Worker: "w", TS: 1, Event: b}
	if _, err := c.JetStream().Publish(ctx, c.Names().Events("r"), env.AppendJSON(nil)); err != nil {
		t.Fatal(err)
	}
	for range maxEventReads {
		w.eventReads <- struct{}{}
	}
	type result struct {
		envs []*bus.Envelope
		err  error
	}
	done := make(chan result, 1)
	go func() {
		envs, err := w.readEvents(ctx, "r", 0)
		done <- result{envs, err}
	}()
	// Every slot stays taken for three times the read's limit; the read
	// must still be waiting for one, not failed.
	select {
	case r := <-done:
		t.Fatalf("the read ended while every slot was taken: %d envelopes, %v", len(r.envs), r.err)
	case <-time.After(900 * time.Millisecond):
	}
	<-w.eventReads
	r := <-done
	if r.err != nil || len(r.envs) != 1 {
		t.Fatalf("after a slot was freed: %d envelopes, %v; want the run_started", len(r.envs), r.err)
	}
	for range maxEventReads - 1 {
		<-w.eventReads
	}
}
