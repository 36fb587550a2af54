package openai

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newServer starts an httptest server closed at the end of the test.
func newServer(t testing.TB, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// newProvider returns a provider for srv with short retry delays.
func newProvider(t testing.TB, srv *httptest.Server, edit func(*Config)) *Provider {
	t.Helper()
	cfg := Config{BaseURL: srv.URL + "/v1", HTTPClient: srv.Client(), RetryBaseDelay: 1e6} // 1ms
	if edit != nil {
		edit(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var testModel = agent.Model{ID: "test-model", API: API, Provider: "openai"}

func userContext(text string) agent.Context {
	return agent.Context{Messages: []agent.Message{agent.UserText(text)}}
}

// run collects the events of one Stream call and checks the protocol: start
// first, one final event last, and the message rebuilt from the deltas
// equal to the final message.
func run(t testing.TB, ctx context.Context, p *Provider, model agent.Model, llm agent.Context, opts agent.StreamOptions) ([]agent.StreamEvent, *agent.Message) {
	t.Helper()
	var events []agent.StreamEvent
	for ev := range p.Stream(ctx, model, llm, opts) {
		events = append(events, ev)
	}
	return events, checkProtocol(t, events)
}

func checkProtocol(t testing.TB, events []agent.StreamEvent) *agent.Message {
	t.Helper()
	if len(events) < 2 {
		t.Fatalf("got %d events, want start ... done/error", len(events))
	}
	if events[0].Type != agent.StreamStart || events[0].Message == nil || len(events[0].Message.Content) != 0 {
		t.Fatalf("first event %+v, want start with an empty header", events[0])
	}
	last := events[len(events)-1]
	if last.Type != agent.StreamDone && last.Type != agent.StreamError || last.Message == nil {
		t.Fatalf("last event %+v, want done/error with a message", last)
	}
	if last.Reason != last.Message.StopReason {
		t.Fatalf("reason %q but message stopReason %q", last.Reason, last.Message.StopReason)
	}
	if (last.Type == agent.StreamError) != (last.Message.ErrorMessage != "") {
		t.Fatalf("%s event with errorMessage %q", last.Type, last.Message.ErrorMessage)
	}
	var b agent.MessageBuilder
	b.Reset(*events[0].Message)
	ended := map[int]bool{}
	for _, ev := range events[1 : len(events)-1] {
		switch ev.Type {
		case agent.StreamStart, agent.StreamDone, agent.StreamError:
			t.Fatalf("%s event in the middle of the stream", ev.Type)
		case agent.StreamTextEnd, agent.StreamThinkingEnd, agent.StreamToolCallEnd:
			ended[ev.ContentIndex] = true
		case agent.StreamToolCallDelta:
			if ev.Arguments == nil {
				t.Fatalf("toolcall_delta without arguments")
			}
		}
		if ended[ev.ContentIndex] && !isEnd(ev.Type) {
			t.Fatalf("%s after the block %d ended", ev.Type, ev.ContentIndex)
		}
		b.Apply(&ev)
	}
	final := last.Message
	if len(ended) != len(final.Content) {
		t.Fatalf("%d blocks ended, message has %d", len(ended), len(final.Content))
	}
	if !reflect.DeepEqual(normalize(b.Message().Content), normalize(final.Content)) {
		t.Fatalf("built from events:\n%s\nfinal message:\n%s", js(b.Message().Content), js(final.Content))
	}
	return final
}

func isEnd(t agent.StreamEventType) bool {
	return t == agent.StreamTextEnd || t == agent.StreamThinkingEnd || t == agent.StreamToolCallEnd
}

func normalize(v any) any {
	var out any
	_ = json.Unmarshal([]byte(js(v)), &out)
	return out
}

func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// sse writes a streamed response of data events.
func sse(w http.ResponseWriter, chunks ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, c := range chunks {
		_, _ = w.Write([]byte("data: " + c + "\n\n"))
		w.(http.Flusher).Flush()
	}
}

func textChunk(s string) string {
	return `{"id":"c1","model":"test-model","choices":[{"index":0,"delta":{"content":` + js(s) + `},"finish_reason":null}]}`
}

const stopChunk = `{"id":"c1","model":"test-model","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`
