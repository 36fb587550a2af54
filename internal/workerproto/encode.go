package workerproto

import (
	"strconv"

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
// The frequent events (message_update deltas, agent_start, turn_start,
// message_start, message_end, turn_end, agent_end) are written without
// reflection; every other event, and any type added later, goes through
// agent.AppendJSON. On error dst is returned unchanged.
func AppendAgentEvent(dst []byte, ev *agent.Event, refs Refs) ([]byte, error) {
	var messageCount *int
	out := dst
	switch ev.Type {
	case agent.EventAgentStart, agent.EventTurnStart, agent.EventTurnEnd:
		out = agent.AppendJSONString(append(out, `{"type":`...), string(ev.Type))
	case agent.EventAgentEnd:
		out = agent.AppendJSONString(append(out, `{"type":`...), string(ev.Type))
		n := len(ev.Messages)
		messageCount = &n
	case agent.EventMessageStart, agent.EventMessageEnd:
		out = agent.AppendJSONString(append(out, `{"type":`...), string(ev.Type))
		if ev.Message != nil {
			var err error
			if out, err = agent.AppendMessageJSON(append(out, `,"message":`...), ev.Message); err != nil {
				return dst, err
			}
		}
	case agent.EventMessageUpdate:
		se := ev.StreamEvent
		if se == nil || se.ToolCall != nil {
			return appendByReflection(dst, ev, refs)
		}
		// Arguments and Message are not on the wire (NewAgentEvent).
		out = append(out, `{"type":"message_update","assistantMessageEvent":{"type":`...)
		out = agent.AppendJSONString(out, string(se.Type))
		out = append(out, `,"contentIndex":`...)
		out = strconv.AppendInt(out, int64(se.ContentIndex), 10)
		out = appendField(out, `,"delta":`, se.Delta)
		out = appendField(out, `,"content":`, se.Content)
		out = appendField(out, `,"signature":`, se.Signature)
		out = appendField(out, `,"id":`, se.ID)
		out = appendField(out, `,"name":`, se.Name)
		out = appendField(out, `,"reason":`, string(se.Reason))
		out = append(out, '}')
	default:
		return appendByReflection(dst, ev, refs)
	}
	// The tail of bus.AgentEvent, in its field order and omitempty rules.
	if refs.MessageSeq != 0 {
		out = strconv.AppendUint(append(out, `,"messageSeq":`...), refs.MessageSeq, 10)
	}
	out = appendSeqs(out, `,"toolResultSeqs":`, refs.ToolResultSeqs)
	if messageCount != nil {
		out = strconv.AppendInt(append(out, `,"messageCount":`...), int64(*messageCount), 10)
	}
	out = appendSeqs(out, `,"messageSeqs":`, refs.MessageSeqs)
	return append(out, '}'), nil
}

func appendByReflection(dst []byte, ev *agent.Event, refs Refs) ([]byte, error) {
	w := NewAgentEvent(ev)
	w.MessageSeq, w.ToolResultSeqs, w.MessageSeqs = refs.MessageSeq, refs.ToolResultSeqs, refs.MessageSeqs
	return agent.AppendJSON(dst, w)
}

func appendSeqs(dst []byte, key string, seqs []uint64) []byte {
	if len(seqs) == 0 {
		return dst
	}
	dst = append(dst, key...)
	for i, s := range seqs {
		if i == 0 {
			dst = append(dst, '[')
		} else {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, s, 10)
	}
	return append(dst, ']')
}

func appendField(dst []byte, key, v string) []byte {
	if v == "" {
		return dst
	}
	return agent.AppendJSONString(append(dst, key...), v)
}
