package faux_test

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/llm/faux"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var model = agent.Model{ID: "m", API: "faux", Provider: "faux"}

func collect(m *faux.Model, ctx context.Context) []agent.StreamEvent {
	var out []agent.StreamEvent
	for ev := range m.Stream(ctx, model, agent.Context{Messages: []agent.Message{agent.UserText("abcdefgh")}}, agent.StreamOptions{}) {
		out = append(out, ev)
	}
	return out
}

// Chunks are tokenSize*4 characters; usage is ceil(chars/4).
func TestChunksAndUsage(t *testing.T) {
	m := faux.New(faux.Options{TokenSize: 2}, faux.Response{Content: []agent.Content{agent.Text(strings.Repeat("x", 20))}})
	evs := collect(m, context.Background())
	var deltas []string
	for _, ev := range evs {
		if ev.Type == agent.StreamTextDelta {
			deltas = append(deltas, ev.Delta)
		}
	}
	if len(deltas) != 3 || len(deltas[0]) != 8 || len(deltas[2]) != 4 {
		t.Fatalf("deltas %q", deltas)
	}
	last := evs[len(evs)-1]
	if last.Type != agent.StreamDone || last.Message.Usage.Output != 5 || last.Message.Usage.Input != 2 {
		t.Fatalf("final %+v usage %+v", last.Type, last.Message.Usage)
	}
}

// An empty queue answers pi's error; a call made after an abort still uses
// up its response; Fallback answers when the queue is empty.
func TestQueueAbortAndFallback(t *testing.T) {
	m := faux.New(faux.Options{}, faux.Response{Content: []agent.Content{agent.Text("one")}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if last := collect(m, ctx); last[len(last)-1].Message.ErrorMessage != faux.AbortedText {
		t.Fatalf("aborted call: %+v", last[len(last)-1].Message)
	}
	if m.Calls() != 1 || m.Pending() != 0 {
		t.Fatalf("calls %d pending %d", m.Calls(), m.Pending())
	}
	evs := collect(m, context.Background())
	if msg := evs[len(evs)-1].Message; msg.StopReason != agent.StopReasonError || msg.ErrorMessage != faux.NoMoreText {
		t.Fatalf("empty queue: %+v", msg)
	}
	fb := faux.New(faux.Options{Fallback: func(llm agent.Context) faux.Response {
		return faux.Response{Content: []agent.Content{agent.Text("echo " + llm.Messages[0].TextOf())}}
	}})
	evs = collect(fb, context.Background())
	if got := evs[len(evs)-1].Message.TextOf(); got != "echo abcdefgh" {
		t.Fatalf("fallback: %q", got)
	}
}

// With pacing, an abort between chunks ends the message aborted with the
// text streamed so far, and no more deltas.
func TestPacedAbort(t *testing.T) {
	m := faux.New(faux.Options{TokenSize: 1, TokensPerSecond: 1000}, faux.Response{Content: []agent.Content{agent.Text(strings.Repeat("abcd", 50))}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deltas := 0
	var last agent.StreamEvent
	for ev := range m.Stream(ctx, model, agent.Context{}, agent.StreamOptions{}) {
		if ev.Type == agent.StreamTextDelta {
			deltas++
			if deltas == 3 {
				cancel()
			}
		}
		last = ev
	}
	if deltas != 3 || last.Type != agent.StreamError || last.Reason != agent.StopReasonAborted || last.Message.TextOf() != "abcdabcdabcd" {
		t.Fatalf("deltas %d, last %s %q", deltas, last.Type, last.Message.TextOf())
	}
}
