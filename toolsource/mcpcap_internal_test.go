package toolsource

import (
	"bufio"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
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
