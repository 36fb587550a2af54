package agent

import (
	"context"
	"iter"
	"testing"
)

// Once a message ended, the agent keeps none of its stream's buffers: a
// run waiting in a tool for hours holds only its transcript.
func TestMessageEndReleasesTheStreamBuffers(t *testing.T) {
	final := Message{Role: RoleAssistant, Content: []Content{Text("hello world")}, StopReason: StopReasonStop}
	stream := func(context.Context, Model, Context, StreamOptions) iter.Seq[StreamEvent] {
		return func(yield func(StreamEvent) bool) {
			for _, ev := range []StreamEvent{
				{Type: StreamStart, Message: &Message{Role: RoleAssistant}},
				{Type: StreamTextStart},
				{Type: StreamTextDelta, Delta: "hello "},
				{Type: StreamTextDelta, Delta: "world"},
				{Type: StreamTextEnd, Content: "hello world"},
				{Type: StreamDone, Message: &final},
			} {
				if !yield(ev) {
					return
				}
			}
		}
	}
	a := New(Options{Model: Model{ID: "m", Provider: "p"}, StreamFn: stream})
	updates := 0
	a.Subscribe(func(_ context.Context, ev Event) error {
		if ev.Type == EventMessageUpdate {
			updates++
		}
		return nil
	})
	if err := a.Prompt(context.Background(), "hi"); err != nil {
		t.Fatal(err)
	}
	if updates == 0 {
		t.Fatal("the message did not stream")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.builder.bufs != nil || a.builder.msg.Content != nil {
		t.Fatalf("the agent keeps the stream's buffers: %d buffers, %d blocks", len(a.builder.bufs), len(a.builder.msg.Content))
	}
}
