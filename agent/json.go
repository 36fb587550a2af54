package agent

import (
	"bytes"
	"encoding/json"
	"sync"
	"unicode/utf8"
)

type jsonEncoder struct {
	buf bytes.Buffer
	enc *json.Encoder
}

var jsonEncoders = sync.Pool{New: func() any {
	e := &jsonEncoder{}
	e.enc = json.NewEncoder(&e.buf)
	e.enc.SetEscapeHTML(false)
	return e
}}

// AppendJSON appends the JSON encoding of v to dst as JavaScript's
// JSON.stringify writes it: like json.Marshal, but with <, > and & as they
// are, not \u003c, \u003e, \u0026. Everything the agent writes for the wire,
// the model and the traces goes through it. (json.Marshal of a value that
// holds a Message escapes again: encode such values with AppendJSON too.)
func AppendJSON(dst []byte, v any) ([]byte, error) {
	e := jsonEncoders.Get().(*jsonEncoder)
	defer func() {
		if e.buf.Cap() <= 64<<10 { // keep no huge buffer alive
			e.buf.Reset()
			jsonEncoders.Put(e)
		}
	}()
	if err := e.enc.Encode(v); err != nil {
		return dst, err
	}
	return append(dst, bytes.TrimSuffix(e.buf.Bytes(), []byte{'\n'})...), nil
}

// MarshalJSON is AppendJSON to a new slice.
func MarshalJSON(v any) ([]byte, error) { return AppendJSON(nil, v) }

const hexDigits = "0123456789abcdef"

// AppendJSONString appends s as a JSON string, as AppendJSON writes it:
// control characters, quote and backslash escaped, invalid UTF-8 as
// U+FFFD, U+2028 and U+2029 escaped, and <, > and & as they are.
func AppendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
