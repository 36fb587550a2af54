package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
)

// Messages are written without reflection: they are most of what a worker
// publishes, and encoding/json would also compact each nested MarshalJSON's
// output again. The bytes are exactly those of the struct-based encoding
// kept in internal/jsonref; the tests compare the two.

// AppendMessageJSON appends the JSON of m to dst, byte for byte what
// AppendJSON(dst, m) writes. On error dst is returned unchanged.
func AppendMessageJSON(dst []byte, m *Message) ([]byte, error) {
	if m.Role == "" || m.Raw != nil && m.IsCustom() {
		// The error, or Raw compacted and checked as encoding/json does.
		return AppendJSON(dst, m)
	}
	out, err := appendMessage(dst, m)
	if err != nil {
		// Errors are rare: the reflection path words them as before.
		return AppendJSON(dst, m)
	}
	return out, nil
}

// MarshalJSON writes the message with pi's field names for its role.
func (m Message) MarshalJSON() ([]byte, error) {
	if m.Role == "" {
		return nil, errors.New("agent: message without a role")
	}
	if m.Raw != nil && m.IsCustom() {
		return m.Raw, nil
	}
	b, err := appendMessage(make([]byte, 0, messageSizeHint(&m)), &m)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// messageSizeHint is about the size of m's JSON, to allocate it at once.
func messageSizeHint(m *Message) int {
	n := 320 + len(m.ErrorMessage) + len(m.Details)
	for i := range m.Content {
		c := &m.Content[i]
		n += 48 + len(c.Text) + len(c.TextSignature) + len(c.Thinking) + len(c.ThinkingSignature) + len(c.Data)
	}
	return n
}

// MarshalJSON writes the block with pi's field names for its type.
func (c Content) MarshalJSON() ([]byte, error) {
	b, err := appendContent(nil, &c)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// appendMessage writes a message of a standard role, or of a custom role
// without Raw (as a user message).
func appendMessage(dst []byte, m *Message) ([]byte, error) {
	var err error
	dst = append(dst, `{"role":`...)
	dst = AppendJSONString(dst, m.Role)
	switch m.Role {
	case RoleAssistant:
		if dst, err = appendContents(append(dst, `,"content":`...), m.Content); err != nil {
			return dst, err
		}
		dst = AppendJSONString(append(dst, `,"api":`...), m.API)
		dst = AppendJSONString(append(dst, `,"provider":`...), m.Provider)
		dst = AppendJSONString(append(dst, `,"model":`...), m.Model)
		dst = appendStringOmitEmpty(dst, `,"responseModel":`, m.ResponseModel)
		dst = appendStringOmitEmpty(dst, `,"responseId":`, m.ResponseID)
		if dst, err = appendUsage(append(dst, `,"usage":`...), &m.Usage); err != nil {
			return dst, err
		}
		dst = AppendJSONString(append(dst, `,"stopReason":`...), string(m.StopReason))
		dst = appendStringOmitEmpty(dst, `,"errorMessage":`, m.ErrorMessage)
	case RoleToolResult:
		dst = AppendJSONString(append(dst, `,"toolCallId":`...), m.ToolCallID)
		dst = AppendJSONString(append(dst, `,"toolName":`...), m.ToolName)
		if dst, err = appendContents(append(dst, `,"content":`...), m.Content); err != nil {
			return dst, err
		}
		if len(m.Details) > 0 {
			// Compacted and checked as encoding/json does with a RawMessage.
			if dst, err = AppendJSON(append(dst, `,"details":`...), m.Details); err != nil {
				return dst, err
			}
		}
		if len(m.AddedToolNames) > 0 {
			dst = append(dst, `,"addedToolNames":[`...)
			for i, name := range m.AddedToolNames {
				if i > 0 {
					dst = append(dst, ',')
				}
				dst = AppendJSONString(dst, name)
			}
			dst = append(dst, ']')
		}
		dst = strconv.AppendBool(append(dst, `,"isError":`...), m.IsError)
	default:
		if dst, err = appendContents(append(dst, `,"content":`...), m.Content); err != nil {
			return dst, err
		}
	}
	dst = strconv.AppendInt(append(dst, `,"timestamp":`...), m.Timestamp, 10)
	return append(dst, '}'), nil
}

// appendContents writes the blocks as an array; nil is [].
func appendContents(dst []byte, blocks []Content) ([]byte, error) {
	dst = append(dst, '[')
	for i := range blocks {
		if i > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = appendContent(dst, &blocks[i]); err != nil {
			// As encoding/json wraps an error of Content.MarshalJSON.
			return dst, &json.MarshalerError{Type: reflect.TypeFor[Content](), Err: err}
		}
	}
	return append(dst, ']'), nil
}

func appendContent(dst []byte, c *Content) ([]byte, error) {
	switch c.Type {
	case ContentText:
		dst = AppendJSONString(append(dst, `{"type":"text","text":`...), c.Text)
		dst = appendStringOmitEmpty(dst, `,"textSignature":`, c.TextSignature)
	case ContentThinking:
		dst = AppendJSONString(append(dst, `{"type":"thinking","thinking":`...), c.Thinking)
		dst = appendStringOmitEmpty(dst, `,"thinkingSignature":`, c.ThinkingSignature)
		if c.Redacted {
			dst = append(dst, `,"redacted":true`...)
		}
	case ContentImage:
		dst = AppendJSONString(append(dst, `{"type":"image","data":`...), c.Data)
		dst = AppendJSONString(append(dst, `,"mimeType":`...), c.MimeType)
	case ContentToolCall:
		dst = AppendJSONString(append(dst, `{"type":"toolCall","id":`...), c.ID)
		dst = AppendJSONString(append(dst, `,"name":`...), c.Name)
		dst = append(dst, `,"arguments":`...)
		if len(c.Arguments) == 0 {
			dst = append(dst, `{}`...) // nil too
		} else {
			var err error
			if dst, err = AppendJSON(dst, c.Arguments); err != nil {
				return dst, err
			}
		}
		dst = appendStringOmitEmpty(dst, `,"thoughtSignature":`, c.ThoughtSignature)
	default:
		return dst, fmt.Errorf("agent: unknown content type %q", c.Type)
	}
	return append(dst, '}'), nil
}

func appendUsage(dst []byte, u *Usage) ([]byte, error) {
	dst = strconv.AppendInt(append(dst, `{"input":`...), int64(u.Input), 10)
	dst = strconv.AppendInt(append(dst, `,"output":`...), int64(u.Output), 10)
	dst = strconv.AppendInt(append(dst, `,"cacheRead":`...), int64(u.CacheRead), 10)
	dst = strconv.AppendInt(append(dst, `,"cacheWrite":`...), int64(u.CacheWrite), 10)
	if u.Reasoning != 0 {
		dst = strconv.AppendInt(append(dst, `,"reasoning":`...), int64(u.Reasoning), 10)
	}
	dst = strconv.AppendInt(append(dst, `,"totalTokens":`...), int64(u.TotalTokens), 10)
	var err error
	for _, f := range [...]struct {
		key string
		v   float64
	}{
		{`,"cost":{"input":`, u.Cost.Input},
		{`,"output":`, u.Cost.Output},
		{`,"cacheRead":`, u.Cost.CacheRead},
		{`,"cacheWrite":`, u.Cost.CacheWrite},
		{`,"total":`, u.Cost.Total},
	} {
		if dst, err = appendFloat(append(dst, f.key...), f.v); err != nil {
			return dst, err
		}
	}
	return append(dst, '}', '}'), nil
}

// appendFloat writes f as encoding/json writes a float64: the shortest
// form, in exponent form only when very small or very large; NaN and
// infinities are an error.
func appendFloat(dst []byte, f float64) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return dst, &json.UnsupportedValueError{Value: reflect.ValueOf(f), Str: strconv.FormatFloat(f, 'g', -1, 64)}
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	if format == 'e' {
		// e-07 as e-7, as encoding/json (and JavaScript) write it.
		if n := len(dst); n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst, nil
}

func appendStringOmitEmpty(dst []byte, key, v string) []byte {
	if v == "" {
		return dst
	}
	return AppendJSONString(append(dst, key...), v)
}
