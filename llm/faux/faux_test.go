package faux_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

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
	deltas, last := streamUntilAbort(m, func(n int) bool { return n == 3 })
	if deltas != 3 || last.Type != agent.StreamError || last.Reason != agent.StopReasonAborted || last.Message.TextOf() != "abcdabcdabcd" {
		t.Fatalf("deltas %d, last %s %q", deltas, last.Type, last.Message.TextOf())
	}
}

// streamAll collects the events of one reply, failing past limit events (a
// chunk size of 0 would stream empty deltas forever).
func streamAll(t *testing.T, ctx context.Context, m *faux.Model, limit int) []agent.StreamEvent {
	t.Helper()
	var out []agent.StreamEvent
	for ev := range m.Stream(ctx, model, agent.Context{}, agent.StreamOptions{}) {
		out = append(out, ev)
		if len(out) > limit {
			t.Fatalf("more than %d events", limit)
		}
	}
	return out
}

// Any tokenSize works: too large to multiply means the whole block in one
// chunk, never an empty chunk or a panic.
func TestTokenSizeNeverOverflows(t *testing.T) {
	reply := faux.Response{Content: []agent.Content{agent.Text(strings.Repeat("x", 100)),
		agent.ToolCall("c1", "t", map[string]any{"a": strings.Repeat("y", 100)})}, StopReason: agent.StopReasonToolUse}
	for _, size := range []int{4611686018427387904, math.MaxInt, math.MaxInt / 4, math.MaxInt/4 + 1, -1, math.MinInt} {
		evs := streamAll(t, context.Background(), faux.New(faux.Options{TokenSize: size}, reply), 100)
		deltas := 0
		for _, ev := range evs {
			if ev.Type == agent.StreamTextDelta || ev.Type == agent.StreamToolCallDelta {
				deltas++
				if ev.Delta == "" {
					t.Fatalf("tokenSize %d: empty delta", size)
				}
			}
		}
		want := 2
		if size <= 0 { // the default of 4 tokens: 16 characters a chunk
			want = 7 + 7
		}
		last := evs[len(evs)-1]
		if deltas != want || last.Type != agent.StreamDone || last.Message.TextOf() != strings.Repeat("x", 100) {
			t.Fatalf("tokenSize %d: %d deltas, last %s", size, deltas, last.Type)
		}
	}
}

// Any tokensPerSecond works: huge or infinite means no delay, zero, negative
// or NaN no pacing, and a pace too slow to express waits for the abort.
func TestTokensPerSecondNeverOverflows(t *testing.T) {
	reply := faux.Response{Content: []agent.Content{agent.Text(strings.Repeat("x", 400))}}
	for _, tps := range []float64{math.MaxFloat64, math.Inf(1), 1e300, 0, -1, math.Inf(-1), math.NaN()} {
		evs := streamAll(t, context.Background(), faux.New(faux.Options{TokenSize: 1, TokensPerSecond: tps}, reply), 200)
		if last := evs[len(evs)-1]; last.Type != agent.StreamDone {
			t.Fatalf("tokensPerSecond %v: last %s", tps, last.Type)
		}
	}
	for _, tps := range []float64{1e-300, math.SmallestNonzeroFloat64} {
		ctx, cancel := context.WithCancel(context.Background())
		var evs []agent.StreamEvent
		for ev := range faux.New(faux.Options{TokenSize: 1, TokensPerSecond: tps}, reply).Stream(ctx, model, agent.Context{}, agent.StreamOptions{}) {
			evs = append(evs, ev)
			if ev.Type == agent.StreamTextStart {
				cancel() // the first chunk's wait must end with the abort
			}
		}
		cancel()
		if last := evs[len(evs)-1]; last.Type != agent.StreamError || last.Reason != agent.StopReasonAborted || len(evs) != 3 {
			t.Fatalf("tokensPerSecond %v: %d events, last %s", tps, len(evs), last.Type)
		}
	}
}

// Chunks count characters as the reference does (UTF-16 units) and never
// split one: every delta is valid UTF-8 and the deltas rebuild the text.
func TestChunksNeverSplitACharacter(t *testing.T) {
	text := "1×2=2 ×😀😀 é" + strings.Repeat("ü", 9)
	m := faux.New(faux.Options{TokenSize: 1}, faux.Response{Content: []agent.Content{agent.Text(text)}})
	var deltas []string
	for _, ev := range collect(m, context.Background()) {
		if ev.Type == agent.StreamTextDelta {
			if !utf8.ValidString(ev.Delta) {
				t.Fatalf("delta %q is not valid UTF-8", ev.Delta)
			}
			deltas = append(deltas, ev.Delta)
		}
	}
	if got := strings.Join(deltas, ""); got != text {
		t.Fatalf("deltas %q rebuild %q", deltas, got)
	}
	if deltas[0] != "1×2=" || deltas[1] != "2 ×😀" || deltas[2] != "😀 é" {
		t.Fatalf("chunks of 4 UTF-16 units: %q", deltas)
	}
}

// The reference's producer pushes a chunk without waiting for its consumer
// and sleeps from there: handling a chunk overlaps the pause before the
// next one (an interval of max(pause, handling)), it does not add to it.
// Virtual time (synctest) makes the timings exact.
func TestPaceCountsFromThePush(t *testing.T) {
	for _, tc := range []struct {
		name     string
		handling time.Duration
		want     time.Duration
	}{
		// 5 deltas 100 ms apart; the last one's handling ends the stream.
		{"handling shorter than the pause", 30 * time.Millisecond, 500*time.Millisecond + 30*time.Millisecond},
		{"handling longer than the pause", 150 * time.Millisecond, 100*time.Millisecond + 5*150*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := faux.New(faux.Options{TokenSize: 1, TokensPerSecond: 10}, faux.Response{Content: []agent.Content{agent.Text(strings.Repeat("abcd", 5))}})
				start := time.Now()
				deltas := 0
				for ev := range m.Stream(context.Background(), model, agent.Context{}, agent.StreamOptions{}) {
					if ev.Type == agent.StreamTextDelta {
						deltas++
						time.Sleep(tc.handling)
					}
				}
				if got := time.Since(start); deltas != 5 || got != tc.want {
					t.Fatalf("%d deltas in %v, want 5 in %v", deltas, got, tc.want)
				}
			})
		})
	}
}

// The reference pushes a block's end and the next block's start with the
// delta before them, and the stream's start with the first block's start:
// the pause counts from there, and handling all of them overlaps it. A
// fixed pace counts from the stream's start too, across blocks.
func TestPaceCountsFromTheDeltaAcrossBlocks(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		t.Run(fmt.Sprintf("fixed=%v", fixed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := faux.New(faux.Options{TokenSize: 1, TokensPerSecond: 10, FixedPace: fixed}, faux.Response{Content: []agent.Content{agent.Text("abcd"), agent.Text("efgh")}})
				start := time.Now()
				var at []time.Duration
				for ev := range m.Stream(context.Background(), model, agent.Context{}, agent.StreamOptions{}) {
					if ev.Type == agent.StreamTextDelta {
						at = append(at, time.Since(start))
					}
					time.Sleep(30 * time.Millisecond) // every event takes this long to handle
				}
				// start, text_start, delta (100), text_end, text_start, delta
				// (200), text_end, done: 290 ms.
				want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}
				if got := time.Since(start); !slices.Equal(at, want) || got != 290*time.Millisecond {
					t.Fatalf("deltas at %v, done at %v; want %v, 290ms", at, got, want)
				}
			})
		})
	}
}

// FixedPace puts chunk k at k pauses after the stream's start: one late
// chunk is followed by the next at once until the stream is back on time,
// where pi's pacing carries the lateness to every later chunk.
func TestFixedPaceMakesUpLateness(t *testing.T) {
	for _, tc := range []struct {
		fixed bool
		want  []int64 // when each of 5 deltas came, in ms
	}{
		{true, []int64{100, 350, 350, 400, 500}},
		{false, []int64{100, 350, 450, 550, 650}},
	} {
		t.Run(fmt.Sprintf("fixed=%v", tc.fixed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := faux.New(faux.Options{TokenSize: 1, TokensPerSecond: 10, FixedPace: tc.fixed}, faux.Response{Content: []agent.Content{agent.Text(strings.Repeat("abcd", 5))}})
				start := time.Now()
				var at []int64
				for ev := range m.Stream(context.Background(), model, agent.Context{}, agent.StreamOptions{}) {
					if ev.Type == agent.StreamTextDelta {
						at = append(at, time.Since(start).Milliseconds())
						if len(at) == 1 {
							time.Sleep(250 * time.Millisecond) // one slow hand-over
						}
					}
				}
				if !slices.Equal(at, tc.want) {
					t.Fatalf("deltas at %v ms, want %v", at, tc.want)
				}
			})
		})
	}
}

// An abort while the stream is behind its fixed pace ends it at the next
// chunk, which is overdue and so not waited for.
func TestFixedPaceAbortWhileBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := faux.New(faux.Options{TokenSize: 1, TokensPerSecond: 10, FixedPace: true}, faux.Response{Content: []agent.Content{agent.Text(strings.Repeat("abcd", 5))}})
		deltas, last := streamUntilAbort(m, func(int) bool {
			time.Sleep(350 * time.Millisecond) // three chunks behind
			return true
		})
		if deltas != 1 || last.Type != agent.StreamError || last.Reason != agent.StopReasonAborted {
			t.Fatalf("%d deltas, last %s %s", deltas, last.Type, last.Reason)
		}
	})
}

// streamUntilAbort streams one reply, cancelling it once abortAt says so
// after the n-th delta; it returns the deltas seen and the last event.
func streamUntilAbort(m *faux.Model, abortAt func(n int) bool) (int, agent.StreamEvent) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deltas := 0
	var last agent.StreamEvent
	for ev := range m.Stream(ctx, model, agent.Context{}, agent.StreamOptions{}) {
		if ev.Type == agent.StreamTextDelta {
			deltas++
			if abortAt(deltas) {
				cancel()
			}
		}
		last = ev
	}
	return deltas, last
}
