package openai

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestParseArguments(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{``, `{}`},
		{`   `, `{}`},
		{`{"a": 1}`, `{"a":1}`},
		{`{"a": 1`, `{"a":1}`},
		{`{"a": "hel`, `{"a":"hel"}`},
		{`{"a": "x", "b`, `{"a":"x"}`},
		{`{"a": "x", "b":`, `{"a":"x"}`},
		{`{"a": tr`, `{}`},
		{`{"a": [1, 2`, `{"a":[1,2]}`},
		{`{"a": {"b": nul`, `{"a":{}}`},
		{`{"a": {"b": null, "c": [true, fal`, `{"a":{"b":null,"c":[true]}}`},
		{"{\"code\": \"line1\nline2\"}", `{"code":"line1\nline2"}`},
		{`{"a": 1}{"a": 1}`, `{"a":1}`},
		{`"{\"a\":1}"`, `{"a":1}`},
		{`[1,2]`, `{}`},
		{`{"a": "\u00`, `{"a":""}`},
		{`{"a": "x\`, `{"a":"x"}`},
		{`{"a": -`, `{}`},
		{`{"a": 1.5e`, `{"a":1.5}`},
		{`{"e": "\ud83d\ude00"}`, `{"e":"😀"}`},
		{`{"e": "\ud83d\ude0`, `{"e":""}`},
		{`{"e": "\ud83d`, `{"e":""}`},
		{`{"q": "say \"hi\"", "n": 10`, `{"n":10,"q":"say \"hi\""}`},
		{`not json`, `{}`},
		{strings.Repeat("[", 100000), `{}`},
		{`{"a":` + strings.Repeat("[", 100000), `{}`},
	} {
		if got := js(parseArguments(tc.in)); got != tc.want {
			t.Errorf("parseArguments(%.40q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func decodeEvents(t *testing.T, r io.Reader) ([]sseEvent, error) {
	t.Helper()
	d := newSSEDecoder(r)
	var out []sseEvent
	for {
		ev, err := d.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		out = append(out, sseEvent{Name: ev.Name, Data: append([]byte(nil), ev.Data...)})
	}
}

func TestSSEDecoder(t *testing.T) {
	body := "\xEF\xBB\xBF: comment\r\n" +
		"retry: 10\n" +
		"id: 7\n" +
		"data: one\n\n" +
		"event: error\r" +
		"data:{\"x\":1}\r\r" +
		"data: multi\ndata: line\n\n" +
		"\n\n" +
		"event: ping\n\n" + // no data: not dispatched, name reset
		"data: {\"a\":1}\n" + // no blank line between events
		"data: {\"b\":2}\n" +
		"data\n\n" + // field without colon: empty data
		"data: last" // no line end at all
	want := []sseEvent{
		{Data: []byte("one")},
		{Name: "error", Data: []byte(`{"x":1}`)},
		{Data: []byte("multi\nline")},
		{Data: []byte(`{"a":1}`)},
		{Data: []byte("{\"b\":2}\n")},
		{Data: []byte("last")},
	}
	for _, r := range []func() io.Reader{
		func() io.Reader { return strings.NewReader(body) },
		func() io.Reader { return iotest.OneByteReader(strings.NewReader(body)) },
		func() io.Reader { return iotest.HalfReader(strings.NewReader(body)) },
		func() io.Reader { return iotest.DataErrReader(strings.NewReader(body)) },
	} {
		got, err := decodeEvents(t, r())
		if err != nil {
			t.Fatal(err)
		}
		if js(got) != js(want) {
			t.Errorf("events\n%s\nwant\n%s", js(got), js(want))
		}
	}
}

func TestSSEDecoderReadError(t *testing.T) {
	boom := errors.New("connection reset")
	r := io.MultiReader(strings.NewReader("data: a\n\ndata: par"), iotest.ErrReader(boom))
	got, err := decodeEvents(t, r)
	if !errors.Is(err, boom) || js(got) != js([]sseEvent{{Data: []byte("a")}, {Data: []byte("par")}}) {
		t.Fatalf("events %s, err %v", js(got), err)
	}
}

// A field of an unexpected type loses only itself: the rest of its chunk,
// and the elements next to it, still count. An empty tool call ({}) is
// not a call.
func TestChunkFieldOfAnotherType(t *testing.T) {
	body := strings.Join([]string{
		`data: {"id":7,"choices":[5,{"index":0,"delta":{"content":"a","tool_calls":"oops"}}]}`,
		`data: {"choices":[{"index":0,"delta":"oops","finish_reason":1}],"usage":{"prompt_tokens":"3","completion_tokens":[]}}`,
		`data: {"choices":{"index":0},"usage":"oops"}`,
		`data: {"choices":[{"index":0,"delta":{"content":"b","tool_calls":["x",{},{"index":0,"id":"c1","function":"oops"},{"index":0,"function":{"name":"f","arguments":"{\"k\":"}}]}}]}`,
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}],"function_call":"oops"},"finish_reason":"tool_calls"}]}`,
		`data: [1,2]`,
		`data: [DONE]`,
	}, "\n\n") + "\n\n"
	events := decodeBody(strings.NewReader(body))
	msg := checkProtocol(t, events)
	calls := msg.ToolCalls()
	if msg.TextOf() != "ab" || msg.StopReason != "toolUse" || len(calls) != 1 || calls[0].ID != "c1" || calls[0].Name != "f" ||
		js(calls[0].Arguments) != `{"k":1}` || msg.Usage.Input != 3 || msg.ResponseID != "7" {
		t.Fatalf("message %s", js(msg))
	}
}
