package worker

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
)

// The give-up's run_resumed carries the cut-off usage of the attempts
// before it (here attempt 1's call, cut off when its worker stopped, which
// attempt 3 carried), and its run_finished counts it with the restored
// messages' usage: it used to publish no cutOffUsage, so readers lost it,
// and to take the usage of the record, which the crashed attempt 3 had not
// updated.
func TestGiveUpCarriesCutOffUsage(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	picked, release, left := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	reads := 0
	cfg := Config{AckWait: 500 * time.Millisecond, HeartbeatInterval: time.Hour, MaxDeliver: 1, DrainTimeout: 50 * time.Millisecond}
	startInternalOn(t, c, cfg, func(w *Worker) {
		// The delivery stalls at its pickup read until the test ends; the
		// give-up's read waits until the crashed attempts' events are
		// stored.
		beforeRecordRead(w, func(string) {
			mu.Lock()
			reads++
			n := reads
			mu.Unlock()
			switch n {
			case 1:
				close(picked)
				<-release
			case 2:
				<-left
			}
		})
	})
	stored := sync.OnceFunc(func() { close(left) })
	t.Cleanup(func() { close(release); stored() }) // before the worker stops
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "hi", Model: fauxModel, Faux: fauxTexts("hello")})
	if err != nil {
		t.Fatal(err)
	}
	<-picked
	// What the crashed attempts left: attempt 1's call cut off (charged
	// cut), attempt 3's run_resumed carrying it and a call of its own
	// (answer), and attempt 3's record, written before either.
	cut := agent.Usage{Input: 1000, Output: 100, TotalTokens: 1100, Cost: agent.Cost{Total: 0.5}}
	answer := agent.Usage{Input: 2000, Output: 50, TotalTokens: 2050, Cost: agent.Cost{Total: 0.25}}
	now := time.Now()
	rec := bus.RunRecord{ID: res.ID, Queue: "default", State: bus.StateRunning, Attempt: 3, Worker: "gone3",
		RequestSeq: res.Seq, StartedAt: now, HeartbeatAt: now}
	b, _ := json.Marshal(rec)
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, res.ID, b); err != nil {
		t.Fatal(err)
	}
	publish := func(attempt int, seq uint64, interrupted bool, ev any) {
		t.Helper()
		data, err := agent.MarshalJSON(ev)
		if err != nil {
			t.Fatal(err)
		}
		env := &bus.Envelope{Run: res.ID, Seq: seq, Attempt: attempt, Worker: "gone", TS: now.UnixMilli(), Interrupted: interrupted, Event: data}
		if _, err := c.JetStream().Publish(ctx, c.Names().Events(res.ID), env.AppendJSON(nil)); err != nil {
			t.Fatal(err)
		}
	}
	started := func(attempt int) bus.RunStarted {
		return bus.RunStarted{Type: bus.EventRunStarted, Queue: "default", Worker: "gone", Attempt: attempt, Tools: []string{}}
	}
	msgEnd := func(m agent.Message) bus.AgentEvent {
		return bus.AgentEvent{Type: string(agent.EventMessageEnd), Message: &m}
	}
	prompt := agent.UserText("hi")
	publish(1, 1, false, started(1))
	publish(1, 2, false, msgEnd(prompt))
	publish(1, 3, true, msgEnd(agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonAborted,
		ErrorMessage: "Request was aborted", Content: []agent.Content{agent.Text("hel")}, Usage: cut}))
	publish(3, 1, false, started(3))
	publish(3, 2, false, bus.RunResumed{Type: bus.EventRunResumed, Attempt: 3, MessagesRestored: 1, CutOffUsage: &cut})
	publish(3, 3, false, msgEnd(agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonStop,
		Content: []agent.Content{agent.Text("hello")}, Usage: answer}))
	stored()

	_, fin := followToFinished(ctx, t, c, res.ID)
	want := cut
	want.Add(answer)
	if fin.Reason != bus.ReasonGaveUp || fin.Usage != want || fin.Cost != want.Cost.Total {
		t.Fatalf("run_finished %s/%s usage %+v cost %v; want gave_up with the cut-off and restored usage %+v", fin.Status, fin.Reason, fin.Usage, fin.Cost, want)
	}
	envs, err := c.ReadEvents(ctx, res.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr := &bus.Transcript{}
	var resumed *bus.RunResumed
	for _, e := range envs {
		_ = tr.Apply(e)
		if e.Type == bus.EventRunResumed && e.Attempt == 4 {
			resumed = &bus.RunResumed{}
			if err := json.Unmarshal(e.Event, resumed); err != nil {
				t.Fatal(err)
			}
		}
	}
	if resumed == nil || resumed.MessagesRestored != 2 || resumed.CutOffUsage == nil || *resumed.CutOffUsage != cut {
		t.Fatalf("the give-up's run_resumed %+v, want 2 messages restored and cutOffUsage %+v", resumed, cut)
	}
	if got := tr.CutOffUsage(); got != cut || len(tr.Messages) != 2 {
		t.Fatalf("readers' view: cut-off usage %+v, %d messages; want %+v and 2", got, len(tr.Messages), cut)
	}
}

// The give-up's usage counts the summary calls (compaction_end's usage,
// in no message), as a resume does: it used to leave them out.
func TestGiveUpCountsSummaryCalls(t *testing.T) {
	t.Parallel()
	const id = "r1"
	call := agent.Usage{Input: 1000, Output: 100, TotalTokens: 1100, Cost: agent.Cost{Total: 0.5}}
	summary := agent.Usage{Input: 4000, Output: 500, TotalTokens: 4500, Cost: agent.Cost{Total: 2}}
	msgEnd := func(m agent.Message) bus.AgentEvent {
		return bus.AgentEvent{Type: string(agent.EventMessageEnd), Message: &m}
	}
	var envs []*bus.Envelope
	for i, ev := range []any{
		bus.RunStarted{Type: bus.EventRunStarted, Queue: "default", Worker: "gone", Attempt: 1, Tools: []string{}},
		msgEnd(agent.UserText("hi")),
		msgEnd(agent.Message{Role: agent.RoleAssistant, StopReason: agent.StopReasonStop, Content: []agent.Content{agent.Text("a")}, Usage: call}),
		msgEnd(agent.UserText("more")),
		bus.CompactionEnd{Type: bus.EventCompactionEnd, Reason: bus.CompactionManual, Summary: "s", FirstKeptIndex: 2, MessagesSummarized: 2, Usage: &summary},
	} {
		data, err := agent.MarshalJSON(ev)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(bus.Envelope{Run: id, Seq: uint64(i + 1), Attempt: 1, Worker: "gone", TS: time.Now().UnixMilli(), Event: data})
		if err != nil {
			t.Fatal(err)
		}
		env, err := bus.DecodeEnvelope(b) // as read from the stream: with its type
		if err != nil {
			t.Fatal(err)
		}
		envs = append(envs, env)
	}
	rc := workerproto.Recover(envs, time.Now().UnixMilli())
	r := &run{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cut, usage := r.gaveUpUsage(context.Background(), rc, []byte(`{"prompt":"hi"}`), false)
	want := call
	want.Add(summary)
	if usage != want || cut != (agent.Usage{}) {
		t.Fatalf("give-up usage %+v (cost %v), cut-off %+v; want the call's and the summary call's (cost %v), nothing cut off", usage, usage.Cost.Total, cut, want.Cost.Total)
	}
}
