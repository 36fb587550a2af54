package openai

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"reflect"
	"testing"
	"testing/iotest"

	"github.com/agentfleet/agentfleet/agent"
)

// decodeBody runs a response body through the stream function's reading
// path (sniffing, SSE decoder, assembler, final event) without HTTP.
func decodeBody(body io.Reader) []agent.StreamEvent {
	return decodeBodyLimit(body, DefaultMaxToolArgumentBytes)
}

// decodeBodyLimit is decodeBody with a limit on a call's argument bytes.
func decodeBodyLimit(body io.Reader, maxArgs int) []agent.StreamEvent {
	header := agent.Message{Role: agent.RoleAssistant, API: API, Provider: "openai", Model: testModel.ID, StopReason: agent.StopReasonStop}
	hdr := header
	events := []agent.StreamEvent{{Type: agent.StreamStart, Message: &hdr}}
	c := &call{
		ctx:   context.Background(),
		yield: func(ev agent.StreamEvent) bool { events = append(events, ev); return true },
		a:     newAssembler(testModel, header),
	}
	c.a.maxArgs = maxArgs
	resp := &http.Response{Status: "200 OK", StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(body)}
	if err, ok := c.read(resp); ok {
		c.end(err)
	}
	return events
}

// FuzzDecoder feeds arbitrary bodies to the decoder: it must never panic,
// must keep the stream protocol, and must build the same message however
// the bytes are split.
func FuzzDecoder(f *testing.F) {
	for _, fx := range fixtures(f) {
		f.Add(fx.body)
	}
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"{\\\"a\\\": [1, {\\\"b\\\": \\\"x\"}}]}}]}\r\n\r\n"))
	f.Add([]byte("\xEF\xBB\xBFevent: error\rdata: {\"error\":\"bad\"}\r\r"))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"},\"finish_reason\":\"stop\"}]}\n"))
	f.Add([]byte(`{"choices":[{"message":{"content":[{"type":"thinking","thinking":"t"},{"type":"text","text":"x"}]},"finish_reason":"length"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		whole := decodeBody(bytes.NewReader(body))
		final := checkProtocol(t, whole)
		split := decodeBody(iotest.OneByteReader(bytes.NewReader(body)))
		if got := split[len(split)-1].Message; !reflect.DeepEqual(normalize(got), normalize(final)) {
			t.Fatalf("split reads differ:\n%s\n%s", js(got), js(final))
		}
		// With a small limit on arguments: the same protocol, the same
		// message however split, and an error that names the limit.
		const limit = 16
		capped := decodeBodyLimit(bytes.NewReader(body), limit)
		cappedFinal := checkProtocol(t, capped)
		cappedSplit := decodeBodyLimit(iotest.OneByteReader(bytes.NewReader(body)), limit)
		if got := cappedSplit[len(cappedSplit)-1].Message; !reflect.DeepEqual(normalize(got), normalize(cappedFinal)) {
			t.Fatalf("split reads differ with a limit:\n%s\n%s", js(got), js(cappedFinal))
		}
		for _, ev := range capped {
			if ev.Type == agent.StreamToolCallDelta && len(ev.Delta) > limit {
				t.Fatalf("a delta of %d argument bytes past the limit of %d", len(ev.Delta), limit)
			}
		}
		for _, call := range cappedFinal.ToolCalls() {
			// At most limit bytes parsed; escaping a control character
			// takes six.
			if n := len(js(call.Arguments)); n > 6*limit+8 {
				t.Fatalf("arguments of %d bytes kept past the limit: %s", n, js(call.Arguments))
			}
		}
	})
}
