package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/agentfleet/agentfleet/agent"
	goopenai "github.com/sashabaranov/go-openai"
)

// Texts pi puts in place of what a request cannot carry.
const (
	imageOmitted      = "(image omitted: model does not support images)"
	toolImageOmitted  = "(tool image omitted: model does not support images)"
	noToolOutput      = "(no tool output)"
	seeAttachedImage  = "(see attached image)"
	attachedImages    = "Attached image(s) from tool result:"
	noResultProvided  = "No result provided"
	maxDefaultTokens  = 32000
	maxToolCallIDSize = 40
)

// reasoningFields are the delta fields a thinking block can be sent back in
// as a string; the signature of a thinking block names its field.
var reasoningFields = []string{"reasoning_content", "reasoning", "reasoning_text"}

// requestBody builds the JSON body of a streamed chat completion. The
// messages and tools are go-openai's types; the fields it cannot express or
// drops (temperature 0, reasoning fields, prompt_cache_key, the max tokens
// field of our choice) are set on the marshalled object.
func (p *Provider) requestBody(model agent.Model, llm agent.Context, opts agent.StreamOptions) ([]byte, error) {
	info := p.info(model)
	input := model.Input
	if len(input) == 0 {
		input = info.Input
	}
	images := slices.Contains(input, "image")

	msgs, err := convertMessages(llm, model, images)
	if err != nil {
		return nil, err
	}
	req := goopenai.ChatCompletionRequest{
		Model:         model.ID,
		Stream:        true,
		StreamOptions: &goopenai.StreamOptions{IncludeUsage: true},
	}
	for _, t := range llm.Tools {
		if t == nil {
			continue
		}
		req.Tools = append(req.Tools, goopenai.Tool{Type: goopenai.ToolTypeFunction, Function: &goopenai.FunctionDefinition{
			Name: t.Name, Description: t.Description, Parameters: t.ParametersOrDefault(),
		}})
	}
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encoding request: %w", err)
	}
	body := map[string]any{}
	if err := json.Unmarshal(raw, &body); err != nil {
		return nil, fmt.Errorf("encoding request: %w", err)
	}
	body["messages"] = msgs

	if opts.Temperature != nil {
		body["temperature"] = *opts.Temperature // go-openai drops 0
	}
	maxTokens := opts.MaxTokens
	if maxTokens <= 0 && model.MaxTokens > 0 {
		maxTokens = min(model.MaxTokens, maxDefaultTokens)
	}
	if maxTokens > 0 {
		field := info.MaxTokensField
		if field == "" {
			field = "max_tokens"
			if p.isOpenAI {
				field = "max_completion_tokens"
			}
		}
		body[field] = maxTokens
	}
	if model.Reasoning || info.Reasoning {
		setReasoning(body, info, opts.Reasoning)
	}
	if opts.SessionID != "" && (p.cfg.PromptCacheKey == nil && p.isOpenAI || p.cfg.PromptCacheKey != nil && *p.cfg.PromptCacheKey) {
		body["prompt_cache_key"] = opts.SessionID
	}
	out, err := marshalJSON(body)
	if err != nil {
		return nil, fmt.Errorf("encoding request: %w", err)
	}
	return out, nil
}

// setReasoning asks for the thinking level in the model's format.
func setReasoning(body map[string]any, info ModelInfo, level agent.ThinkingLevel) {
	on := level != "" && level != agent.ThinkingOff
	effort := ""
	if on {
		var mapped bool
		if effort, mapped = info.ThinkingLevelMap[string(level)]; !mapped {
			switch level {
			case agent.ThinkingXHigh, agent.ThinkingMax:
				effort = goopenai.ReasoningEffortHigh
			default:
				effort = string(level)
			}
		}
	}
	switch info.ThinkingFormat {
	case "", "openai":
		if effort != "" {
			body["reasoning_effort"] = effort
		}
	case "openrouter":
		if effort != "" {
			body["reasoning"] = map[string]any{"effort": effort}
		}
	case "chat-template":
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": on && effort != ""}
	}
}

// convertMessages turns the context into chat messages (pi's
// convertMessages after transformMessages).
func convertMessages(llm agent.Context, model agent.Model, images bool) ([]json.RawMessage, error) {
	var out []json.RawMessage
	add := func(m goopenai.ChatCompletionMessage, extra map[string]any) error {
		raw, err := marshalJSON(m)
		if err != nil {
			return fmt.Errorf("encoding %s message: %w", m.Role, err)
		}
		if len(extra) > 0 {
			obj := map[string]any{}
			if err := json.Unmarshal(raw, &obj); err != nil {
				return err
			}
			for k, v := range extra {
				obj[k] = v
			}
			if raw, err = marshalJSON(obj); err != nil {
				return err
			}
		}
		out = append(out, raw)
		return nil
	}
	if llm.SystemPrompt != "" {
		if err := add(goopenai.ChatCompletionMessage{Role: goopenai.ChatMessageRoleSystem, Content: llm.SystemPrompt}, nil); err != nil {
			return nil, err
		}
	}
	msgs := transformMessages(llm.Messages, model, images)
	var toolImages []goopenai.ChatMessagePart
	flushImages := func() error {
		if len(toolImages) == 0 {
			return nil
		}
		parts := append([]goopenai.ChatMessagePart{{Type: goopenai.ChatMessagePartTypeText, Text: attachedImages}}, toolImages...)
		toolImages = nil
		return add(goopenai.ChatCompletionMessage{Role: goopenai.ChatMessageRoleUser, MultiContent: parts}, nil)
	}
	for i := range msgs {
		m := &msgs[i]
		if m.Role != agent.RoleToolResult {
			if err := flushImages(); err != nil {
				return nil, err
			}
		}
		var err error
		switch m.Role {
		case agent.RoleUser:
			if cm, ok := userMessage(m.Content); ok {
				err = add(cm, nil)
			}
		case agent.RoleSystem, agent.RoleDeveloper:
			if text := joinTexts(m.Content, "\n"); text != "" {
				err = add(goopenai.ChatCompletionMessage{Role: goopenai.ChatMessageRoleSystem, Content: text}, nil)
			}
		case agent.RoleAssistant:
			if cm, extra, ok := assistantMessage(m); ok {
				err = add(cm, extra)
			}
		case agent.RoleToolResult:
			text := joinTexts(m.Content, "\n")
			hasImage := false
			for _, c := range m.Content {
				if c.Type == agent.ContentImage {
					hasImage = true
					toolImages = append(toolImages, imagePart(c))
				}
			}
			switch {
			case text != "":
			case hasImage:
				text = seeAttachedImage
			default:
				text = noToolOutput
			}
			err = add(goopenai.ChatCompletionMessage{Role: goopenai.ChatMessageRoleTool, ToolCallID: m.ToolCallID, Content: text}, nil)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := flushImages(); err != nil {
		return nil, err
	}
	if out == nil {
		out = []json.RawMessage{}
	}
	return out, nil
}

func imagePart(c agent.Content) goopenai.ChatMessagePart {
	return goopenai.ChatMessagePart{Type: goopenai.ChatMessagePartTypeImageURL,
		ImageURL: &goopenai.ChatMessageImageURL{URL: "data:" + c.MimeType + ";base64," + c.Data}}
}

// userMessage is a plain string when the message is text only (what every
// server accepts), parts when it has images; false when it is empty.
func userMessage(content []agent.Content) (goopenai.ChatCompletionMessage, bool) {
	m := goopenai.ChatCompletionMessage{Role: goopenai.ChatMessageRoleUser}
	hasImage := slices.ContainsFunc(content, func(c agent.Content) bool { return c.Type == agent.ContentImage })
	if !hasImage {
		m.Content = joinTexts(content, "\n")
		return m, m.Content != ""
	}
	for _, c := range content {
		switch c.Type {
		case agent.ContentText:
			if c.Text != "" {
				m.MultiContent = append(m.MultiContent, goopenai.ChatMessagePart{Type: goopenai.ChatMessagePartTypeText, Text: c.Text})
			}
		case agent.ContentImage:
			m.MultiContent = append(m.MultiContent, imagePart(c))
		}
	}
	return m, len(m.MultiContent) > 0
}

// assistantMessage sends text, reasoning (in the field it came from) and
// tool calls; false when there is neither text nor a tool call.
func assistantMessage(m *agent.Message) (goopenai.ChatCompletionMessage, map[string]any, bool) {
	cm := goopenai.ChatCompletionMessage{Role: goopenai.ChatMessageRoleAssistant}
	var text strings.Builder
	var thinking []string
	field := ""
	for _, c := range m.Content {
		switch c.Type {
		case agent.ContentText:
			if strings.TrimSpace(c.Text) != "" {
				text.WriteString(c.Text)
			}
		case agent.ContentThinking:
			if strings.TrimSpace(c.Thinking) == "" || c.Redacted {
				continue
			}
			if field == "" && len(thinking) == 0 {
				field = c.ThinkingSignature
			}
			thinking = append(thinking, c.Thinking)
		case agent.ContentToolCall:
			args := c.Arguments
			if args == nil {
				args = map[string]any{}
			}
			raw, err := marshalJSON(args)
			if err != nil {
				raw = []byte("{}")
			}
			cm.ToolCalls = append(cm.ToolCalls, goopenai.ToolCall{ID: c.ID, Type: goopenai.ToolTypeFunction,
				Function: goopenai.FunctionCall{Name: c.Name, Arguments: string(raw)}})
		}
	}
	cm.Content = text.String()
	if cm.Content == "" && len(cm.ToolCalls) == 0 {
		return cm, nil, false
	}
	var extra map[string]any
	if len(thinking) > 0 {
		joined := strings.Join(thinking, "\n")
		switch {
		case field == "reasoning_content":
			cm.ReasoningContent = joined
		case slices.Contains(reasoningFields, field):
			extra = map[string]any{field: joined}
		case field == "reasoning_details":
			extra = map[string]any{field: []map[string]any{{"type": "reasoning.text", "text": joined}}}
		}
		// Thinking from a typed content array (or unknown origin) has no
		// field to go back in; the server does not expect it.
	}
	return cm, extra, true
}

func joinTexts(content []agent.Content, sep string) string {
	var parts []string
	for _, c := range content {
		if c.Type == agent.ContentText && c.Text != "" {
			parts = append(parts, c.Text)
		}
	}
	return strings.Join(parts, sep)
}

// pendingCall is a tool call waiting for its result.
type pendingCall struct {
	orig, id, name string
	done           bool
}

// transformMessages is pi's transformMessages: errored and aborted assistant
// messages are dropped, tool calls without a result get a synthetic error
// result, tool results without a call are dropped, thinking from another
// model becomes text, images become placeholders for a text-only model and
// tool-call ids are made acceptable to OpenAI (at most 40 characters of
// [A-Za-z0-9_-]; an empty id gets one). The input is not modified.
func transformMessages(msgs []agent.Message, model agent.Model, images bool) []agent.Message {
	out := make([]agent.Message, 0, len(msgs))
	var pending []*pendingCall
	used := map[string]bool{}
	seq := 0
	flush := func() {
		for _, c := range pending {
			if !c.done {
				out = append(out, agent.Message{Role: agent.RoleToolResult, ToolCallID: c.id, ToolName: c.name,
					Content: []agent.Content{agent.Text(noResultProvided)}, IsError: true})
			}
		}
		pending = nil
	}
	for _, m := range msgs {
		switch m.Role {
		case agent.RoleToolResult:
			var call *pendingCall
			for _, c := range pending {
				if !c.done && c.orig == m.ToolCallID {
					call = c
					break
				}
			}
			if call == nil {
				continue // its call was dropped or never made
			}
			call.done = true
			m.ToolCallID = call.id
			if !images {
				m.Content = replaceImages(m.Content, toolImageOmitted)
			}
			out = append(out, m)
		case agent.RoleAssistant:
			flush()
			if m.StopReason == agent.StopReasonError || m.StopReason == agent.StopReasonAborted {
				continue
			}
			sameModel := m.Provider == model.Provider && m.API == model.API && m.Model == model.ID
			content := make([]agent.Content, 0, len(m.Content))
			for _, c := range m.Content {
				switch c.Type {
				case agent.ContentThinking:
					if !sameModel {
						if c.Redacted || strings.TrimSpace(c.Thinking) == "" {
							continue
						}
						c = agent.Text(c.Thinking)
					}
				case agent.ContentToolCall:
					if !sameModel {
						c.ThoughtSignature = ""
					}
					orig := c.ID
					seq++
					c.ID = toolCallID(orig, seq, used)
					pending = append(pending, &pendingCall{orig: orig, id: c.ID, name: c.Name})
				}
				content = append(content, c)
			}
			m.Content = content
			out = append(out, m)
		case agent.RoleUser, agent.RoleSystem, agent.RoleDeveloper:
			flush()
			if !images {
				m.Content = replaceImages(m.Content, imageOmitted)
			}
			out = append(out, m)
		}
	}
	flush()
	return out
}

// toolCallID returns an id OpenAI accepts, unique within the request.
func toolCallID(id string, seq int, used map[string]bool) string {
	ok := id != "" && len(id) <= maxToolCallIDSize
	for i := 0; ok && i < len(id); i++ {
		ok = isIDByte(id[i])
	}
	if !ok {
		var b strings.Builder
		for i := 0; i < len(id) && b.Len() < maxToolCallIDSize; i++ {
			if isIDByte(id[i]) {
				b.WriteByte(id[i])
			} else {
				b.WriteByte('_')
			}
		}
		id = b.String()
		if id == "" || used[id] {
			suffix := fmt.Sprintf("_%d", seq)
			id = "call" + suffix
			if b.Len() > 0 {
				id = b.String()[:min(b.Len(), maxToolCallIDSize-len(suffix))] + suffix
			}
		}
	}
	used[id] = true
	return id
}

func isIDByte(c byte) bool {
	return c == '_' || c == '-' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func replaceImages(content []agent.Content, placeholder string) []agent.Content {
	if !slices.ContainsFunc(content, func(c agent.Content) bool { return c.Type == agent.ContentImage }) {
		return content
	}
	out := make([]agent.Content, 0, len(content))
	for _, c := range content {
		if c.Type == agent.ContentImage {
			c = agent.Text(placeholder)
		}
		out = append(out, c)
	}
	return out
}

// marshalJSON is json.Marshal without HTML escaping: the model sees "<",
// ">" and "&" as written, as the reference sends them. An encoder with
// SetEscapeHTML(false) is not enough, because go-openai's message types
// marshal themselves with json.Marshal.
func marshalJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return unescapeHTML(b), nil
}

// unescapeHTML turns the \u003c, \u003e and \u0026 escapes of json.Marshal
// output back into the characters. In valid JSON a backslash only starts an
// escape inside a string, so stepping over each escape whole is exact.
func unescapeHTML(b []byte) []byte {
	i := bytes.IndexByte(b, '\\')
	if i < 0 {
		return b
	}
	out := append(make([]byte, 0, len(b)), b[:i]...)
	for i < len(b) {
		c := b[i]
		if c != '\\' || i+1 >= len(b) {
			out = append(out, c)
			i++
			continue
		}
		if b[i+1] == 'u' && i+6 <= len(b) {
			switch string(b[i+2 : i+6]) {
			case "003c":
				out, i = append(out, '<'), i+6
				continue
			case "003e":
				out, i = append(out, '>'), i+6
				continue
			case "0026":
				out, i = append(out, '&'), i+6
				continue
			}
		}
		out, i = append(out, c, b[i+1]), i+2
	}
	return out
}
