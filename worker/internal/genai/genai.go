// Package genai is what the worker's model and tool call spans say in
// the OpenTelemetry GenAI semantic conventions (1.41): the messages'
// JSON, token usage, finish reasons, error types, and the chat span's
// time to its first chunk.
package genai

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/agentfleet/agentfleet/agent"
)

// ErrorType is error.type for err: a context's end, else "error" (its
// text may carry anything; the span status keeps it only with capture).
func ErrorType(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "error"
}

// FinishReason maps the agent's stop reasons to the conventions' values.
func FinishReason(s agent.StopReason) []string {
	switch s {
	case agent.StopReasonToolUse:
		return []string{"tool_call"}
	case "":
		return nil
	}
	return []string{string(s)}
}

// UsageAttrs appends u's token counts: input_tokens counts every input
// token, cached ones included (agent.Usage.Input leaves those out), as
// the conventions ask; the cache's share is in its own attributes.
func UsageAttrs(u agent.Usage, attrs []attribute.KeyValue) []attribute.KeyValue {
	attrs = append(attrs, semconv.GenAIUsageInputTokens(u.Input+u.CacheRead+u.CacheWrite), semconv.GenAIUsageOutputTokens(u.Output))
	if u.CacheRead > 0 {
		attrs = append(attrs, semconv.GenAIUsageCacheReadInputTokens(u.CacheRead))
	}
	if u.CacheWrite > 0 {
		attrs = append(attrs, semconv.GenAIUsageCacheCreationInputTokens(u.CacheWrite))
	}
	if u.Reasoning > 0 {
		attrs = append(attrs, semconv.GenAIUsageReasoningOutputTokens(u.Reasoning))
	}
	return attrs
}

// Message and Part are the conventions' message JSON
// (gen_ai.input.messages, gen_ai.output.messages).
type Message struct {
	Role         string `json:"role"`
	Parts        []Part `json:"parts"`
	FinishReason string `json:"finish_reason,omitempty"`
}

type Part struct {
	Type      string         `json:"type"`
	Content   string         `json:"content,omitempty"`
	ID        string         `json:"id,omitempty"`
	Name      string         `json:"name,omitempty"`
	Arguments map[string]any `json:"arguments,omitempty"`
	Response  string         `json:"response,omitempty"`
	MimeType  string         `json:"mime_type,omitempty"`
	Modality  string         `json:"modality,omitempty"`
}

// Messages is msgs as the conventions' messages; output adds their
// finish reasons.
func Messages(msgs []agent.Message, output bool) []Message {
	out := make([]Message, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		gm := Message{Role: m.Role, Parts: []Part{}}
		if m.Role == agent.RoleToolResult {
			gm.Role = "tool"
			gm.Parts = append(gm.Parts, Part{Type: "tool_call_response", ID: m.ToolCallID, Response: JoinText(m.Content)})
			out = append(out, gm)
			continue
		}
		for _, c := range m.Content {
			switch c.Type {
			case agent.ContentText:
				gm.Parts = append(gm.Parts, Part{Type: "text", Content: c.Text})
			case agent.ContentThinking:
				gm.Parts = append(gm.Parts, Part{Type: "reasoning", Content: c.Thinking})
			case agent.ContentToolCall:
				gm.Parts = append(gm.Parts, Part{Type: "tool_call", ID: c.ID, Name: c.Name, Arguments: c.Arguments})
			case agent.ContentImage:
				// The image's bytes stay out of the span.
				gm.Parts = append(gm.Parts, Part{Type: "blob", Modality: "image", MimeType: c.MimeType})
			}
		}
		if output {
			if fr := FinishReason(m.StopReason); len(fr) > 0 {
				gm.FinishReason = fr[0]
			}
		}
		out = append(out, gm)
	}
	return out
}

// ContentJSON encodes recorded content, cut at max bytes.
func ContentJSON(v any, max int) string {
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return ClipUTF8(string(b), max)
}

// JoinText is the text of cs, its other content left out.
func JoinText(cs []agent.Content) string {
	var b strings.Builder
	for _, c := range cs {
		if c.Type == agent.ContentText {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// ClipUTF8 cuts s to at most n bytes, not inside a character.
func ClipUTF8(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// chatTiming is when a model call's request went out: the chat span's
// start, moved past the waits for rate limits or budget that precede it,
// so that time_to_first_chunk_ms is the endpoint's.
type chatTiming struct{ start atomic.Int64 }

type chatTimingKey struct{}

// StartFirstChunk starts a model call's first-chunk clock in the context
// it returns; the function returned reads it.
func StartFirstChunk(ctx context.Context) (context.Context, func() time.Duration) {
	t := &chatTiming{}
	t.start.Store(time.Now().UnixNano())
	return context.WithValue(ctx, chatTimingKey{}, t), func() time.Duration {
		return time.Duration(time.Now().UnixNano() - t.start.Load())
	}
}

// RestartFirstChunk moves the first-chunk clock of the model call in ctx
// (if any) to now: a wait before the request just ended.
func RestartFirstChunk(ctx context.Context) {
	if ct, ok := ctx.Value(chatTimingKey{}).(*chatTiming); ok {
		ct.start.Store(time.Now().UnixNano())
	}
}
