package workerproto

import (
	"strconv"
	"unicode/utf8"

	"github.com/agentfleet/agentfleet/agent"
)

// Refs are the references of turn_end and agent_end to earlier events
// (see bus.AgentEvent).
type Refs struct {
	MessageSeq     uint64
	ToolResultSeqs []uint64
	MessageSeqs    []uint64
}

// AppendAgentEvent appends the wire JSON of an agent event to dst, byte for
// byte what agent.AppendJSON of NewAgentEvent (with refs filled in) writes.
// The frequent, flat events (message_update deltas, agent_start,
// turn_start) are written without reflection or allocation; every other
// event, and any type added later, goes through agent.AppendJSON.
func AppendAgentEvent(dst []byte, ev *agent.Event, refs Refs) ([]byte, error) {
	switch ev.Type {
	case agent.EventAgentStart, agent.EventTurnStart:
		dst = append(dst, `{"type":`...)
		dst = appendString(dst, string(ev.Type))
		return append(dst, '}'), nil
	case agent.EventMessageUpdate:
		se := ev.StreamEvent
		if se == nil || se.ToolCall != nil {
			break
		}
		// Arguments and Message are not on the wire (NewAgentEvent).
		dst = append(dst, `{"type":"message_update","assistantMessageEvent":{"type":`...)
		dst = appendString(dst, string(se.Type))
		dst = append(dst, `,"contentIndex":`...)
		dst = strconv.AppendInt(dst, int64(se.ContentIndex), 10)
		dst = appendField(dst, `,"delta":`, se.Delta)
		dst = appendField(dst, `,"content":`, se.Content)
		dst = appendField(dst, `,"signature":`, se.Signature)
		dst = appendField(dst, `,"id":`, se.ID)
		dst = appendField(dst, `,"name":`, se.Name)
		dst = appendField(dst, `,"reason":`, string(se.Reason))
		return append(dst, '}', '}'), nil
	}
	w := NewAgentEvent(ev)
	w.MessageSeq, w.ToolResultSeqs, w.MessageSeqs = refs.MessageSeq, refs.ToolResultSeqs, refs.MessageSeqs
	return agent.AppendJSON(dst, w)
}

func appendField(dst []byte, key, v string) []byte {
	if v == "" {
		return dst
	}
	return appendString(append(dst, key...), v)
}

const hexDigits = "0123456789abcdef"

// appendString quotes s as encoding/json does with HTML escaping off:
// control characters, quote and backslash escaped, invalid UTF-8 as
// U+FFFD, U+2028 and U+2029 escaped.
func appendString(dst []byte, s string) []byte {
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
