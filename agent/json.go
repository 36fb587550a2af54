package agent

import (
	"bytes"
	"encoding/json"
	"sync"
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
