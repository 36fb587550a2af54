// Package jsonref is the reflection-based JSON encoding of agent messages,
// as agent.Message.MarshalJSON wrote it before it was written by hand: the
// reference that the hand-written encoders are tested against, byte for
// byte. Only tests import it.
package jsonref

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// Message returns a value that agent.AppendJSON encodes as the reference
// encoding of m.
func Message(m *agent.Message) any {
	if m == nil {
		return (*message)(nil)
	}
	return (*message)(m)
}

// Content returns a value that agent.AppendJSON encodes as the reference
// encoding of c.
func Content(c agent.Content) any { return content(c) }

// AgentEvent returns a copy of w whose message, if any, encodes by the
// reference: a struct built from bus.AgentEvent's fields and tags, so the
// reference follows any change to the wire struct.
func AgentEvent(w bus.AgentEvent) any {
	src := reflect.ValueOf(w)
	msgType := reflect.TypeFor[*agent.Message]()
	fields := reflect.VisibleFields(src.Type())
	sf := make([]reflect.StructField, len(fields))
	for i, f := range fields {
		if f.Type == msgType {
			f.Type = reflect.TypeFor[*message]()
		}
		f.Index, f.Offset = nil, 0
		sf[i] = f
	}
	dst := reflect.New(reflect.StructOf(sf)).Elem()
	for i, f := range fields {
		v := src.FieldByIndex(f.Index)
		if f.Type == msgType {
			v = v.Convert(reflect.TypeFor[*message]())
		}
		dst.Field(i).Set(v)
	}
	return dst.Interface()
}

type content agent.Content

type textJSON struct {
	Type          string `json:"type"`
	Text          string `json:"text"`
	TextSignature string `json:"textSignature,omitempty"`
}

type thinkingJSON struct {
	Type              string `json:"type"`
	Thinking          string `json:"thinking"`
	ThinkingSignature string `json:"thinkingSignature,omitempty"`
	Redacted          bool   `json:"redacted,omitempty"`
}

type imageJSON struct {
	Type     string `json:"type"`
	Data     string `json:"data"`
	MimeType string `json:"mimeType"`
}

type toolCallJSON struct {
	Type             string         `json:"type"`
	ID               string         `json:"id"`
	Name             string         `json:"name"`
	Arguments        map[string]any `json:"arguments"`
	ThoughtSignature string         `json:"thoughtSignature,omitempty"`
}

func (c content) MarshalJSON() ([]byte, error) {
	switch c.Type {
	case agent.ContentText:
		return agent.MarshalJSON(textJSON{c.Type, c.Text, c.TextSignature})
	case agent.ContentThinking:
		return agent.MarshalJSON(thinkingJSON{c.Type, c.Thinking, c.ThinkingSignature, c.Redacted})
	case agent.ContentImage:
		return agent.MarshalJSON(imageJSON{c.Type, c.Data, c.MimeType})
	case agent.ContentToolCall:
		args := c.Arguments
		if args == nil {
			args = map[string]any{}
		}
		return agent.MarshalJSON(toolCallJSON{c.Type, c.ID, c.Name, args, c.ThoughtSignature})
	default:
		return nil, fmt.Errorf("agent: unknown content type %q", c.Type)
	}
}

type usage struct {
	Input       int  `json:"input"`
	Output      int  `json:"output"`
	CacheRead   int  `json:"cacheRead"`
	CacheWrite  int  `json:"cacheWrite"`
	Reasoning   int  `json:"reasoning,omitempty"`
	TotalTokens int  `json:"totalTokens"`
	Cost        cost `json:"cost"`
}

type cost struct {
	Input      float64 `json:"input"`
	Output     float64 `json:"output"`
	CacheRead  float64 `json:"cacheRead"`
	CacheWrite float64 `json:"cacheWrite"`
	Total      float64 `json:"total"`
}

type userJSON struct {
	Role      string    `json:"role"`
	Content   []content `json:"content"`
	Timestamp int64     `json:"timestamp"`
}

type assistantJSON struct {
	Role          string           `json:"role"`
	Content       []content        `json:"content"`
	API           string           `json:"api"`
	Provider      string           `json:"provider"`
	Model         string           `json:"model"`
	ResponseModel string           `json:"responseModel,omitempty"`
	ResponseID    string           `json:"responseId,omitempty"`
	Usage         usage            `json:"usage"`
	StopReason    agent.StopReason `json:"stopReason"`
	ErrorMessage  string           `json:"errorMessage,omitempty"`
	Timestamp     int64            `json:"timestamp"`
}

type toolResultJSON struct {
	Role           string          `json:"role"`
	ToolCallID     string          `json:"toolCallId"`
	ToolName       string          `json:"toolName"`
	Content        []content       `json:"content"`
	Details        json.RawMessage `json:"details,omitempty"`
	AddedToolNames []string        `json:"addedToolNames,omitempty"`
	IsError        bool            `json:"isError"`
	Timestamp      int64           `json:"timestamp"`
}

type message agent.Message

func (m message) MarshalJSON() ([]byte, error) {
	blocks := make([]content, len(m.Content)) // never nil: nil content is []
	for i, c := range m.Content {
		blocks[i] = content(c)
	}
	switch m.Role {
	case agent.RoleUser, agent.RoleSystem, agent.RoleDeveloper:
		return agent.MarshalJSON(userJSON{m.Role, blocks, m.Timestamp})
	case agent.RoleAssistant:
		u := m.Usage
		return agent.MarshalJSON(assistantJSON{m.Role, blocks, m.API, m.Provider, m.Model,
			m.ResponseModel, m.ResponseID,
			usage{u.Input, u.Output, u.CacheRead, u.CacheWrite, u.Reasoning, u.TotalTokens, cost(u.Cost)},
			m.StopReason, m.ErrorMessage, m.Timestamp})
	case agent.RoleToolResult:
		return agent.MarshalJSON(toolResultJSON{m.Role, m.ToolCallID, m.ToolName, blocks,
			m.Details, m.AddedToolNames, m.IsError, m.Timestamp})
	case "":
		return nil, errors.New("agent: message without a role")
	default:
		if m.Raw != nil {
			return m.Raw, nil
		}
		return agent.MarshalJSON(userJSON{m.Role, blocks, m.Timestamp})
	}
}
