// Package compaction shrinks a long run's context as pi's coding agent
// does (coding-agent/src/core/compaction): when the context nears the
// model's window, the older messages are replaced by a structured summary
// a model writes, and the recent ones are kept as they are. It decides
// when (ShouldCompact), where to cut (FindCut), asks for the summary
// (Summarize) and builds the message that stands for the cut-off history
// (bus.CompactionSummaryMessage). It knows nothing of NATS: the worker stores what it
// decides in the run's events.
//
// Departures from pi: a cut never splits a turn's prefix into a second
// summary (pi's "turn prefix" call); the messages before the cut go into
// the one summary. The summary call asks for no reasoning effort. Token
// estimates count runes, not UTF-16 units.
package compaction

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/agentfleet/agentfleet/agent"
)

// pi's defaults (DEFAULT_COMPACTION_SETTINGS).
const (
	DefaultReserveTokens    = 16384
	DefaultKeepRecentTokens = 20000
)

// Settings are a run's compaction thresholds, in tokens.
type Settings struct {
	Window           int // the model's context window
	ReserveTokens    int // compact when the context exceeds Window-Reserve()
	KeepRecentTokens int // keep at least this much of the newest messages
	// OutputReserve is the max_tokens every model call of the run asks:
	// OpenAI-compatible servers (vLLM, LiteLLM, OpenAI itself) refuse a
	// prompt plus max_tokens past the window.
	OutputReserve int
}

// Reserve is what the context leaves free of the window: reserveTokens,
// and at least the calls' output reserve (pi's threshold ignores it).
func (s Settings) Reserve() int { return max(s.ReserveTokens, s.OutputReserve) }

// ErrNoWindow: compaction needs the model's context window.
var ErrNoWindow = errors.New("the model has no known context window (contextWindow in the model table)")

// Resolve fills a request's thresholds (0: the default) for a model's
// window and the output reserve its calls ask. The defaults are pi's,
// scaled for small windows: reserve = min(16384, window/4), keep =
// min(20000, window/2). A default keep that would leave no room, after a
// compaction, for the summary below the threshold is halved into what
// room there is, so that compactions do not follow each other at once or
// overflow. It returns every problem of the asked values.
func Resolve(window, reserve, keep, outputReserve int) (Settings, []string) {
	if window <= 0 {
		return Settings{}, []string{ErrNoWindow.Error()}
	}
	// Up to three quarters of the window: past that, servers that count it
	// refuse nearly any context; compaction still helps on the others
	// (llama.cpp, Ollama), which do not.
	s := Settings{Window: window, ReserveTokens: reserve, KeepRecentTokens: keep, OutputReserve: min(max(outputReserve, 0), window*3/4)}
	if s.ReserveTokens == 0 {
		s.ReserveTokens = min(DefaultReserveTokens, window/4)
	}
	if s.KeepRecentTokens == 0 {
		s.KeepRecentTokens = min(DefaultKeepRecentTokens, window/2)
	}
	var problems []string
	if s.ReserveTokens >= window {
		problems = append(problems, fmt.Sprintf("compaction.reserveTokens %d must be less than the model's context window of %d", s.ReserveTokens, window))
	}
	free := window - min(s.Reserve(), window)
	if sum := min(s.SummaryMaxTokens(), free/2); keep == 0 && s.KeepRecentTokens+sum >= free {
		s.KeepRecentTokens = (free - sum) / 2
		if s.KeepRecentTokens <= 0 {
			s.KeepRecentTokens = min(DefaultKeepRecentTokens, window/2)
			keep = s.KeepRecentTokens // reported below
		}
	}
	if keep != 0 && s.KeepRecentTokens >= free {
		why := ""
		if s.OutputReserve > s.ReserveTokens {
			why = fmt.Sprintf(": the reserve is the output reserve each call asks, maxTokens %d", s.OutputReserve)
		}
		problems = append(problems, fmt.Sprintf("compaction.keepRecentTokens %d must be less than the context window less the reserve (%d%s)", s.KeepRecentTokens, free, why))
	}
	return s, problems
}

// ShouldCompact is pi's trigger, contextTokens > window - reserve, with
// the reserve at least the calls' output reserve.
func (s Settings) ShouldCompact(contextTokens int) bool {
	return s.Window > 0 && contextTokens > s.Window-s.Reserve()
}

// SummaryMaxTokens is the summary call's output budget (pi: 80% of the
// reserve).
func (s Settings) SummaryMaxTokens() int { return max(s.ReserveTokens*8/10, 256) }

func estimateChars(chars int) int { return (chars + 3) / 4 }

// imageChars is what pi counts for an image (1,200 tokens).
const imageChars = 4800

// EstimateTokens is pi's chars/4 estimate of one message.
func EstimateTokens(m *agent.Message) int {
	chars := 0
	for _, c := range m.Content {
		switch c.Type {
		case agent.ContentText:
			chars += utf8.RuneCountInString(c.Text)
		case agent.ContentThinking:
			if m.Role == agent.RoleAssistant {
				chars += utf8.RuneCountInString(c.Thinking)
			}
		case agent.ContentToolCall:
			chars += utf8.RuneCountInString(c.Name)
			if b, err := agent.MarshalJSON(c.Arguments); err == nil {
				chars += utf8.RuneCount(b)
			}
		case agent.ContentImage:
			if m.Role != agent.RoleAssistant {
				chars += imageChars
			}
		}
	}
	return estimateChars(chars)
}

// ContextTokens is the size of msgs as the model will see them, as pi's
// estimateContextTokens: the usage the provider reported for the last
// assistant message at or after fresh (its input and output: the
// context up to it), plus an estimate of the messages after it; without
// such a message, an estimate of all. Messages before fresh are left out
// of the usage rule: their usage counted a context since compacted.
func ContextTokens(msgs []agent.Message, fresh int) int {
	for i := len(msgs) - 1; i >= max(fresh, 0); i-- {
		m := &msgs[i]
		if m.Role != agent.RoleAssistant || m.StopReason == agent.StopReasonError || m.StopReason == agent.StopReasonAborted {
			continue
		}
		u := m.Usage
		used := u.TotalTokens
		if used == 0 {
			used = u.Input + u.Output + u.CacheRead + u.CacheWrite
		}
		if used == 0 {
			break
		}
		for j := i + 1; j < len(msgs); j++ {
			used += EstimateTokens(&msgs[j])
		}
		return used
	}
	n := 0
	for i := range msgs {
		n += EstimateTokens(&msgs[i])
	}
	return n
}

// FindCut returns the index of the first message of msgs[start:] to keep:
// walking back from the newest message until keep tokens are counted, then
// forward to the nearest turn boundary, a user or assistant message (pi's
// findCutPoint). A tool result is never the first kept message, so a tool
// call and its result stay on the same side. It returns start when
// nothing can be cut. Unlike pi, a newest turn larger than keep is kept
// alone rather than nothing being cut.
//
// Invariant: msgs[cut] is not a tool result, and every tool result in
// msgs[cut:] follows its call in msgs[cut:].
func FindCut(msgs []agent.Message, start, keep int) int {
	cuts := make([]int, 0, 16)
	for i := start; i < len(msgs); i++ {
		if msgs[i].Role != agent.RoleToolResult {
			cuts = append(cuts, i)
		}
	}
	if len(cuts) == 0 {
		return start
	}
	cut := cuts[0]
	acc := 0
	for i := len(msgs) - 1; i >= start; i-- {
		acc += EstimateTokens(&msgs[i])
		if acc < keep {
			continue
		}
		// The nearest boundary at or after i; when the newest turn alone
		// is more than keep, its start (pi keeps everything then).
		cut = cuts[len(cuts)-1]
		for _, c := range cuts {
			if c >= i {
				cut = c
				break
			}
		}
		break
	}
	return cut
}
