package toolsource

import (
	"bufio"
	"context"
	"io"
	"log/slog"
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
// lines between messages are dropped; a message of exactly the cap passes
// (its line's end is not counted).
func TestLineCapReaderMessageBounds(t *testing.T) {
	atCap := `{"jsonrpc":"2.0","id":1,"result":{"t":"`
	atCap += strings.Repeat("x", 100-len(atCap)-3) + `"}}`
	if len(atCap) != 100 {
		t.Fatal(len(atCap))
	}
	tricky := "{\"jsonrpc\":\"2.0\",\"id\":2,\n\"result\":{\"t\":\"}]{[\\\"\\\\\"\n}}"
	in := atCap + "\n\n  \n" + tricky + "\r\n" + atCap + "\r\n"
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
