package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Roles of the messages the agent core knows. Any other role is a custom
// message: it travels through the loop and the transcript, and the default
// ConvertToLLM drops it.
const (
	RoleUser       = "user"
	RoleAssistant  = "assistant"
	RoleToolResult = "toolResult"
	RoleSystem     = "system"
	RoleDeveloper  = "developer"
)

// Content block types.
const (
	ContentText     = "text"
	ContentImage    = "image"
	ContentThinking = "thinking"
	ContentToolCall = "toolCall"
)

// StopReason says why an assistant message ended.
type StopReason string

const (
	StopReasonStop    StopReason = "stop"
	StopReasonLength  StopReason = "length"
	StopReasonToolUse StopReason = "toolUse"
	StopReasonError   StopReason = "error"
	StopReasonAborted StopReason = "aborted"
)

// ScriptedResponse is one reply of a scripted model: the llm/faux model and
// the "faux" script of a run request share it, so a script is passed on
// as it was decoded.
type ScriptedResponse struct {
	Content      []Content  `json:"content"`
	StopReason   StopReason `json:"stopReason,omitempty"`
	ErrorMessage string     `json:"errorMessage,omitempty"`
}

// Content is one block of a message. It is a tagged union on Type, kept as one
// flat struct so transcripts are plain values without interface boxing; only
// the fields of its type are set and serialised.
type Content struct {
	Type string

	// text
	Text          string
	TextSignature string

	// thinking
	Thinking          string
	ThinkingSignature string // for chat completions: the name of the delta field it came from
	Redacted          bool

	// image
	Data     string // base64
	MimeType string

	// toolCall
	ID               string
	Name             string
	Arguments        map[string]any
	ThoughtSignature string
}

// Text returns a text block.
func Text(s string) Content { return Content{Type: ContentText, Text: s} }

// Image returns an image block from base64 data.
func Image(data, mimeType string) Content {
	return Content{Type: ContentImage, Data: data, MimeType: mimeType}
}

// ToolCall returns a tool-call block.
func ToolCall(id, name string, args map[string]any) Content {
	return Content{Type: ContentToolCall, ID: id, Name: name, Arguments: args}
}

// UnmarshalJSON reads a block written by pi or by MarshalJSON.
func (c *Content) UnmarshalJSON(b []byte) error {
	var raw struct {
		Type              string         `json:"type"`
		Text              string         `json:"text"`
		TextSignature     string         `json:"textSignature"`
		Thinking          string         `json:"thinking"`
		ThinkingSignature string         `json:"thinkingSignature"`
		Redacted          bool           `json:"redacted"`
		Data              string         `json:"data"`
		MimeType          string         `json:"mimeType"`
		ID                string         `json:"id"`
		Name              string         `json:"name"`
		Arguments         map[string]any `json:"arguments"`
		ThoughtSignature  string         `json:"thoughtSignature"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	switch raw.Type {
	case ContentText, ContentThinking, ContentImage, ContentToolCall:
	default:
		return fmt.Errorf("agent: unknown content type %q", raw.Type)
	}
	*c = Content(raw)
	if c.Type == ContentToolCall && c.Arguments == nil {
		c.Arguments = map[string]any{}
	}
	return nil
}

// Cost is a usage's price in dollars.
type Cost struct {
	Input      float64 `json:"input"`
	Output     float64 `json:"output"`
	CacheRead  float64 `json:"cacheRead"`
	CacheWrite float64 `json:"cacheWrite"`
	Total      float64 `json:"total"`
}

// Usage counts the tokens of one model call. Input excludes cached tokens;
// Output includes reasoning tokens, of which Reasoning is the share.
type Usage struct {
	Input       int  `json:"input"`
	Output      int  `json:"output"`
	CacheRead   int  `json:"cacheRead"`
	CacheWrite  int  `json:"cacheWrite"`
	Reasoning   int  `json:"reasoning,omitempty"`
	TotalTokens int  `json:"totalTokens"`
	Cost        Cost `json:"cost"`
}

// Add accumulates u2 into u.
func (u *Usage) Add(u2 Usage) {
	u.Input += u2.Input
	u.Output += u2.Output
	u.CacheRead += u2.CacheRead
	u.CacheWrite += u2.CacheWrite
	u.Reasoning += u2.Reasoning
	u.TotalTokens += u2.TotalTokens
	u.Cost.Input += u2.Cost.Input
	u.Cost.Output += u2.Cost.Output
	u.Cost.CacheRead += u2.Cost.CacheRead
	u.Cost.CacheWrite += u2.Cost.CacheWrite
	u.Cost.Total += u2.Cost.Total
}

// Message is one entry of a transcript: a user, assistant or toolResult
// message, a system/developer message, or a custom message of any other role.
// Like Content it is one flat struct; the fields of its role are serialised
// with pi's names. Messages are values; treat a Message that the agent handed
// you as read-only (its slices are shared with the transcript).
type Message struct {
	Role      string
	Content   []Content
	Timestamp int64 // Unix milliseconds

	// assistant
	API           string
	Provider      string
	Model         string
	ResponseModel string
	ResponseID    string
	Usage         Usage
	StopReason    StopReason
	ErrorMessage  string

	// toolResult
	ToolCallID     string
	ToolName       string
	Details        json.RawMessage
	AddedToolNames []string
	IsError        bool

	// Raw keeps every field of a custom-role message, so it round-trips
	// unchanged; for the standard roles it is nil.
	Raw json.RawMessage

	// Tag is the embedder's own mark on a message it gives the agent
	// (Prompt, Steer, FollowUp): the agent keeps it on the message in the
	// events and state it emits, and means nothing by it. It is never
	// serialised.
	Tag uint64 `json:"-"`
}

// UserText returns a user message with one text block, stamped now.
func UserText(text string, images ...Content) Message {
	content := make([]Content, 0, 1+len(images))
	content = append(content, Text(text))
	content = append(content, images...)
	return Message{Role: RoleUser, Content: content, Timestamp: nowMillis()}
}

// TextOf joins the text blocks of the message with no separator.
func (m *Message) TextOf() string {
	return joinText(m.Content, "")
}

// ThinkingOf joins the thinking blocks of the message.
func (m *Message) ThinkingOf() string {
	var s string
	for _, c := range m.Content {
		if c.Type == ContentThinking {
			s += c.Thinking
		}
	}
	return s
}

// ToolCalls returns the tool-call blocks of the message in source order.
func (m *Message) ToolCalls() []Content {
	var calls []Content
	for _, c := range m.Content {
		if c.Type == ContentToolCall {
			calls = append(calls, c)
		}
	}
	return calls
}

// IsCustom reports whether the message has a role the core does not know.
func (m *Message) IsCustom() bool {
	switch m.Role {
	case RoleUser, RoleAssistant, RoleToolResult, RoleSystem, RoleDeveloper:
		return false
	}
	return true
}

func joinText(blocks []Content, sep string) string {
	n := 0
	var only string
	for _, c := range blocks {
		if c.Type == ContentText {
			n++
			only = c.Text
		}
	}
	if n <= 1 {
		return only
	}
	var b bytes.Buffer
	first := true
	for _, c := range blocks {
		if c.Type != ContentText {
			continue
		}
		if !first {
			b.WriteString(sep)
		}
		first = false
		b.WriteString(c.Text)
	}
	return b.String()
}

type assistantJSON struct {
	Role          string     `json:"role"`
	Content       []Content  `json:"content"`
	API           string     `json:"api"`
	Provider      string     `json:"provider"`
	Model         string     `json:"model"`
	ResponseModel string     `json:"responseModel,omitempty"`
	ResponseID    string     `json:"responseId,omitempty"`
	Usage         Usage      `json:"usage"`
	StopReason    StopReason `json:"stopReason"`
	ErrorMessage  string     `json:"errorMessage,omitempty"`
	Timestamp     int64      `json:"timestamp"`
}

type toolResultJSON struct {
	Role           string          `json:"role"`
	ToolCallID     string          `json:"toolCallId"`
	ToolName       string          `json:"toolName"`
	Content        []Content       `json:"content"`
	Details        json.RawMessage `json:"details,omitempty"`
	AddedToolNames []string        `json:"addedToolNames,omitempty"`
	IsError        bool            `json:"isError"`
	Timestamp      int64           `json:"timestamp"`
}

// UnmarshalJSON reads a pi message. A user (or system) message's content may
// be a string, as pi allows; it becomes one text block.
func (m *Message) UnmarshalJSON(b []byte) error {
	var head struct {
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		Timestamp float64         `json:"timestamp"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return err
	}
	if head.Role == "" {
		return errors.New("agent: message without a role")
	}
	*m = Message{Role: head.Role, Timestamp: int64(head.Timestamp)}
	if m.IsCustom() {
		m.Raw = append(json.RawMessage(nil), b...)
		// Custom messages may carry pi-style content; keep it when it parses.
		m.Content, _ = decodeContent(head.Content)
		return nil
	}
	content, err := decodeContent(head.Content)
	if err != nil {
		return fmt.Errorf("agent: %s message content: %w", head.Role, err)
	}
	m.Content = content
	switch m.Role {
	case RoleAssistant:
		var a assistantJSON
		if err := json.Unmarshal(b, &struct {
			*assistantJSON
			Content   json.RawMessage `json:"content"`
			Timestamp float64         `json:"timestamp"`
		}{assistantJSON: &a}); err != nil {
			return err
		}
		m.API, m.Provider, m.Model = a.API, a.Provider, a.Model
		m.ResponseModel, m.ResponseID = a.ResponseModel, a.ResponseID
		m.Usage, m.StopReason, m.ErrorMessage = a.Usage, a.StopReason, a.ErrorMessage
	case RoleToolResult:
		var t toolResultJSON
		if err := json.Unmarshal(b, &struct {
			*toolResultJSON
			Content   json.RawMessage `json:"content"`
			Timestamp float64         `json:"timestamp"`
		}{toolResultJSON: &t}); err != nil {
			return err
		}
		m.ToolCallID, m.ToolName, m.Details = t.ToolCallID, t.ToolName, t.Details
		m.AddedToolNames, m.IsError = t.AddedToolNames, t.IsError
	}
	return nil
}

func decodeContent(raw json.RawMessage) ([]Content, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []Content{Text(s)}, nil
	}
	var blocks []Content
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, err
	}
	return blocks, nil
}
