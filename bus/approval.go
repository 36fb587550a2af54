package bus

import (
	"fmt"
	"path"
	"strings"
)

// Approval of tool calls (since 1.3). A run's request may gate tools
// (Approval); a worker may gate tools by configuration, which a request
// cannot lift. A gated call waits for an ApprovalAnswer on
// agents.run.<run>.approve.

// Approval defaults and bounds.
const (
	DefaultApprovalTimeoutSeconds = 86_400
	MaxApprovalTimeoutSeconds     = 604_800
	MaxApprovalTools              = 64
	MaxApprovalPatternBytes       = 128
	// MaxApprovalBy bounds an answer's display name.
	MaxApprovalBy = 128
	// MaxApprovalReason bounds an answer's reason.
	MaxApprovalReason = 4 << 10
	// MaxApprovalSchemaBytes bounds the tool schema a
	// tool_approval_requested carries (since 1.8); a larger one is left
	// out and only the worker checks an edit.
	MaxApprovalSchemaBytes = 16 << 10
)

// What happens to a gated call nobody answers in time.
const (
	OnTimeoutDeny  = "deny"
	OnTimeoutAbort = "abort"
)

// ReasonApprovalTimeout: an aborted run whose gated call was not answered
// in time with onTimeout abort.
const ReasonApprovalTimeout = "approval_timeout"

// Approval is a request's "approval": which tools need a person's answer.
type Approval struct {
	// Tools are tool names or patterns ("everything__*"; "*" gates every
	// call): path.Match syntax, except that "*" and "?" also match "/"
	// (tool names may contain it).
	Tools []string `json:"tools"`
	// TimeoutSeconds bounds each call's wait; 0 for the default.
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
	// OnTimeout is deny (default) or abort.
	OnTimeout string `json:"onTimeout,omitempty"`
}

// Problems lists what is wrong with the approval; prefix names the field
// ("approval" in a request, "--approve-tools" in a worker's flags).
func (a *Approval) Problems(prefix string) []string {
	var p []string
	add := func(format string, args ...any) { p = append(p, prefix+fmt.Sprintf(format, args...)) }
	if len(a.Tools) == 0 {
		add(".tools is empty: name at least one tool or pattern (\"*\" for every call)")
	}
	if len(a.Tools) > MaxApprovalTools {
		add(".tools has %d entries, the limit is %d", len(a.Tools), MaxApprovalTools)
	}
	for i, t := range a.Tools {
		switch _, err := path.Match(t, ""); {
		case t == "" || len(t) > MaxApprovalPatternBytes || !checkText(t):
			add(".tools[%d] %q must be 1..%d printable bytes", i, truncate(t, 64), MaxApprovalPatternBytes)
		case err != nil:
			add(".tools[%d] %q is not a valid pattern: %v", i, truncate(t, 64), err)
		}
	}
	if a.TimeoutSeconds < 0 || a.TimeoutSeconds > MaxApprovalTimeoutSeconds {
		add(".timeoutSeconds %d is not in 1..%d", a.TimeoutSeconds, MaxApprovalTimeoutSeconds)
	}
	switch a.OnTimeout {
	case "", OnTimeoutDeny, OnTimeoutAbort:
	default:
		add(".onTimeout %q is not deny or abort", truncate(a.OnTimeout, 40))
	}
	return p
}

// Gates reports whether the approval gates a tool.
func (a *Approval) Gates(tool string) bool {
	if a == nil {
		return false
	}
	for _, t := range a.Tools {
		if matchToolPattern(t, tool) {
			return true
		}
	}
	return false
}

// matchToolPattern is path.Match with "/" an ordinary character: both
// sides have it swapped for NUL, which no printable name or pattern holds.
func matchToolPattern(pattern, tool string) bool {
	ok, _ := path.Match(strings.ReplaceAll(pattern, "/", "\x00"), strings.ReplaceAll(tool, "/", "\x00"))
	return ok
}

// Timeout is the call's wait bound in seconds, the default filled in.
func (a *Approval) Timeout() int {
	if a == nil || a.TimeoutSeconds == 0 {
		return DefaultApprovalTimeoutSeconds
	}
	return a.TimeoutSeconds
}

// Aborts reports whether an unanswered call aborts the run.
func (a *Approval) Aborts() bool { return a != nil && a.OnTimeout == OnTimeoutAbort }

// ParseApproveTools parses a worker's --approve-tools: comma-separated
// tool names or patterns.
func ParseApproveTools(s string) []string {
	var out []string
	for _, t := range strings.Split(s, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// ApprovalAnswer is the body of a control message on
// agents.run.<run>.approve.
type ApprovalAnswer struct {
	ToolCallID string `json:"toolCallId"`
	Decision   string `json:"decision"` // approve or deny
	Reason     string `json:"reason,omitempty"`
	// By is display text (unauthenticated: NATS permissions on
	// agents.run.*.approve say who may answer).
	By string `json:"by,omitempty"`
	// Arguments, on approve, replace the call's arguments; they are
	// validated against the tool's schema. Nil: no edit; an empty map
	// is sent as {} (an edit to no arguments).
	Arguments map[string]any `json:"arguments,omitzero"`
}

// Problems lists what is wrong with an answer.
func (a *ApprovalAnswer) Problems() []string {
	var p []string
	if a.ToolCallID == "" || len(a.ToolCallID) > 256 || !checkText(a.ToolCallID) {
		p = append(p, fmt.Sprintf("toolCallId %q must be 1..256 printable bytes", truncate(a.ToolCallID, 64)))
	}
	switch a.Decision {
	case DecisionApprove, DecisionDeny:
	default:
		p = append(p, fmt.Sprintf("decision %q is not approve or deny", truncate(a.Decision, 40)))
	}
	if len(a.By) > MaxApprovalBy || !checkText(a.By) {
		p = append(p, fmt.Sprintf("by must be at most %d printable bytes", MaxApprovalBy))
	}
	if len(a.Reason) > MaxApprovalReason {
		p = append(p, fmt.Sprintf("reason is %d bytes, the limit is %d", len(a.Reason), MaxApprovalReason))
	}
	if a.Arguments != nil && a.Decision == DecisionDeny {
		p = append(p, "arguments are only for approve")
	}
	return p
}
