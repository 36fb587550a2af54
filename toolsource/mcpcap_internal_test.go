package toolsource

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The line cap's reader keeps lines under the cap as they are, replaces
// an oversized reply by an error for its id wherever the id is (first, as
// Go and Python SDKs write it, or last, as the TypeScript SDK does), drops
// an oversized request or notification of the server's, and ends the
// session only for a message it cannot attribute.
func TestLineCapReader(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 200)
	in := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`,
		`{"jsonrpc":"2.0","id":2,"result":{"text":"` + big + `"}}`,
		`{"result":{"text":"` + big + `","id":99},"jsonrpc":"2.0","id":"three"}`,
		`{"method":"notifications/message","params":{"data":"` + big + `"},"jsonrpc":"2.0"}`,
		`{"jsonrpc":"2.0","id":4,"result":{}}`,
		`{"result":{"text":"` + big + `"},"jsonrpc":"2.0"}`,
		`{"jsonrpc":"2.0","id":5,"result":{}}`,
	}, "\n") + "\n"
	r := &lineCapReader{src: bufio.NewReaderSize(strings.NewReader(in), 16), max: 100, log: slog.New(slog.DiscardHandler)}
	out, err := io.ReadAll(r)
	want := `{"jsonrpc":"2.0","id":1,"result":{"content":[]}}
{"error":{"code":-32603,"message":"the server's reply of 246 bytes or more was refused: the limit is 100"},"id":2,"jsonrpc":"2.0"}
{"error":{"code":-32603,"message":"the server's reply of 260 bytes or more was refused: the limit is 100"},"id":"three","jsonrpc":"2.0"}
{"jsonrpc":"2.0","id":4,"result":{}}
`
	if string(out) != want {
		t.Errorf("read:\n%s\nwant:\n%s", out, want)
	}
	if err == nil || !strings.Contains(err.Error(), "without a reply id") {
		t.Errorf("the message without an id: %v", err)
	}
}

// The SSE cap passes events under the cap as they are; on a call's stream
// an oversized event becomes the call's error reply (also when the stream
// ends inside it), on the standalone stream it is dropped.
func TestSSECapReader(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 200)
	small := "event: message\nid: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n"
	in := small + "event: message\nid: 2\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"text\":\"" + big + "\"}}\n\n" + small +
		"data: {\"result\":\"" + big // cut off
	read := func(callID string) string {
		r := &sseCapReader{src: bufio.NewReaderSize(strings.NewReader(in), 16), body: io.NopCloser(nil), max: 100, log: slog.New(slog.DiscardHandler)}
		if callID != "" {
			r.callID = []byte(callID)
		}
		out, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	reply := func(n int) string {
		return "event: message\ndata: {\"error\":{\"code\":-32603,\"message\":\"the server's reply of " + strconv.Itoa(n) +
			" bytes or more was refused: the limit is 100\"},\"id\":7,\"jsonrpc\":\"2.0\"}\n\n"
	}
	if got, want := read("7"), small+reply(245)+small+reply(211); got != want {
		t.Errorf("a call's stream:\n%q\nwant\n%q", got, want)
	}
	if got, want := read(""), small+small; got != want {
		t.Errorf("the standalone stream:\n%q\nwant\n%q", got, want)
	}
}

// A message is a JSON value, not a line: a reply spread over many short
// lines (pretty-printed) is counted whole and, over the cap, replaced by
// its call's error; the SDK's transport with our backstop reads the error
// reply, and the session goes on with the next message.
func TestLineCapReaderCountsMessagesNotLines(t *testing.T) {
	t.Parallel()
	const max = 1 << 10
	var b strings.Builder
	b.WriteString("{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[\n")
	for i := range 20000 { // about 1 MiB, every line under 100 bytes
		if i > 0 {
			b.WriteString(",\n")
		}
		b.WriteString(`{"type":"text","text":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)
	}
	b.WriteString("\n]}}\n")
	b.WriteString("{\n  \"jsonrpc\": \"2.0\",\n  \"id\": 2,\n  \"result\": {}\n}\n")
	r := &lineCapReader{src: bufio.NewReaderSize(strings.NewReader(b.String()), 64<<10), max: max, log: slog.New(slog.DiscardHandler)}
	conn, err := (&mcp.IOTransport{Reader: io.NopCloser(r), Writer: nopWriteCloser{}, MaxLineLength: withSlack(max)}).Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msg, err := conn.Read(context.Background())
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if resp, ok := msg.(*jsonrpc.Response); !ok || resp.Error == nil || !strings.Contains(resp.Error.Error(), "the limit is 1024") {
		var n int
		if ok {
			n = len(resp.Result)
		}
		t.Errorf("a %d-byte reply over many lines with a cap of %d passed (%T, a result of %d bytes)", b.Len(), max, msg, n)
	}
	msg, err = conn.Read(context.Background())
	if resp, ok := msg.(*jsonrpc.Response); err != nil || !ok || resp.Error != nil || resp.ID.Raw() != int64(2) {
		t.Errorf("the message after it: %+v %v", msg, err)
	}
}

// Where a message ends is told by its objects and arrays, not by what its
// strings hold (braces, brackets, escaped quotes and backslashes); blank
// lines between messages, however long, are dropped; a message of exactly
// the cap passes (its line's end is not counted).
func TestLineCapReaderMessageBounds(t *testing.T) {
	t.Parallel()
	atCap := `{"jsonrpc":"2.0","id":1,"result":{"t":"`
	atCap += strings.Repeat("x", 100-len(atCap)-3) + `"}}`
	if len(atCap) != 100 {
		t.Fatal(len(atCap))
	}
	tricky := "{\"jsonrpc\":\"2.0\",\"id\":2,\n\"result\":{\"t\":\"}]{[\\\"\\\\\"\n}}"
	in := atCap + "\n\n  \n" + strings.Repeat(" ", 1000) + "\n" + tricky + "\r\n" + atCap + "\r\n"
	for _, size := range []int{16, 64 << 10} {
		r := &lineCapReader{src: bufio.NewReaderSize(strings.NewReader(in), size), max: 100, log: slog.New(slog.DiscardHandler)}
		out, err := io.ReadAll(r)
		if want := atCap + "\n" + tricky + "\r\n" + atCap + "\r\n"; string(out) != want || err != nil {
			t.Errorf("buffer %d: %v\n%q\nwant\n%q", size, err, out, want)
		}
	}
}

type nopWriteCloser struct{}

func (nopWriteCloser) Write(p []byte) (int, error) { return len(p), nil }
func (nopWriteCloser) Close() error                { return nil }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// capRoundTrip sends reqBody through a capTransport of max bytes to a
// server answering status, contentType and respBody, and returns the body
// the SDK would read.
func capRoundTrip(t *testing.T, max int, reqBody string, status int, contentType, respBody string) string {
	t.Helper()
	next := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {contentType}},
			Body: io.NopCloser(strings.NewReader(respBody))}, nil
	})
	ct := &capTransport{next: next, max: max, log: slog.New(slog.DiscardHandler)}
	req, err := http.NewRequest(http.MethodPost, "http://mcp.example/mcp", strings.NewReader(reqBody))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := ct.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return "read error: " + err.Error()
	}
	return anySize(string(got))
}

// anySize writes the size an error reply says as N (an SSE event's size
// counts its data only).
func anySize(s string) string {
	return regexp.MustCompile(`reply of [0-9]+ bytes`).ReplaceAllString(s, "reply of N bytes")
}

const capRefused = `{"error":{"code":-32603,"message":"the server's reply of N bytes or more was refused: the limit is 1024"},"id":9,"jsonrpc":"2.0"}`

// A call whose arguments are over 1 MiB keeps its id: its oversized reply
// becomes its error, as JSON and as an SSE event (not dropped, which left
// the call waiting for its timeout).
func TestCapTransportLargeArgumentsKeepTheirCallID(t *testing.T) {
	t.Parallel()
	const max = 1 << 10
	reqBody, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 9, "method": "tools/call",
		"params": map[string]any{"name": "t", "arguments": map[string]any{"s": strings.Repeat("a", 2<<20)}}})
	// As the SDK writes it: params last.
	sdkBody := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"t","arguments":{"s":"` + strings.Repeat("a", 2<<20) + `"}}}`
	// Keys in another order, the id last.
	lastBody := `{"params":{"name":"t","arguments":{"s":"` + strings.Repeat("a", 2<<20) + `","id":1,"a":[{"id":2}]}},"method":"tools/call","jsonrpc":"2.0","id":9}`
	reply := `{"jsonrpc":"2.0","id":9,"result":{"text":"` + strings.Repeat("x", 64<<10) + `"}}`
	for name, body := range map[string]string{"sorted keys": string(reqBody), "sdk order": sdkBody, "id last": lastBody} {
		if got := capRoundTrip(t, max, body, 200, "application/json", reply); got != capRefused {
			t.Errorf("%s, JSON: a reply of %d bytes: %.200s", name, len(got), got)
		}
		if got := capRoundTrip(t, max, body, 200, "text/event-stream", "event: message\ndata: "+reply+"\n\n"); got != "event: message\ndata: "+capRefused+"\n\n" {
			t.Errorf("%s, SSE: %.200q", name, got)
		}
	}
	for _, body := range []string{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, `{"jsonrpc":"2.0","id":null,"method":"x"}`,
		`{"jsonrpc":"2.0","id":3,"result":{}}`, `[{"jsonrpc":"2.0","id":3,"method":"x"}]`, `{"id":3,"method":`} {
		if id := requestCallID(strings.NewReader(body)); id != nil {
			t.Errorf("%s: call id %s, want none", body, id)
		}
	}
}

// A JSON body over the cap that answers no call (so no error reply can
// replace it) fails to read instead of being read whole.
func TestCapTransportJSONOfNoCallCapped(t *testing.T) {
	t.Parallel()
	got := capRoundTrip(t, 1<<10, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, 200, "application/json",
		`{"jsonrpc":"2.0","id":1,"result":{"text":"`+strings.Repeat("x", 64<<10)+`"}}`)
	if got != "read error: an MCP server reply of more than 1024 bytes, answering no call" {
		t.Errorf("%.200s", got)
	}
}

// An error status's body is cut at the cap (64 KiB at most): the SDK
// reads it whole for the JSON-RPC error it may hold.
func TestCapTransportErrorStatusBodyCapped(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ max, want int }{{1 << 10, 1 << 10}, {1 << 20, 64 << 10}} {
		got := capRoundTrip(t, c.max, `{"jsonrpc":"2.0","id":1,"method":"tools/call"}`, 400, "application/json", strings.Repeat("x", 1<<20))
		if len(got) != c.want {
			t.Errorf("cap %d: a 1 MiB 400 body read as %d bytes, want %d", c.max, len(got), c.want)
		}
	}
	small := `{"jsonrpc":"2.0","id":1,"error":{"code":-32600,"message":"bad"}}`
	if got := capRoundTrip(t, 1<<10, `{"jsonrpc":"2.0","id":1,"method":"tools/call"}`, 400, "application/json", small); got != small {
		t.Errorf("a small error body: %q", got)
	}
}

// The media type is read as the SDK reads it (case-insensitive, with or
// without parameters): a body the SDK takes for JSON or SSE is capped.
func TestCapTransportMediaTypeAnyCase(t *testing.T) {
	t.Parallel()
	reply := `{"jsonrpc":"2.0","id":9,"result":{"text":"` + strings.Repeat("x", 64<<10) + `"}}`
	call := `{"jsonrpc":"2.0","id":9,"method":"tools/call"}`
	for _, ct := range []string{"Application/JSON", "application/JSON; charset=utf-8", "application/json;charset=utf-8", " application/json"} {
		if got := capRoundTrip(t, 1<<10, call, 200, ct, reply); got != capRefused {
			t.Errorf("Content-Type %q: %.200s", ct, got)
		}
	}
	for _, ct := range []string{"Text/Event-Stream", "text/event-stream; charset=utf-8"} {
		if got := capRoundTrip(t, 1<<10, call, 200, ct, "data: "+reply+"\n\n"); got != "event: message\ndata: "+capRefused+"\n\n" {
			t.Errorf("Content-Type %q: %.200s", ct, got)
		}
	}
}

// While an oversized event is skipped, a data line whose newline comes as
// a piece of its own (the line an exact multiple of the read buffer) does
// not end the event: the event's next lines are skipped with it.
func TestSSECapReaderLongLineAtBufferBoundary(t *testing.T) {
	t.Parallel()
	const buf = 64 << 10
	for _, n := range []int{2, 3} {
		data := "data: " + `{"jsonrpc":"2.0","id":7,"result":{"text":"`
		data += strings.Repeat("x", n*buf-len(data)-3) + `"}}`
		if len(data) != n*buf {
			t.Fatal(len(data))
		}
		in := data + "\ndata: tail-of-same-event\n\n" + "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n"
		r := &sseCapReader{src: bufio.NewReaderSize(strings.NewReader(in), buf), body: io.NopCloser(nil), max: 1000,
			callID: []byte("7"), log: slog.New(slog.DiscardHandler)}
		out, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		want := "event: message\ndata: {\"error\":{\"code\":-32603,\"message\":\"the server's reply of " + strconv.Itoa(n*buf-len("data: ")+len("tail-of-same-event")) +
			" bytes or more was refused: the limit is 1000\"},\"id\":7,\"jsonrpc\":\"2.0\"}\n\n" +
			"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n"
		if string(out) != want {
			t.Errorf("a %d-byte line:\n%q\nwant\n%q", len(data), out, want)
		}
	}
}
