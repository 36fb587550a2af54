package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/agentfleet/agentfleet/agent"
	goopenai "github.com/sashabaranov/go-openai"
)

// Wire shapes of a chat.completion.chunk. They mirror go-openai's
// ChatCompletionStreamResponse, but every value is raw, or a container of
// raw values, so that one field of an unexpected type (content as an array,
// arguments as an object, a number as a string, a choice that is not an
// object) loses only itself instead of the whole chunk, and the fields
// go-openai lacks (reasoning, reasoning_text, reasoning_details, error) are
// kept. The containers are decoded in the chunk's one pass: decoding each
// level from raw bytes again scanned the bytes of a delta about eight times.
type wireChunk struct {
	ID      json.RawMessage `json:"id"`
	Model   json.RawMessage `json:"model"`
	Choices []wireChoice    `json:"choices"`
	Usage   json.RawMessage `json:"usage"`
	Error   json.RawMessage `json:"error"`
}

type wireChoice struct {
	Index        json.RawMessage `json:"index"`
	Delta        *wireDelta      `json:"delta"`
	Message      *wireDelta      `json:"message"` // a non-streamed completion
	FinishReason json.RawMessage `json:"finish_reason"`
	Usage        json.RawMessage `json:"usage"`
}

// empty reports a choice that had no fields, or was not an object at all.
func (c *wireChoice) empty() bool {
	return c.Index == nil && c.Delta == nil && c.Message == nil && c.FinishReason == nil && c.Usage == nil
}

type wireDelta struct {
	Content          json.RawMessage `json:"content"`
	Refusal          json.RawMessage `json:"refusal"`
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	Reasoning        json.RawMessage `json:"reasoning"`
	ReasoningText    json.RawMessage `json:"reasoning_text"`
	ReasoningDetails json.RawMessage `json:"reasoning_details"`
	ToolCalls        []wireToolCall  `json:"tool_calls"`
	FunctionCall     *wireFunction   `json:"function_call"`
}

type wireToolCall struct {
	Index    json.RawMessage `json:"index"`
	ID       json.RawMessage `json:"id"`
	Function wireFunction    `json:"function"`
}

// empty reports a call that had no fields, or was not an object at all.
func (t *wireToolCall) empty() bool { return t.Index == nil && t.ID == nil && t.Function.empty() }

type wireFunction struct {
	Name      json.RawMessage `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

func (f *wireFunction) empty() bool { return f.Name == nil && f.Arguments == nil }

type wireUsage struct {
	PromptTokens         json.RawMessage `json:"prompt_tokens"`
	CompletionTokens     json.RawMessage `json:"completion_tokens"`
	PromptCacheHitTokens json.RawMessage `json:"prompt_cache_hit_tokens"`
	PromptTokensDetails  json.RawMessage `json:"prompt_tokens_details"`
	CompletionDetails    json.RawMessage `json:"completion_tokens_details"`
}

type wirePromptDetails struct {
	CachedTokens     json.RawMessage `json:"cached_tokens"`
	CacheWriteTokens json.RawMessage `json:"cache_write_tokens"`
}

type wireCompletionDetails struct {
	ReasoningTokens json.RawMessage `json:"reasoning_tokens"`
}

// isNull reports a missing or null raw value.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// rawString reads a string; numbers are taken as their text, anything else
// is "".
func rawString(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	switch raw[0] {
	case '"':
		// Most strings need no unescaping: take them as they are.
		if len(raw) >= 2 && raw[len(raw)-1] == '"' && bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) &&
			bytes.IndexFunc(raw, func(r rune) bool { return r < 0x20 }) < 0 && bytes.IndexByte(raw[1:len(raw)-1], '"') < 0 {
			return string(raw[1 : len(raw)-1])
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return string(raw)
	}
	return ""
}

// rawInt reads a number (or a numeric string).
func rawInt(raw json.RawMessage) (int, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, false
	}
	if raw[0] == '"' {
		raw = []byte(rawString(raw))
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || f != f || f > 1<<53 || f < -(1<<53) {
		return 0, false
	}
	return int(f), true
}

// toolState is a tool call being streamed.
type toolState struct {
	block     int             // content index
	key       string          // stream index key
	partial   strings.Builder // raw argument JSON so far
	parsedLen int             // partial.Len() when args was parsed
	args      map[string]any
}

// reparseEvery is how much new argument text is always worth parsing again.
// Past it, the partial arguments are parsed again once they grew by
// max(reparseEvery, 1/16 of their length): each delta still carries
// arguments (at most that stale) and a long call costs work linear in its
// length, not quadratic. The end of the stream parses them whole.
const reparseEvery = 2 << 10

// reparseDue reports whether the arguments grew enough to parse them again.
func (t *toolState) reparseDue() bool {
	n := t.partial.Len()
	return n <= reparseEvery || n-t.parsedLen >= max(reparseEvery, n/16)
}

// assembler maps decoded chunks to agent stream events with pi's rules. It
// does no I/O: the stream function feeds it events and yields what it
// collects, and the fuzz target drives it directly.
type assembler struct {
	model agent.Model
	msg   agent.Message
	out   []agent.StreamEvent

	text     int // content index of the text block, -1 if none
	thinking int // content index of the thinking block, -1 if none
	// The blocks' text, copied into the message when they end: appending
	// to a string on each delta would copy it whole every time.
	textBuf, thinkingBuf strings.Builder
	tools                []*toolState
	byKey                map[string]*toolState

	finish    string // last finish_reason seen
	sawDone   bool   // data: [DONE]
	failed    string // provider error text, ends the stream
	dataSeen  bool   // any event that parsed as a chunk or error
	usageSeen bool

	maxArgs     int // bytes of one call's arguments; <= 0 is no limit
	argsScanned int // bytes handed to parseArguments, for tests of the work done
}

func newAssembler(model agent.Model, header agent.Message) *assembler {
	return &assembler{model: model, msg: header, text: -1, thinking: -1, byKey: map[string]*toolState{},
		maxArgs: DefaultMaxToolArgumentBytes}
}

// parseArgs parses a call's arguments as streamed so far.
func (a *assembler) parseArgs(t *toolState) map[string]any {
	a.argsScanned += t.partial.Len()
	t.parsedLen = t.partial.Len()
	return parseArguments(t.partial.String())
}

// ended reports that nothing after this point matters.
func (a *assembler) ended() bool { return a.sawDone || a.failed != "" }

// event handles one SSE event.
func (a *assembler) event(ev sseEvent) {
	data := bytes.TrimSpace(ev.Data)
	if ev.Name == "error" {
		a.dataSeen = true
		a.failed = errorText(data)
		if a.failed == "" {
			a.failed = "Provider sent an error event without a message"
		}
		return
	}
	if len(data) == 0 {
		return
	}
	if bytes.Equal(data, []byte("[DONE]")) {
		a.dataSeen = true
		a.sawDone = true
		return
	}
	var c wireChunk
	if data[0] != '{' {
		return
	}
	if err := json.Unmarshal(data, &c); err != nil && !errors.As(err, new(*json.UnmarshalTypeError)) {
		return // a broken chunk loses only itself; a field of another type loses only the field
	}
	a.dataSeen = true
	a.chunk(&c)
}

func (a *assembler) chunk(c *wireChunk) {
	if id := rawString(c.ID); id != "" && a.msg.ResponseID == "" {
		a.msg.ResponseID = id
	}
	if m := rawString(c.Model); m != "" && m != a.model.ID && a.msg.ResponseModel == "" {
		a.msg.ResponseModel = m
	}
	if !isNull(c.Usage) {
		a.usage(c.Usage)
	}
	var choice wireChoice
	found := false
	for _, ch := range c.Choices {
		if ch.empty() {
			continue
		}
		if i, ok := rawInt(ch.Index); !found || (ok && i == 0) {
			choice, found = ch, true
			if ok && i == 0 {
				break
			}
		}
	}
	if found {
		if isNull(c.Usage) && !isNull(choice.Usage) {
			a.usage(choice.Usage)
		}
		if r := rawString(choice.FinishReason); r != "" && r != string(goopenai.FinishReasonNull) {
			a.finish = r // a later null never erases it
		}
		d := choice.Delta
		if d == nil {
			d = choice.Message
		}
		if d != nil {
			a.delta(d)
		}
	}
	if !isNull(c.Error) {
		if msg := errorText(c.Error); msg != "" {
			a.failed = msg
		}
	}
}

func (a *assembler) delta(d *wireDelta) {
	var thinking []string
	content := bytes.TrimSpace(d.Content)
	if len(content) > 0 && content[0] == '[' {
		// A typed content array (Mistral): text parts and thinking parts.
		var parts []struct {
			Type     string          `json:"type"`
			Text     json.RawMessage `json:"text"`
			Thinking json.RawMessage `json:"thinking"`
		}
		if json.Unmarshal(content, &parts) == nil {
			for _, p := range parts {
				switch p.Type {
				case "text":
					a.addText(rawString(p.Text))
				case "thinking", "reasoning":
					thinking = append(thinking, partText(p.Thinking), rawString(p.Text))
				}
			}
		}
	} else {
		a.addText(rawString(d.Content))
	}
	a.addText(rawString(d.Refusal))

	// One source of reasoning per chunk, in pi's order, so servers that send
	// the same text twice (reasoning and reasoning_details) count it once.
	switch {
	case rawString(d.ReasoningContent) != "":
		a.addThinking(rawString(d.ReasoningContent), "reasoning_content")
	case rawString(d.Reasoning) != "":
		a.addThinking(rawString(d.Reasoning), "reasoning")
	case rawString(d.ReasoningText) != "":
		a.addThinking(rawString(d.ReasoningText), "reasoning_text")
	case detailsText(d.ReasoningDetails) != "":
		a.addThinking(detailsText(d.ReasoningDetails), "reasoning_details")
	default:
		a.addThinking(strings.Join(thinking, ""), "content")
	}

	for pos, tc := range d.ToolCalls {
		if tc.empty() {
			continue
		}
		key := strconv.Itoa(pos)
		if i, ok := rawInt(tc.Index); ok {
			key = strconv.Itoa(i)
		}
		a.toolDelta(key, rawString(tc.ID), rawString(tc.Function.Name), tc.Function.Arguments)
	}
	if fn := d.FunctionCall; fn != nil && !fn.empty() {
		a.toolDelta("function_call", "", rawString(fn.Name), fn.Arguments)
	}
}

// partText reads Mistral's thinking field: a string or a list of text parts.
func partText(raw json.RawMessage) string {
	if s := rawString(raw); s != "" {
		return s
	}
	var parts []struct {
		Text json.RawMessage `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(rawString(p.Text))
	}
	return b.String()
}

// detailsText joins the readable text of OpenRouter's reasoning_details.
func detailsText(raw json.RawMessage) string {
	if isNull(raw) {
		return ""
	}
	var details []struct {
		Type    string          `json:"type"`
		Text    json.RawMessage `json:"text"`
		Summary json.RawMessage `json:"summary"`
	}
	if json.Unmarshal(raw, &details) != nil {
		return ""
	}
	var b strings.Builder
	for _, d := range details {
		switch d.Type {
		case "reasoning.encrypted":
		case "reasoning.summary":
			b.WriteString(rawString(d.Summary))
		default:
			b.WriteString(rawString(d.Text))
		}
	}
	return b.String()
}

func (a *assembler) addText(s string) {
	if s == "" {
		return
	}
	if a.text < 0 {
		a.text = len(a.msg.Content)
		a.msg.Content = append(a.msg.Content, agent.Content{Type: agent.ContentText})
		a.emit(agent.StreamEvent{Type: agent.StreamTextStart, ContentIndex: a.text})
	}
	a.textBuf.WriteString(s)
	a.emit(agent.StreamEvent{Type: agent.StreamTextDelta, ContentIndex: a.text, Delta: s})
}

func (a *assembler) addThinking(s, field string) {
	if s == "" {
		return
	}
	if a.thinking < 0 {
		a.thinking = len(a.msg.Content)
		a.msg.Content = append(a.msg.Content, agent.Content{Type: agent.ContentThinking, ThinkingSignature: field})
		a.emit(agent.StreamEvent{Type: agent.StreamThinkingStart, ContentIndex: a.thinking, Signature: field})
	}
	a.thinkingBuf.WriteString(s)
	a.emit(agent.StreamEvent{Type: agent.StreamThinkingDelta, ContentIndex: a.thinking, Delta: s})
}

// toolDelta applies one tool-call fragment. Fragments are keyed by their
// index (or position); a fragment with a different non-empty id starts a new
// call, one with an empty id continues the call of its key.
func (a *assembler) toolDelta(key, id, name string, rawArgs json.RawMessage) {
	t := a.byKey[key]
	if id != "" {
		if t != nil && a.callID(t) != "" && a.callID(t) != id {
			t = nil
		}
		if t == nil {
			for _, x := range a.tools {
				if a.callID(x) == id {
					t = x
					break
				}
			}
		}
	}
	if t == nil {
		t = &toolState{block: len(a.msg.Content), key: key}
		a.msg.Content = append(a.msg.Content, agent.Content{Type: agent.ContentToolCall, ID: id, Name: name, Arguments: map[string]any{}})
		a.tools = append(a.tools, t)
		a.emit(agent.StreamEvent{Type: agent.StreamToolCallStart, ContentIndex: t.block, ID: id, Name: name})
	}
	a.byKey[key] = t
	c := &a.msg.Content[t.block]
	if c.ID == "" {
		c.ID = id
	}
	if c.Name == "" {
		c.Name = name
	}
	var frag string
	size := t.partial.Len()
	whole := false
	if raw := bytes.TrimSpace(rawArgs); len(raw) > 0 && raw[0] == '{' {
		// Arguments sent as an object, not a JSON string: the whole value.
		frag, size, whole = string(raw), 0, true
	} else {
		frag = rawString(rawArgs)
	}
	if size += len(frag); a.maxArgs > 0 && size > a.maxArgs {
		a.failed = fmt.Sprintf("Tool call arguments exceed the limit of %d bytes (MaxToolArgumentBytes)", a.maxArgs)
		return
	}
	if whole {
		t.partial.Reset()
	}
	t.partial.WriteString(frag)
	// A whole object is parsed at once: its bytes arrived in this chunk.
	if t.args == nil || whole || (frag != "" && t.reparseDue()) {
		t.args = a.parseArgs(t)
	}
	c.Arguments = t.args
	a.emit(agent.StreamEvent{Type: agent.StreamToolCallDelta, ContentIndex: t.block, Delta: frag, Arguments: t.args})
}

func (a *assembler) callID(t *toolState) string { return a.msg.Content[t.block].ID }

func (a *assembler) usage(raw json.RawMessage) {
	var u wireUsage
	if json.Unmarshal(raw, &u) != nil {
		return
	}
	var pd wirePromptDetails
	_ = json.Unmarshal(u.PromptTokensDetails, &pd)
	var cd wireCompletionDetails
	_ = json.Unmarshal(u.CompletionDetails, &cd)
	prompt, _ := rawInt(u.PromptTokens)
	output, _ := rawInt(u.CompletionTokens)
	cacheRead, ok := rawInt(pd.CachedTokens)
	if !ok {
		cacheRead, _ = rawInt(u.PromptCacheHitTokens)
	}
	cacheWrite, _ := rawInt(pd.CacheWriteTokens)
	reasoning, _ := rawInt(cd.ReasoningTokens)
	usage := agent.Usage{
		Input:      max(0, prompt-cacheRead-cacheWrite),
		Output:     max(0, output),
		CacheRead:  max(0, cacheRead),
		CacheWrite: max(0, cacheWrite),
		Reasoning:  max(0, reasoning),
	}
	usage.TotalTokens = usage.Input + usage.Output + usage.CacheRead + usage.CacheWrite
	a.model.ComputeCost(&usage)
	a.msg.Usage = usage // the last usage wins
	a.usageSeen = true
}

func (a *assembler) emit(ev agent.StreamEvent) { a.out = append(a.out, ev) }

// closeBlocks emits the *_end events in content order with the final values.
func (a *assembler) closeBlocks() {
	for i := range a.msg.Content {
		c := &a.msg.Content[i]
		switch c.Type {
		case agent.ContentText:
			c.Text = a.textBuf.String()
			a.emit(agent.StreamEvent{Type: agent.StreamTextEnd, ContentIndex: i, Content: c.Text})
		case agent.ContentThinking:
			c.Thinking = a.thinkingBuf.String()
			a.emit(agent.StreamEvent{Type: agent.StreamThinkingEnd, ContentIndex: i, Content: c.Thinking, Signature: c.ThinkingSignature})
		case agent.ContentToolCall:
			for _, t := range a.tools {
				if t.block == i {
					c.Arguments = a.parseArgs(t)
				}
			}
			final := *c
			a.emit(agent.StreamEvent{Type: agent.StreamToolCallEnd, ContentIndex: i, ToolCall: &final})
		}
	}
}

// outcome decides how the message ends once the body is over (or was cut).
func (a *assembler) outcome() (agent.StopReason, string) {
	if a.failed != "" {
		return agent.StopReasonError, a.failed
	}
	switch a.finish {
	case "":
	case string(goopenai.FinishReasonStop), "end":
		return agent.StopReasonStop, ""
	case string(goopenai.FinishReasonLength):
		return agent.StopReasonLength, ""
	case string(goopenai.FinishReasonToolCalls), string(goopenai.FinishReasonFunctionCall):
		return agent.StopReasonToolUse, ""
	default:
		return agent.StopReasonError, "Provider finish_reason: " + a.finish
	}
	if a.sawDone {
		if len(a.tools) > 0 {
			return agent.StopReasonToolUse, ""
		}
		return agent.StopReasonStop, ""
	}
	return agent.StopReasonError, "Stream ended without finish_reason or [DONE]: the connection was closed early"
}

// errorText reads a provider error: {"error":{...}}, the error object
// itself, a bare string, or any other text.
func errorText(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if s := rawString(raw); s != "" {
		return s
	}
	var wrapped struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(raw, &wrapped) == nil && !isNull(wrapped.Error) {
		raw = bytes.TrimSpace(wrapped.Error)
		if s := rawString(raw); s != "" {
			return s
		}
	}
	var e goopenai.APIError
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		msg := e.Message
		if meta := metadataRaw(raw); meta != "" && !strings.Contains(msg, meta) {
			msg += "\n" + meta
		}
		return msg
	}
	if len(raw) == 0 || string(raw) == "{}" {
		return ""
	}
	return capText(string(raw))
}

// metadataRaw is OpenRouter's upstream error text (error.metadata.raw).
func metadataRaw(raw []byte) string {
	var e struct {
		Metadata struct {
			Raw json.RawMessage `json:"raw"`
		} `json:"metadata"`
	}
	if json.Unmarshal(raw, &e) != nil {
		return ""
	}
	if s := rawString(e.Metadata.Raw); s != "" {
		return capText(s)
	}
	if !isNull(e.Metadata.Raw) {
		return capText(string(e.Metadata.Raw))
	}
	return ""
}

// maxErrorText caps provider text in error messages, as pi does.
const maxErrorText = 4000

func capText(s string) string {
	if len(s) <= maxErrorText {
		return s
	}
	cut := maxErrorText
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
