package workerproto

import (
	"strconv"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// MsgID is the Nats-Msg-Id of a lifecycle envelope (run_started,
// run_resumed, run_finished) or an attempt's first: "<run>:<attempt>:<seq>",
// so a second copy is dropped by the stream's duplicate window.
func MsgID(run string, attempt int, seq uint64) string {
	return MsgIDPrefix(run, attempt) + strconv.FormatUint(seq, 10)
}

// MsgIDPrefix is what the message ids of an attempt's envelopes start
// with: their seq follows.
func MsgIDPrefix(run string, attempt int) string {
	return run + ":" + strconv.Itoa(attempt) + ":"
}

// NewAgentEvent converts an agent event to its wire form. The references of
// turn_end and agent_end (MessageSeq, ToolResultSeqs, MessageSeqs) are the
// publisher's to fill in. The result shares the event's data: encode it
// before the listener returns.
func NewAgentEvent(ev *agent.Event) bus.AgentEvent {
	w := bus.AgentEvent{Type: string(ev.Type)}
	switch ev.Type {
	case agent.EventMessageStart, agent.EventMessageEnd:
		w.Message = ev.Message
	case agent.EventMessageUpdate:
		if ev.StreamEvent != nil {
			se := *ev.StreamEvent
			se.Arguments = nil // partial arguments are in the deltas
			se.Message = nil
			w.AssistantMessageEvent = &se
		}
	case agent.EventToolExecutionStart:
		w.ToolCallID, w.ToolName, w.Args = ev.ToolCallID, ev.ToolName, nonNilArgs(ev.Args)
	case agent.EventToolExecutionUpdate:
		w.ToolCallID, w.ToolName, w.Args = ev.ToolCallID, ev.ToolName, nonNilArgs(ev.Args)
		w.PartialResult = ev.Result
	case agent.EventToolExecutionEnd:
		w.ToolCallID, w.ToolName = ev.ToolCallID, ev.ToolName
		w.Result = ev.Result
		isErr := ev.IsError
		w.IsError = &isErr
	case agent.EventAgentEnd:
		n := len(ev.Messages)
		w.MessageCount = &n
	}
	return w
}

func nonNilArgs(a map[string]any) map[string]any {
	if a == nil {
		return map[string]any{}
	}
	return a
}
