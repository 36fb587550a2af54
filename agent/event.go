package agent

// EventType names an agent event.
type EventType string

const (
	EventAgentStart          EventType = "agent_start"
	EventAgentEnd            EventType = "agent_end"
	EventTurnStart           EventType = "turn_start"
	EventTurnEnd             EventType = "turn_end"
	EventMessageStart        EventType = "message_start"
	EventMessageUpdate       EventType = "message_update"
	EventMessageEnd          EventType = "message_end"
	EventToolExecutionStart  EventType = "tool_execution_start"
	EventToolExecutionUpdate EventType = "tool_execution_update"
	EventToolExecutionEnd    EventType = "tool_execution_end"
)

// Event is one agent event. Which fields are set depends on Type, as in pi:
//
//	agent_end              Messages (the messages this run added)
//	turn_end               Message (the turn's assistant message), ToolResults
//	message_start/_end     Message
//	message_update         Message (the partial assistant message), StreamEvent
//	tool_execution_start   ToolCallID, ToolName, Args
//	tool_execution_update  ToolCallID, ToolName, Args, Result (the partial result)
//	tool_execution_end     ToolCallID, ToolName, Result, IsError
//
// Messages are shared with the agent's state: read them, do not change them.
// The partial message of message_update changes after the listener returns;
// copy it (Clone) to keep it.
type Event struct {
	Type        EventType
	Message     *Message
	StreamEvent *StreamEvent
	ToolResults []Message
	Messages    []Message
	ToolCallID  string
	ToolName    string
	Args        map[string]any
	Result      *ToolResult
	IsError     bool

	streamStart bool // message_start of a streamed assistant message
}

// Clone returns a copy of the message whose content slice is its own.
func (m *Message) Clone() Message {
	c := *m
	c.Content = append([]Content(nil), m.Content...)
	return c
}
