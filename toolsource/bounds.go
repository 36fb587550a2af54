package toolsource

import (
	"fmt"
	"log/slog"
	"strconv"
)

// What the worker takes from a source's tool list. Descriptions and
// schemas go into every model request of a run that uses the tool, and
// the list into the worker's presence: a source cannot make either
// unbounded.
const (
	// MaxToolDescriptionBytes: a longer description is cut (with "…").
	MaxToolDescriptionBytes = 8 << 10
	// MaxToolSchemaBytes: a tool with a larger input schema is refused.
	MaxToolSchemaBytes = 64 << 10
	// MaxSourceTools: the tools of one MCP server or tool service past
	// this many (in name order) are refused.
	MaxSourceTools = 256
	// maxRefusals bounds the refused tools a source lists as unavailable.
	maxRefusals = 64
)

// refusal is a tool a source announced and the worker does not serve.
type refusal struct {
	tool   string // clipped
	reason string
}

// toolBounds applies the bounds to one listing of a source and logs each
// refusal and cut with its reason, once: a listing that repeats the
// previous one's (a service is discovered every 30 s) logs nothing new.
type toolBounds struct {
	log      *slog.Logger
	kind     string            // "MCP tool", "tool service endpoint"
	prev     map[string]string // what the previous listing logged
	now      map[string]string
	refused  []refusal
	accepted int
	over     int
}

func newToolBounds(log *slog.Logger, kind string, prev map[string]string) *toolBounds {
	return &toolBounds{log: log, kind: kind, prev: prev, now: map[string]string{}}
}

// note logs msg unless the previous listing logged it for key.
func (b *toolBounds) note(key, what string, msg string, args ...any) {
	b.now[key] = what
	if b.prev[key] != what {
		b.log.Warn(msg, args...)
	}
}

func (b *toolBounds) refuse(tool, reason string) {
	tool = clip(tool, 80)
	b.note(tool, reason, b.kind+" refused: "+reason, "tool", tool)
	b.refused = append(b.refused, refusal{tool, reason})
}

// admit says whether one more tool fits; those that do not are refused
// and logged together (done).
func (b *toolBounds) admit(tool string) bool {
	if b.accepted >= MaxSourceTools {
		b.over++
		b.refused = append(b.refused, refusal{clip(tool, 80), fmt.Sprintf("its source has more than %d tools", MaxSourceTools)})
		return false
	}
	b.accepted++
	return true
}

// schema refuses a schema over MaxToolSchemaBytes.
func (b *toolBounds) schema(tool string, n int) bool {
	if n > MaxToolSchemaBytes {
		b.refuse(tool, fmt.Sprintf("its input schema is %d bytes, the limit is %d", n, MaxToolSchemaBytes))
		return false
	}
	return true
}

// description cuts a description over MaxToolDescriptionBytes.
func (b *toolBounds) description(tool, d string) string {
	if len(d) <= MaxToolDescriptionBytes {
		return d
	}
	tool = clip(tool, 80)
	b.note("cut:"+tool, strconv.Itoa(len(d)), b.kind+" description cut", "tool", tool, "bytes", len(d), "limit", MaxToolDescriptionBytes)
	return clip(d, MaxToolDescriptionBytes)
}

// done logs the tools past MaxSourceTools.
func (b *toolBounds) done(source string) {
	if b.over > 0 {
		b.note("#over", strconv.Itoa(b.over), fmt.Sprintf("%ss past the first %d of a source refused", b.kind, MaxSourceTools),
			"source", source, "refused", b.over)
	}
}

// refusedNames lists the first maxRefusals refused tools.
func refusedNames(rs []refusal) []string {
	rs = rs[:min(len(rs), maxRefusals)]
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.tool
	}
	return out
}

// reason says why tool was refused, if it was.
func reason(rs []refusal, tool string) (string, bool) {
	tool = clip(tool, 80)
	for _, r := range rs {
		if r.tool == tool {
			return r.reason, true
		}
	}
	return "", false
}
