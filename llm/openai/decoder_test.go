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
