package workerproto

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// MaxAbortReason bounds the reason of an abort.
const MaxAbortReason = 1024

// DecodeUserControl decodes a steer or follow-up body into the user message
// it queues. storedAt (the time the stream stored it) stamps a text message
// and a message without a timestamp.
func DecodeUserControl(data []byte, storedAt time.Time) (agent.Message, error) {
	if len(data) > bus.MaxControlBytes {
		return agent.Message{}, fmt.Errorf("control message is %d bytes, the limit is %d", len(data), bus.MaxControlBytes)
	}
	var c bus.Control
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return agent.Message{}, fmt.Errorf(`control message must be {"text":"..."} or {"message":{...}}: %s`, jsonErrorText(err))
	}
	ts := storedAt.UnixMilli()
	switch {
	case c.Text != "" && c.Message != nil:
		return agent.Message{}, errors.New(`control message has both "text" and "message"`)
	case c.Text != "":
		m := agent.UserText(c.Text)
		m.Timestamp = ts
		return m, nil
	case c.Message != nil:
		m := *c.Message
		if m.Role != agent.RoleUser {
			return agent.Message{}, fmt.Errorf("control message role is %q, it must be user", truncate(m.Role, 40))
		}
		if len(m.Content) == 0 {
			return agent.Message{}, errors.New("control message has no content")
		}
		if m.Timestamp == 0 {
			m.Timestamp = ts
		}
		return m, nil
	}
	return agent.Message{}, errors.New(`control message has neither "text" nor "message"`)
}

// DecodeAbort returns the reason of an abort. Any body aborts: an empty or
// non-JSON body is an abort without (or with that text as) reason.
func DecodeAbort(data []byte) string {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return ""
	}
	var c bus.Control
	if json.Unmarshal(data, &c) == nil {
		return clip(c.Reason, MaxAbortReason)
	}
	if utf8.Valid(data) {
		return clip(string(data), MaxAbortReason)
	}
	return ""
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// ControlKind returns the kind (last token) of a control subject.
func ControlKind(subject string) string {
	if i := strings.LastIndexByte(subject, '.'); i >= 0 {
		return subject[i+1:]
	}
	return subject
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// jsonErrorText says where a JSON body went wrong, for a person to read.
func jsonErrorText(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)
	case errors.As(err, &te):
		if te.Field != "" {
			return fmt.Sprintf("field %q: expected %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return fmt.Sprintf("expected %s, got JSON %s", te.Type, te.Value)
	}
	return err.Error()
}

// DecodeApproval decodes the body of an approve control message. Its
// error lists every problem.
func DecodeApproval(data []byte) (bus.ApprovalAnswer, error) {
	var a bus.ApprovalAnswer
	if len(data) > bus.MaxControlBytes {
		return a, fmt.Errorf("approval is %d bytes, the limit is %d", len(data), bus.MaxControlBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return bus.ApprovalAnswer{}, fmt.Errorf(`approval must be {"toolCallId":"...","decision":"approve"|"deny",...}: %s`, jsonErrorText(err))
	}
	if p := a.Problems(); len(p) > 0 {
		return bus.ApprovalAnswer{}, errors.New("approval: " + strings.Join(p, "; "))
	}
	return a, nil
}

// DecodeCompact returns the instructions of a compact control message
// (since 1.10): an empty body, {} or {"text":"..."}; the text focuses the
// summary, within bus.MaxCompactionInstructions.
func DecodeCompact(data []byte) (string, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return "", nil
	}
	var c bus.Control
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return "", fmt.Errorf(`compact message must be empty or {"text":"<instructions>"}: %s`, jsonErrorText(err))
	}
	var problems []string
	if c.Message != nil || c.Reason != "" {
		problems = append(problems, `only "text" (the summary's instructions) is read`)
	}
	if len(c.Text) > bus.MaxCompactionInstructions {
		problems = append(problems, fmt.Sprintf("text is %d bytes, the limit is %d", len(c.Text), bus.MaxCompactionInstructions))
	}
	if len(problems) > 0 {
		return "", errors.New("compact message: " + strings.Join(problems, "; "))
	}
	return c.Text, nil
}
