package openai

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/http"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
)

// bigArguments is the JSON text of tool-call arguments of about n bytes: a
// file with escaped line ends, as a model writing a file sends it.
func bigArguments(n int) string {
	var b strings.Builder
	b.WriteString(`{"path":"notes/<a&b>.txt","content":"`)
	for b.Len() < n-2 {
		b.WriteString(`line of text \"quoted\"\n`)
	}
	s := b.String()
	s = s[:n-2]
	s = strings.TrimRight(s, `\`) // never cut an escape
	return s + `"}`
}

// toolArgsBody is an SSE body that streams args in pieces of size bytes.
func toolArgsBody(args string, size int) []byte {
	var b bytes.Buffer
	b.WriteString("data: " + `{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"write","arguments":""}}]}}]}` + "\n\n")
	for rest := args; rest != ""; {
		n := min(size, len(rest))
		b.WriteString("data: " + `{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":` + js(rest[:n]) + `}}]}}]}` + "\n\n")
		rest = rest[n:]
	}
	b.WriteString("data: " + `{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}` + "\n\ndata: [DONE]\n\n")
	return b.Bytes()
}

// BenchmarkStreamedToolArguments streams large tool-call arguments in
// 20-byte deltas over real HTTP.
func BenchmarkStreamedToolArguments(b *testing.B) {
	for _, size := range []int{64 << 10, 256 << 10, 1_000_000} {
		b.Run(fmt.Sprintf("%dKB", size/1000), func(b *testing.B) {
			args := bigArguments(size)
			body := toolArgsBody(args, 20)
			srv := newServer(b, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = w.Write(body)
			})
			p := newProvider(b, srv, nil)
			b.SetBytes(int64(len(args)))
			b.ReportAllocs()
			cpu := processCPU()
			for b.Loop() {
				var last agent.StreamEvent
				for ev := range p.Stream(context.Background(), testModel, userContext("hi"), agent.StreamOptions{}) {
					last = ev
				}
				if last.Type != agent.StreamDone || len(last.Message.ToolCalls()) != 1 {
					b.Fatalf("stream ended %s: %s", last.Type, last.Message.ErrorMessage)
				}
			}
			// CPU time says more than wall time on a shared machine.
			b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the user and system time of the process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// feedBody runs an SSE body through an assembler and returns it with
// the events it produced.
func feedBody(t *testing.T, body []byte) (*assembler, []agent.StreamEvent) {
	t.Helper()
	a := newAssembler(testModel, agent.Message{Role: agent.RoleAssistant})
	dec := newSSEDecoder(bytes.NewReader(body))
	var events []agent.StreamEvent
	for !a.ended() {
		ev, err := dec.Next()
		if err != nil {
			break
		}
		a.event(ev)
		events = append(events, a.out...)
		a.out = a.out[:0]
	}
	a.closeBlocks()
	return a, append(events, a.out...)
}

// Long arguments streamed in small deltas cost work linear in their length:
// they are not parsed again from the start on every delta, and every delta
// still carries arguments at most a bounded distance behind.
func TestLongToolArgumentsParseLinearly(t *testing.T) {
	args := bigArguments(64 << 10)
	body := toolArgsBody(args, 20)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	a, events := feedBody(t, body)
	runtime.ReadMemStats(&after)

	if a.failed != "" {
		t.Fatal(a.failed)
	}
	t.Logf("parsed %d bytes (%.1fx), allocated %d bytes (%.1fx) for %d bytes of arguments",
		a.argsScanned, float64(a.argsScanned)/float64(len(args)),
		after.TotalAlloc-before.TotalAlloc, float64(after.TotalAlloc-before.TotalAlloc)/float64(len(args)), len(args))
	// Parsing from scratch on each delta scans ~1,600x the text here.
	if a.argsScanned > 32*len(args) {
		t.Errorf("parsed %d bytes for %d bytes of arguments, want at most %d", a.argsScanned, len(args), 32*len(args))
	}
	// Decoding the chunks costs a few KB each; quadratic copies of the
	// arguments would cost gigabytes.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(600*len(args)) {
		t.Errorf("allocated %d bytes for %d bytes of arguments", alloc, len(args))
	}

	streamed, parsedAt := 0, 0
	var last map[string]any
	for _, ev := range events {
		switch ev.Type {
		case agent.StreamToolCallDelta:
			streamed += len(ev.Delta)
			if ev.Arguments == nil {
				t.Fatal("toolcall_delta without arguments")
			}
			if last == nil || reflect.ValueOf(ev.Arguments).UnsafePointer() != reflect.ValueOf(last).UnsafePointer() {
				last, parsedAt = ev.Arguments, streamed
			}
			if lag := streamed - parsedAt; lag > max(reparseEvery, streamed/16)+20 {
				t.Fatalf("arguments %d bytes behind after %d bytes", lag, streamed)
			}
		case agent.StreamToolCallEnd:
			if got := js(ev.ToolCall.Arguments); got != js(parseArguments(args)) {
				t.Fatalf("final arguments differ: %.80s", got)
			}
		}
	}
	if streamed != len(args) {
		t.Fatalf("deltas carried %d bytes, want %d", streamed, len(args))
	}
}

// A model that streams more arguments than the limit ends the stream with
// an error naming the limit, in string pieces or as one object.
func TestToolArgumentsLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int
		body  []byte
	}{
		{"pieces", 1000, toolArgsBody(bigArguments(2000), 20)},
		{"object", 1000, []byte("data: " + `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"write","arguments":` + bigArguments(2000) + `}}]}}]}` + "\n\n")},
		{"default", 0, toolArgsBody(bigArguments(DefaultMaxToolArgumentBytes+1), 16<<10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = w.Write(tc.body)
			})
			p := newProvider(t, srv, func(c *Config) { c.MaxToolArgumentBytes = tc.limit })
			events, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
			limit := cmp.Or(tc.limit, DefaultMaxToolArgumentBytes)
			if events[len(events)-1].Type != agent.StreamError || msg.StopReason != agent.StopReasonError ||
				!strings.Contains(msg.ErrorMessage, fmt.Sprintf("limit of %d bytes", limit)) ||
				!strings.Contains(msg.ErrorMessage, "MaxToolArgumentBytes") {
				t.Fatalf("stream ended %s %q", msg.StopReason, msg.ErrorMessage)
			}
			for _, c := range msg.ToolCalls() {
				if n := len(js(c.Arguments)); n > 2*limit {
					t.Errorf("kept %d bytes of arguments past the limit", n)
				}
			}
		})
	}
}

// Long text and reasoning streamed in small deltas cost memory linear in
// their length: the blocks are not copied whole on each delta.
func TestLongTextAllocatesLinearly(t *testing.T) {
	text := strings.Repeat("word <&> ", 128<<10/9)
	var body bytes.Buffer
	for rest := text; rest != ""; {
		n := min(20, len(rest))
		body.WriteString("data: " + `{"choices":[{"index":0,"delta":{"reasoning_content":` + js(rest[:n]) + `,"content":` + js(rest[:n]) + `}}]}` + "\n\n")
		rest = rest[n:]
	}
	body.WriteString("data: " + stopChunk + "\n\n")

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	a, _ := feedBody(t, body.Bytes())
	runtime.ReadMemStats(&after)

	if a.msg.TextOf() != text || a.msg.ThinkingOf() != text {
		t.Fatalf("text of %d bytes, thinking of %d, want %d", len(a.msg.TextOf()), len(a.msg.ThinkingOf()), len(text))
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d bytes (%.1fx) for %d bytes of text and of thinking", alloc, float64(alloc)/float64(len(text)), len(text))
	// Decoding the chunks costs a few KB each; copying the text on each
	// delta would cost ~7,000x its length here.
	if alloc > uint64(600*len(text)) {
		t.Errorf("allocated %d bytes for %d bytes of text", alloc, len(text))
	}
}

// Arguments sent again as a whole object replace the ones before, and each
// delta carries the object it sent, however long the ones before were.
func TestToolArgumentsWholeObjects(t *testing.T) {
	long := bigArguments(8 << 10)
	second := strings.Replace(bigArguments(4<<10), "notes/", "other/", 1)
	var body bytes.Buffer
	for _, args := range []string{long, second} {
		body.WriteString("data: " + `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"write","arguments":` + args + `}}]}}]}` + "\n\n")
	}
	_, events := feedBody(t, body.Bytes())
	var deltas []string
	for _, ev := range events {
		if ev.Type == agent.StreamToolCallDelta {
			deltas = append(deltas, js(ev.Arguments))
		}
	}
	if len(deltas) != 2 || deltas[0] != js(parseArguments(long)) || deltas[1] != js(parseArguments(second)) {
		t.Fatalf("deltas carried %.200q", deltas)
	}
}
