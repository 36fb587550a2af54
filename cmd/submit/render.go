package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// style colours text with ANSI escapes, or not at all.
type style struct{ on bool }

func (s style) wrap(code, text string) string {
	if !s.on || text == "" {
		return text
	}
	return "\x1b[" + code + "m" + text + "\x1b[0m"
}

func (s style) dim(t string) string    { return s.wrap("2", t) }
func (s style) bold(t string) string   { return s.wrap("1", t) }
func (s style) red(t string) string    { return s.wrap("31", t) }
func (s style) green(t string) string  { return s.wrap("32", t) }
func (s style) yellow(t string) string { return s.wrap("33", t) }
func (s style) cyan(t string) string   { return s.wrap("36", t) }

// renderer turns a run's envelopes into terminal lines: assistant text as
// it streams, thinking dimmed (or hidden), one line per tool call with its
// arguments and outcome, turn separators and a closing line. It keeps the
// state it needs between envelopes; one renderer per run, one goroutine.
type renderer struct {
	scr          *screen // output; on a terminal it wraps and keeps a bottom row (termui.go)
	st           style
	hideThinking bool
	// showPrompt renders the run's own prompt (follow shows it; the
	// submitter typed it).
	showPrompt bool
	// live: a live status line may be drawn (a terminal).
	live bool
	// restoredFrom: the continued run already named (every attempt of a
	// continuation names it again).
	restoredFrom string

	block   string // "text" or "thinking": the open streamed block
	pending string // toolCallId whose line waits for its outcome
	// sep is a turn's separator, printed with the turn's first line (a
	// turn cut short by an abort shows none).
	sep    string
	status string // the live status line drawn
	// statusText is status before it was fitted to the width.
	statusText string
	typed      string // the line being typed
	input      string // typed, fitted to the bottom row
	users      int    // user messages seen (the first is the prompt)
	turns      int
	finished   *bus.RunFinished
	started    *bus.RunStarted
	// lastEvent is when the last envelope was rendered (live status).
	lastEvent time.Time
	toolRun   string // the tool running, for the status line
	// approvals are the gated calls waiting for an answer (approvals.go);
	// interactive: the follower may answer them.
	approvals   []pendingCall
	interactive bool
}

func newRenderer(w io.Writer, st style) *renderer {
	return &renderer{scr: &screen{w: w}, st: st}
}

// col is the column of the output's last line.
func (r *renderer) col() int { return r.scr.col }

// write prints text of the renderer's own: whole, its last word too.
func (r *renderer) write(s string) {
	r.scr.write(s)
	r.scr.settle()
}

// stream prints a streamed delta: its last word may go on in the next.
func (r *renderer) stream(s string) { r.scr.write(s) }

// newline ends the current line if something is on it.
func (r *renderer) newline() {
	r.scr.flush()
	if r.col() > 0 {
		r.write("\n")
	}
}

// println prints a whole line of the run, ending a pending one first.
func (r *renderer) println(s string) {
	r.closeBlock()
	r.flushSep()
	r.newline()
	r.write(s + "\n")
}

// flushSep prints the turn separator that waits for the turn's first line.
func (r *renderer) flushSep() {
	if sep := r.sep; sep != "" {
		r.sep = ""
		r.println(sep)
	}
}

func (r *renderer) closeBlock() {
	r.scr.flush()
	if r.block == "thinking" && r.st.on {
		r.write("\x1b[0m")
	}
	if r.block != "" {
		r.block = ""
		r.newline()
	}
	if r.pending != "" {
		r.pending = ""
		r.newline()
	}
}

// setStatus draws the live status line (only on a terminal) in the bottom
// row, unless a line is being typed there.
func (r *renderer) setStatus(s string) {
	if !r.live {
		return
	}
	r.statusText = s
	r.status = r.st.dim(fitBottom("", s, r.scr.width))
	r.drawBottom()
}

func (r *renderer) clearStatus() {
	r.status, r.statusText = "", ""
	r.drawBottom()
}

// setInput draws the line being typed in the bottom row.
func (r *renderer) setInput(text string) {
	r.typed, r.input = text, ""
	if text != "" {
		r.input = fitBottom(r.st.bold("» "), text, r.scr.width)
	}
	r.drawBottom()
}

func (r *renderer) drawBottom() {
	if r.input != "" {
		r.scr.setBottom(r.input)
	} else {
		r.scr.setBottom(r.status)
	}
}

// resize takes the terminal's new width for what follows.
func (r *renderer) resize(width int) {
	r.scr.resize(width)
	if r.statusText != "" {
		r.status = r.st.dim(fitBottom("", r.statusText, width))
	}
	r.setInput(r.typed)
}

// suspend removes the bottom row and the colours: the terminal goes to
// the shell (Ctrl-Z).
func (r *renderer) suspend() { r.scr.suspend() }

// resumed draws the bottom row again after a stop.
func (r *renderer) resumed() { r.scr.resume() }

// end removes the bottom row and ends the output's line: submit is done
// with the terminal.
func (r *renderer) end() {
	r.closeBlock()
	r.input, r.status = "", ""
	r.drawBottom()
}

// note prints a line of the CLI's own (steering sent, ...), dimmed; a
// block streaming goes on after it, no word split.
func (r *renderer) note(s string) {
	r.scr.insertLine(r.scr.w, r.st.dim(s))
}

// lineTo prints a line of the CLI's own to w (stderr), as note does.
func (r *renderer) lineTo(w io.Writer, s string) {
	r.scr.insertLine(w, s)
}

// Render prints one envelope.
func (r *renderer) Render(env *bus.Envelope) error {
	ev, err := env.Decode()
	if err != nil {
		return err
	}
	r.lastEvent = time.Now()
	switch ev.Type {
	case bus.EventRunStarted:
		r.runStarted(env, ev.RunStarted)
	case bus.EventRunResumed:
		r.println(r.st.dim(fmt.Sprintf("↻ attempt %d resumes the run (%d messages restored)", ev.RunResumed.Attempt, ev.RunResumed.MessagesRestored)))
	case bus.EventTranscriptRestored:
		if tr := ev.Restored; tr.From != r.restoredFrom {
			r.restoredFrom = tr.From
			r.println(r.st.dim(fmt.Sprintf("continued from %s (%d messages)", tr.From, tr.Messages)))
		}
	case bus.EventRunFinished:
		r.finished, r.approvals, r.sep = ev.RunFinished, nil, ""
		r.println(closingLine(r.st, ev.RunFinished))
	case bus.EventToolApprovalRequested, bus.EventToolApprovalResolved, bus.EventToolApprovalRejected:
		r.approvalEvent(env, ev.Type)
	case bus.EventControlRejected:
		cr := ev.Control
		r.println(r.st.yellow(fmt.Sprintf("! %s (control sequence %d) not taken: %s", kindName(cr.Kind), cr.ControlSeq, cut(field(oneLine(cr.Reason)), 300))))
	case bus.EventModelWait:
		r.println(r.st.dim(fmt.Sprintf("⏳ the model call waited %s for the fleet's rate limits", time.Duration(ev.ModelWait.WaitedMs)*time.Millisecond)))
	case bus.EventCompactionStart, bus.EventCompactionEnd:
		if line := compactionLine(ev); line != "" {
			r.println(r.st.dim(line))
		}
	default:
		if ev.Agent != nil {
			r.agentEvent(env, ev.Agent)
		}
	}
	return nil
}

func (r *renderer) runStarted(env *bus.Envelope, rs *bus.RunStarted) {
	r.started = rs
	r.users, r.turns = 0, 0
	parts := []string{"run " + env.Run}
	if rs.Attempt > 1 {
		parts = append(parts, fmt.Sprintf("attempt %d", rs.Attempt))
	}
	parts = append(parts, "queue "+rs.Queue, "worker "+rs.Worker)
	if rs.Model != nil {
		parts = append(parts, rs.Model.String())
	}
	if len(rs.Tools) > 0 {
		parts = append(parts, "tools "+strings.Join(rs.Tools, ","))
	}
	if rs.ContinueFrom != "" {
		parts = append(parts, "continues "+rs.ContinueFrom)
	}
	if c := rs.Child; c != nil { // a child run (protocol 1.10)
		parts = append(parts, fmt.Sprintf("child of %s (depth %d)", c.ParentRunID, c.Depth))
	}
	r.println(r.st.dim("● " + field(strings.Join(parts, " · "))))
	if rs.Notice != "" {
		r.println(r.st.yellow("! " + sanitize(rs.Notice)))
	}
}

func (r *renderer) agentEvent(env *bus.Envelope, ev *bus.AgentEvent) {
	switch agent.EventType(ev.Type) {
	case agent.EventTurnStart:
		r.turns++
		if r.turns > 1 {
			r.sep = r.st.dim(fmt.Sprintf("── turn %d ──", r.turns))
		}
	case agent.EventMessageUpdate:
		if ev.AssistantMessageEvent != nil {
			r.streamEvent(ev.AssistantMessageEvent)
		}
	case agent.EventMessageEnd:
		r.messageEnd(env, ev.Message)
	case agent.EventToolExecutionStart:
		r.closeBlock()
		r.flushSep()
		r.newline()
		args, _ := json.Marshal(ev.Args)
		r.write(r.st.cyan("⚙ "+sanitize(ev.ToolName)) + " " + cut(sanitize(string(args)), r.room(len(ev.ToolName)+3, 2)))
		r.pending = ev.ToolCallID
		r.toolRun = ev.ToolName
	case agent.EventToolExecutionEnd:
		r.settle(ev.ToolCallID)
		r.toolEnd(ev)
	}
}

// room is how many characters fit after used ones, keeping some for what
// follows; a default when the width is unknown.
func (r *renderer) room(used, div int) int {
	if r.scr.width <= 0 {
		return 200 / div
	}
	return max(20, (r.scr.width-used)/div)
}

func (r *renderer) streamEvent(se *agent.StreamEvent) {
	switch se.Type {
	case agent.StreamTextStart:
		r.closeBlock()
		r.flushSep()
		r.newline()
		r.block = "text"
	case agent.StreamTextDelta:
		if r.block != "text" {
			r.closeBlock()
			r.flushSep()
			r.newline()
			r.block = "text"
		}
		r.stream(sanitize(se.Delta))
	case agent.StreamThinkingStart:
		r.closeBlock()
		if !r.hideThinking {
			r.openThinking()
		}
	case agent.StreamThinkingDelta:
		if r.hideThinking {
			return
		}
		if r.block != "thinking" {
			r.closeBlock()
			r.openThinking()
		}
		r.stream(sanitize(se.Delta))
	case agent.StreamTextEnd, agent.StreamThinkingEnd:
		r.closeBlock()
	}
}

func (r *renderer) messageEnd(env *bus.Envelope, m *agent.Message) {
	if m == nil {
		return
	}
	switch m.Role {
	case agent.RoleUser:
		r.users++
		if env.ControlSeq > 0 {
			r.println(r.st.bold("» you: ") + cut(sanitize(m.TextOf()), 500))
		} else if r.users > 1 || r.showPrompt {
			r.println(r.st.bold("» ") + cut(sanitize(m.TextOf()), 500))
		}
	case agent.RoleAssistant:
		r.closeBlock()
		if m.StopReason == agent.StopReasonError {
			msg := m.ErrorMessage
			if msg == "" {
				msg = "unknown error"
			}
			r.println(r.st.red("✗ model error: " + cut(sanitize(msg), 500)))
		}
	}
}

func (r *renderer) toolEnd(ev *bus.AgentEvent) {
	outcome := r.st.green("ok")
	if ev.IsError != nil && *ev.IsError {
		outcome = r.st.red("error")
	}
	res := ""
	if ev.Result != nil {
		var b strings.Builder
		for _, c := range ev.Result.Content {
			if c.Type == agent.ContentText {
				b.WriteString(c.Text)
			}
		}
		res = oneLine(b.String())
	}
	if r.pending == ev.ToolCallID && r.col() > 0 {
		r.pending = ""
		s := " → " + outcome
		if res != "" {
			s += ": " + cut(sanitize(res), r.room(r.col()+12, 1))
		}
		r.write(s + "\n")
	} else {
		s := r.st.cyan("  ↳ "+sanitize(ev.ToolName)) + " → " + outcome
		if res != "" {
			s += ": " + cut(sanitize(res), r.room(len(ev.ToolName)+16, 1))
		}
		r.println(s)
	}
	r.toolRun = ""
}

// closingLine is the last line of a run: status, turns, tokens, cost and
// duration.
func closingLine(st style, f *bus.RunFinished) string {
	var head string
	switch f.Status {
	case bus.StatusSucceeded:
		head = st.green("✓ succeeded")
	case bus.StatusAborted:
		head = st.yellow("■ aborted")
		if f.Error != "" {
			head += st.yellow(": " + cut(sanitize(oneLine(f.Error)), 300))
		}
	default:
		head = st.red("✗ " + f.Status)
		if f.Reason != "" {
			head += st.red(" (" + f.Reason + ")")
		}
		if f.Error != "" {
			head += st.red(": " + cut(sanitize(oneLine(f.Error)), 300))
		}
	}
	turns := "turns"
	if f.Turns == 1 {
		turns = "turn"
	}
	u := f.Usage
	tokens := fmt.Sprintf("%s tokens (%s in, %s out)", thousands(u.TotalTokens), thousands(u.Input), thousands(u.Output))
	return head + st.dim(fmt.Sprintf(" · %d %s · %s · %s · %s", f.Turns, turns, tokens, money(f.Cost),
		fmtDuration(time.Duration(f.DurationMs)*time.Millisecond)))
}

func money(c float64) string {
	switch {
	case c == 0:
		return "$0"
	case c < 0.01:
		return fmt.Sprintf("$%.4f", c)
	default:
		return fmt.Sprintf("$%.2f", c)
	}
}

func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	default:
		return d.Round(time.Second).String()
	}
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// oneLine returns the first non-empty line of s, with "…" when there was more.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return strings.TrimSpace(s[:i]) + " …"
	}
	return s
}

// cut shortens s to n characters, with "…".
func cut(s string, n int) string {
	if n <= 1 || utf8.RuneCountInString(s) <= n {
		return s
	}
	rs := []rune(s)
	return string(rs[:n-1]) + "…"
}

// sanitize removes control characters except newline and tab, so model
// output cannot drive the terminal (escape sequences, carriage returns).
func sanitize(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f {
			clean = false
			break
		}
	}
	if clean && !strings.ContainsRune(s, 0x9b) {
		return s
	}
	return strings.Map(func(r rune) rune {
		if (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return -1
		}
		return r
	}, s)
}

// stripANSI removes the escape sequences style adds (for column counting
// and for tests).
// field is sanitize for a value shown on one line (a table cell, a
// banner): line breaks and tabs become spaces, so a value cannot forge rows.
func field(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' || r == '\r' {
			return ' '
		}
		return r
	}, sanitize(s))
}

func stripANSI(s string) string {
	if !strings.Contains(s, "\x1b[") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// openThinking starts a thinking block, labelled: dim italic on a
// terminal (the header and hints are dim too), marked when plain.
func (r *renderer) openThinking() {
	r.flushSep()
	r.newline()
	r.block = "thinking"
	if r.st.on {
		r.stream(r.st.cyan("[thinking]") + " \x1b[2;3m")
	} else {
		r.stream("[thinking] ")
	}
}

// compactionLine is submit follow's line for a compaction (since 1.10):
// one when it ends (its start only when a manual one begins), with the
// tokens before and after and the summary's first line.
func compactionLine(ev *bus.Event) string {
	if s := ev.CompactionStart; s != nil {
		if s.Reason != bus.CompactionManual {
			return ""
		}
		return fmt.Sprintf("⇣ compacting the context (asked, control sequence %d)…", s.ControlSeq)
	}
	e := ev.CompactionEnd
	if e.Cancelled {
		return "⇣ compaction cancelled (the run stopped or moved; the next attempt compacts again)"
	}
	if e.Error != "" {
		return "⇣ compaction failed: " + cut(field(oneLine(e.Error)), 300)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(e.Summary), "\n")
	return fmt.Sprintf("⇣ context compacted (%s): %d → %d tokens, %d messages summarised, kept from message %d · %s",
		e.Reason, e.TokensBefore, e.TokensAfter, e.MessagesSummarized, e.FirstKeptIndex, cut(field(first), 80))
}
