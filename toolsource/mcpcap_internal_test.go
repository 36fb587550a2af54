package toolsource

import (
	"bufio"
	"io"
	"log/slog"
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
