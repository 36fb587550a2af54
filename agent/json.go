package agent

import (
	"bytes"
	"encoding/json"
)

// AppendJSON appends the JSON encoding of v to dst as JavaScript's
// JSON.stringify writes it: like json.Marshal, but with <, > and & as they
// are, not \u003c, \u003e, \u0026. Everything the agent writes for the wire,
// the model and the traces goes through it. (json.Marshal of a value that
// holds a Message escapes again: encode such values with AppendJSON too.)
func AppendJSON(dst []byte, v any) ([]byte, error) {
	buf := bytes.NewBuffer(dst)
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return dst, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

// MarshalJSON is AppendJSON to a new slice.
func MarshalJSON(v any) ([]byte, error) { return AppendJSON(nil, v) }
