package bus

import (
	"fmt"

	"github.com/agentfleet/agentfleet/agent"
)

// Compaction (since 1.10) turns on the compaction of a long run's context
// (docs/protocol.md, compaction): when the context nears the model's
// window the older messages are replaced, in what the model is sent, by a
// summary a model writes. {} takes the defaults: pi's, scaled for small
// windows, or the worker's model table's.
type Compaction struct {
	// ReserveTokens: compact when the context exceeds the window less
	// this (default min(16384, window/4)).
	ReserveTokens int `json:"reserveTokens,omitempty"`
	// KeepRecentTokens: the newest messages kept as they are (default
	// min(20000, window/2)).
	KeepRecentTokens int `json:"keepRecentTokens,omitempty"`
	// Model writes the summaries; default the run's model.
	Model *ModelRef `json:"model,omitempty"`
	// Instructions are added to every summary prompt ("Additional
	// focus: ...").
	Instructions string `json:"instructions,omitempty"`
}

// Bounds of the compaction field.
const (
	MaxCompactionTokens       = 10_000_000
	MaxCompactionInstructions = 4 << 10
	// MaxCompactionInstructionsJoined bounds the instructions of the
	// compact messages one compaction answers, joined: the oldest whole
	// ones that do not fit are left out.
	MaxCompactionInstructionsJoined = 16 << 10
)

// Problems lists what is wrong with the field; prefix names it.
func (c *Compaction) Problems(prefix string) []string {
	var p []string
	add := func(format string, args ...any) { p = append(p, prefix+fmt.Sprintf(format, args...)) }
	if c.ReserveTokens < 0 || c.ReserveTokens > MaxCompactionTokens {
		add(".reserveTokens %d is not in 0..%d", c.ReserveTokens, MaxCompactionTokens)
	}
	if c.KeepRecentTokens < 0 || c.KeepRecentTokens > MaxCompactionTokens {
		add(".keepRecentTokens %d is not in 0..%d", c.KeepRecentTokens, MaxCompactionTokens)
	}
	if len(c.Instructions) > MaxCompactionInstructions {
		add(".instructions is %d bytes, the limit is %d", len(c.Instructions), MaxCompactionInstructions)
	} else if !checkText(c.Instructions) {
		add(".instructions holds control characters other than newlines and tabs")
	}
	if m := c.Model; m != nil {
		if len(m.Provider) > MaxProviderBytes || !ValidQueue(m.Provider) {
			add(".model provider %q must match [A-Za-z0-9_-]{1,%d}", truncate(m.Provider, 64), MaxProviderBytes)
		}
		if m.ID == "" || len(m.ID) > MaxModelIDBytes || !checkText(m.ID) {
			add(".model id %q must be 1..%d printable bytes", truncate(m.ID, 64), MaxModelIDBytes)
		}
	}
	return p
}

// Compaction events (since 1.10).
const (
	EventCompactionStart = "compaction_start"
	EventCompactionEnd   = "compaction_end"
)

// Why a compaction ran.
const (
	CompactionThreshold = "threshold" // the context passed window - reserve
	CompactionOverflow  = "overflow"  // the provider refused the context; the call is retried once
	CompactionManual    = "manual"    // a compact control message
)

// ReasonCompactionFailed: a compaction's summary call failed; the run
// fails (run_finished) with the call's reason.
const ReasonCompactionFailed = "compaction_failed"

// CompactionStart says a compaction began: the summary call is under way.
type CompactionStart struct {
	Type         string `json:"type"`
	Reason       string `json:"reason"`
	TokensBefore int    `json:"tokensBefore"`
	// ControlSeq is the compact control message's sequence (manual).
	ControlSeq uint64 `json:"controlSeq,omitempty"`
}

// CompactionEnd ends a compaction. Without Error, the model is sent, from
// now on, SummaryMessage(Summary) followed by the run's transcript from
// message FirstKeptIndex on (an index into the whole transcript, a
// continuation's prior messages included); the events keep every message.
// A resumed attempt rebuilds that context from the last compaction_end.
type CompactionEnd struct {
	Type         string `json:"type"`
	Reason       string `json:"reason"`
	TokensBefore int    `json:"tokensBefore"`
	// TokensAfter is the estimate of the compacted context.
	TokensAfter        int    `json:"tokensAfter,omitempty"`
	Summary            string `json:"summary,omitempty"`
	FirstKeptIndex     int    `json:"firstKeptIndex,omitempty"`
	MessagesSummarized int    `json:"messagesSummarized,omitempty"`
	// Model wrote the summary; Usage is its call's (counted in the run's
	// usage, cost and budgets).
	Model string       `json:"model,omitempty"`
	Usage *agent.Usage `json:"usage,omitempty"`
	// Error says why the compaction failed. An automatic one's failure
	// fails the run (compaction_failed, or budget_exceeded when a budget
	// refused the call); a manual one's is reported and the run goes on.
	Error string `json:"error,omitempty"`
	// Cancelled (with Error): the summary call was cancelled (the run
	// aborted, its worker draining or handing it back); nothing failed,
	// and the next attempt compacts again.
	Cancelled  bool   `json:"cancelled,omitempty"`
	ControlSeq uint64 `json:"controlSeq,omitempty"`
}

// The text around a summary in the message that stands for the history
// it replaced (pi's COMPACTION_SUMMARY_PREFIX and _SUFFIX).
const (
	CompactionSummaryPrefix = "The conversation history before this point was compacted into the following summary:\n\n<summary>\n"
	CompactionSummarySuffix = "\n</summary>"
)

// CompactionSummaryMessage is the user message that stands for the
// history a compaction's summary replaced.
func CompactionSummaryMessage(summary string, timestamp int64) agent.Message {
	m := agent.UserText(CompactionSummaryPrefix + summary + CompactionSummarySuffix)
	m.Timestamp = timestamp
	return m
}

// CompactionFits reports whether end is a successful compaction whose
// first kept message is in transcript and not a tool result (a cut is on
// a turn boundary; an end that is not was made from another transcript).
func CompactionFits(transcript []agent.Message, end *CompactionEnd) bool {
	if end == nil || end.Error != "" || end.FirstKeptIndex <= 0 || end.FirstKeptIndex > len(transcript) {
		return false
	}
	return end.FirstKeptIndex == len(transcript) || transcript[end.FirstKeptIndex].Role != agent.RoleToolResult
}

// CompactedContext is what a run's model is sent after the compaction
// end (its last successful compaction_end): the summary message, then
// transcript from end.FirstKeptIndex on. transcript is the run's whole
// transcript (a continuation's prior messages first). With no usable end
// (nil, failed, an index past the transcript or on a tool result, which
// would be sent without its call) it is transcript.
func CompactedContext(transcript []agent.Message, end *CompactionEnd) []agent.Message {
	if !CompactionFits(transcript, end) {
		return transcript
	}
	out := make([]agent.Message, 0, 1+len(transcript)-end.FirstKeptIndex)
	out = append(out, CompactionSummaryMessage(end.Summary, transcript[end.FirstKeptIndex-1].Timestamp))
	return append(out, transcript[end.FirstKeptIndex:]...)
}
