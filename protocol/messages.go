package protocol

import (
	"encoding/json"

	"github.com/agentfleet/agentfleet/agent"
)

// agent.Message and agent.Content are written by hand (agent/message_json.go:
// one flat struct, only the fields of the role or block type, with pi's
// names), so reflecting them would describe the Go struct, not the wire.
// These types are their wire forms, field for field in the marshaller's
// order and omitempty rules, for the generator to reflect; the other wire
// types are reflected as they are. TestMessageShapes marshals messages and
// blocks with every field set and checks that the keys written are exactly
// these types' properties, so the two cannot drift apart unnoticed.

// textContent is a text block.
type textContent struct {
	Type          string `json:"type"`
	Text          string `json:"text"`
	TextSignature string `json:"textSignature,omitempty"`
}

// thinkingContent is a thinking block (assistant messages only).
type thinkingContent struct {
	Type              string `json:"type"`
	Thinking          string `json:"thinking"`
	ThinkingSignature string `json:"thinkingSignature,omitempty"`
	Redacted          bool   `json:"redacted,omitempty"`
}

// imageContent is an image block.
type imageContent struct {
	Type     string `json:"type"`
	Data     string `json:"data"`
	MimeType string `json:"mimeType"`
}

// toolCallContent is a tool call (assistant messages only).
type toolCallContent struct {
	Type             string         `json:"type"`
	ID               string         `json:"id"`
	Name             string         `json:"name"`
	Arguments        map[string]any `json:"arguments"`
	ThoughtSignature string         `json:"thoughtSignature,omitempty"`
}

// userBlock and assistantBlock stand for the blocks a message of a role
// holds (the generator maps them to a oneOf of the block types).
type (
	userBlock      struct{}
	assistantBlock struct{}
)

// userMessage is a user message.
type userMessage struct {
	Role      string      `json:"role"`
	Content   []userBlock `json:"content"`
	Timestamp int64       `json:"timestamp"`
}

// assistantMessage is an assistant message.
type assistantMessage struct {
	Role          string           `json:"role"`
	Content       []assistantBlock `json:"content"`
	API           string           `json:"api"`
	Provider      string           `json:"provider"`
	Model         string           `json:"model"`
	ResponseModel string           `json:"responseModel,omitempty"`
	ResponseID    string           `json:"responseId,omitempty"`
	Usage         agent.Usage      `json:"usage"`
	StopReason    agent.StopReason `json:"stopReason"`
	ErrorMessage  string           `json:"errorMessage,omitempty"`
	Timestamp     int64            `json:"timestamp"`
}

// toolResultMessage is a tool call's result.
type toolResultMessage struct {
	Role           string          `json:"role"`
	ToolCallID     string          `json:"toolCallId"`
	ToolName       string          `json:"toolName"`
	Content        []userBlock     `json:"content"`
	Details        json.RawMessage `json:"details,omitempty"`
	AddedToolNames []string        `json:"addedToolNames,omitempty"`
	IsError        bool            `json:"isError"`
	Timestamp      int64           `json:"timestamp"`
}

// systemMessage is a system or developer message (accepted in a request's
// messages).
type systemMessage struct {
	Role      string      `json:"role"`
	Content   []userBlock `json:"content"`
	Timestamp int64       `json:"timestamp"`
}

// wireMessages holds the wire forms, for one reflection of them all.
type wireMessages struct {
	Text       textContent
	Thinking   thinkingContent
	Image      imageContent
	ToolCall   toolCallContent
	User       userMessage
	Assistant  assistantMessage
	ToolResult toolResultMessage
	System     systemMessage
}
