package main

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rivo/uniseg"
)

// streamingRun streams words 1-60 (after a thought), sleeps in a tool
// for sleep seconds, streams words 61-90, and answers a steering with
// words 501-510; 60 tokens of 4 characters a second.
func streamingRun(sleep float64) string {
	text := func(s string) string { return fmt.Sprintf(`{"type":"text","text":%q}`, s) }
	return `{"model":"faux/x","tools":["sleep"],"faux":{"tokenSize":1,"tokensPerSecond":60,"responses":[` +
		`{"content":[{"type":"thinking","thinking":"Let me count."},` + text(words(1, 60)) +
		fmt.Sprintf(`,{"type":"toolCall","id":"s1","name":"sleep","arguments":{"seconds":%g}}],"stopReason":"toolUse"},`, sleep) +
		`{"content":[` + text(words(61, 30)) + `]},` +
		`{"content":[` + text(words(501, 10)) + `]}]}}`
}

// shows reports whether a line on the screen contains s.
func shows(s string) func(*vt) bool {
	return func(v *vt) bool {
		return slices.ContainsFunc(v.lines(), func(l string) bool { return strings.Contains(l, s) })
	}
}

// joined finds the lines from the one starting with first to the one
// ending with last and joins them with spaces: the line as it was before
// wrapping, if the wrap broke it only between words.
func joined(t *testing.T, lines []string, first, last string) string {
	t.Helper()
	for i, l := range lines {
		if !strings.HasPrefix(l, first) {
			continue
		}
		for j := i; j < len(lines); j++ {
			if strings.HasSuffix(lines[j], last) {
				return strings.Join(lines[i:j+1], " ")
			}
		}
	}
	t.Fatalf("no lines from %q to %q:\n%s", first, last, strings.Join(lines, "\n"))
	return ""
}

// TestTypingWhileTextStreams types a steering line, a few keys at a time,
// while the answer streams on a 60-column terminal that is narrowed to 40
// midway, and reads the screen a person sees: what is typed is on the
// bottom row only, never inside the answer; no line breaks a word; every
// line fits the width (the new one after the resize); thinking is
// labelled; no status line is left behind.
func TestTypingWhileTextStreams(t *testing.T) {
	t.Parallel()
	p := startPTYSize(t, 24, 60, []string{"NO_COLOR="}, "--request", request(t, streamingRun(3)), "count")
	typed := ""
	typeKeys := func(s string) {
		t.Helper()
		p.typeLine(t, s)
		typed += s
		want := "» " + typed
		v := p.waitScreen(t, "the typed text on the cursor's row", func(v *vt) bool { return v.cursorLine() == strings.TrimRight(want, " ") }, 30*time.Second)
		for i, l := range v.lines() {
			if strings.Contains(l, strings.TrimSpace(typed)) && i != len(v.lines())-1 {
				t.Fatalf("typed text on a row other than the bottom one:\n%s", v)
			}
		}
	}
	p.waitScreen(t, "word0010", shows("word0010"), 30*time.Second)
	typeKeys("use ")
	p.waitScreen(t, "word0020", shows("word0020"), 30*time.Second)
	typeKeys("met")
	p.waitScreen(t, "word0035", shows("word0035"), 30*time.Second)
	// Narrowed while the run sleeps in its tool: nothing streams but the
	// status line, which fits either width.
	p.waitScreen(t, "the sleep tool running", shows("⚙ sleep"), 30*time.Second)
	p.resize(t, 40)
	p.waitScreen(t, "word0065", shows("word0065"), 30*time.Second)
	typeKeys("ric")
	p.waitScreen(t, "word0075", shows("word0075"), 30*time.Second)
	typeKeys(" units")
	p.typeLine(t, "\n")
	p.waitScreen(t, "the acknowledgement", shows("→ steering sent"), 30*time.Second)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.screen(t))
	}
	lines := p.screen(t).lines()
	screen := strings.Join(lines, "\n")

	var answer []string
	resized := false
	for _, l := range lines {
		if strings.HasPrefix(l, "⚙ sleep") {
			resized = true
		}
		if n, limit := len([]rune(l)), map[bool]int{false: 60, true: 40}[resized]; n > limit {
			t.Errorf("a line of %d columns on a terminal of %d:\n%q", n, limit, l)
		}
		switch {
		case strings.Contains(l, "word"):
			answer = append(answer, l)
		case strings.Contains(l, "use") || strings.Contains(l, "ric"):
			if l != "» you: use metric units" {
				t.Errorf("typed text outside the bottom row: %q", l)
			}
		}
	}
	checkWrapped(t, answer, words(1, 60)+" "+words(61, 30)+" "+words(501, 10), 60)
	expect(t, screen, "[thinking] Let me count.", "→ steering sent", "» you: use metric units", "── turn 3 ──")
	for _, status := range []string{"working ·", "running sleep ·", "turn 1 ·"} {
		if strings.Contains(screen, status) {
			t.Errorf("a status line was left on the screen (%q):\n%s", status, screen)
		}
	}
	// submit's own lines wrap between words.
	if h := joined(t, lines, "type a line to steer", "Ctrl-C detaches"); h != "type a line to steer · /followup TEXT queues a follow-up · /abort aborts · /approve [CALL], /deny [CALL] REASON answer an approval · Ctrl-C detaches" {
		t.Errorf("the hint, joined: %q", h)
	}
	if h := joined(t, lines, "● run ", "faux/x · tools sleep"); !regexp.MustCompile(`^● run \S+ · queue default · worker \S+ · faux/x · tools sleep$`).MatchString(h) {
		t.Errorf("the header, joined: %q", h)
	}
	if c := joined(t, lines, "✓ succeeded", "s"); !regexp.MustCompile(`^✓ succeeded · 3 turns · [\d,]+ tokens \([\d,]+ in, [\d,]+ out\) · \$0 · [\d.]+s$`).MatchString(c) {
		t.Errorf("the closing line, joined: %q", c)
	}
	t.Logf("the screen:\n%s", screen)
}

// TestApprovalStatusLeavesNoTrace answers an approval from the terminal
// while the status line says the run waits for it: neither the status
// nor the typed command stays on the screen.
func TestApprovalStatusLeavesNoTrace(t *testing.T) {
	t.Parallel()
	p := startPTYSize(t, 24, 80, nil, "--request", request(t, gatedRun(gateCalculator, calcCall, textReply("It is 42."))), "go")
	p.waitScreen(t, "the approval status line", func(v *vt) bool { return strings.HasPrefix(v.cursorLine(), "waiting for approval · turn 1 ·") }, 30*time.Second)
	p.typeLine(t, "/approve")
	p.waitScreen(t, "the command typed", func(v *vt) bool { return v.cursorLine() == "» /approve" }, 30*time.Second)
	p.typeLine(t, "\n")
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.screen(t))
	}
	screen := p.screen(t).String()
	expect(t, screen, "→ approve sent", "✓ approved c1", "It is 42.", "✓ succeeded")
	if strings.Contains(screen, "waiting for approval") || strings.Contains(screen, "» /approve") {
		t.Errorf("the status line or the typed command stayed:\n%s", screen)
	}
}

// widthTokens are n words of characters whose width is not their rune
// count: a combining mark, a ZWJ sequence, VS16 making an emoji wide, CJK;
// numbered from from so each is known.
func widthTokens(from, n int) []string {
	pieces := []string{"e\u0301te\u0301", "👩\u200d💻", "❤\ufe0f", "漢字", "ok"}
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%02d", pieces[(from+i)%len(pieces)], from+i)
	}
	return w
}

var widthToken = regexp.MustCompile(`^(e\x{301}te\x{301}|👩\x{200d}💻|❤\x{fe0f}|漢字|ok)\d\d$`)

// TestWidthsOfZeroWidthCharacters streams words with combining marks, ZWJ
// emoji, VS16 emoji and CJK on a 23-column terminal (a grapheme-aware
// one: vt_test.go) and types such characters: every line fits, no word is
// split or spaced apart (the cursor goes back to the right column after
// the bottom row), and the typed line, cut to fit, stays on one row with
// the cursor at its end.
func TestWidthsOfZeroWidthCharacters(t *testing.T) {
	t.Parallel()
	const cols = 23
	first, second := widthTokens(0, 20), widthTokens(20, 20)
	text := func(ws []string) string { return fmt.Sprintf(`{"type":"text","text":%q}`, strings.Join(ws, " ")) }
	run := `{"model":"faux/x","tools":["sleep"],"faux":{"tokenSize":1,"tokensPerSecond":20,"responses":[` +
		`{"content":[` + text(first) + `,{"type":"toolCall","id":"s1","name":"sleep","arguments":{"seconds":2}}],"stopReason":"toolUse"},` +
		`{"content":[` + text(second) + `]}]}}`
	p := startPTYSize(t, 24, cols, nil, "--request", request(t, run), "go")
	checkInput := func(typed string) {
		t.Helper()
		v := p.waitScreen(t, "the typed line", func(v *vt) bool {
			l := v.cursorLine()
			return strings.HasPrefix(l, "» ") && strings.HasSuffix(typed, strings.TrimPrefix(strings.TrimPrefix(l, "» "), "…"))
		}, 30*time.Second)
		l := v.cursorLine()
		if w := uniseg.StringWidth(l); w > cols-1 || v.cursorCol() != w {
			t.Fatalf("the typed line %q is %d columns, the cursor at column %d (terminal of %d):\n%s", l, w, v.cursorCol(), cols, v)
		}
		if !strings.HasPrefix(l, "» …") && l != "» "+typed {
			t.Fatalf("the typed line is %q, typed %q", l, typed)
		}
	}
	p.waitScreen(t, first[3], shows(first[3]), 30*time.Second)
	typed := ""
	for _, k := range []string{"❤\ufe0f", "e\u0301", "👩\u200d💻", " 漢"} {
		p.typeLine(t, k)
		typed += k
		checkInput(typed)
	}
	p.waitScreen(t, "the sleep tool running", shows("⚙ sleep"), 30*time.Second)
	// Longer than the row: its end is shown.
	for range 12 {
		p.typeLine(t, "❤\ufe0f")
		typed += "❤\ufe0f"
		checkInput(typed)
	}
	p.typeLine(t, "\x15") // Ctrl-U: nothing sent
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.screen(t))
	}
	var got []string
	for _, l := range p.screen(t).lines() {
		if w := uniseg.StringWidth(l); w > cols {
			t.Errorf("a line of %d columns on a terminal of %d: %q", w, cols, l)
		}
		if !slices.ContainsFunc(strings.Fields(l), widthToken.MatchString) {
			continue
		}
		if strings.Join(strings.Fields(l), " ") != l {
			t.Errorf("words spaced apart: %q", l)
		}
		got = append(got, strings.Fields(l)...)
	}
	if want := append(first, second...); !slices.Equal(got, want) {
		t.Errorf("the words shown:\n%q\nwant\n%q\n%s", got, want, p.screen(t))
	}
}

var typedPiece = regexp.MustCompile(`steer\d`)

// TestShrinkWhileTyping narrows a terminal that reflows (as tmux does)
// from 60 to 20 columns while a long line is being typed and the output's
// last line is wider than 20: no piece of the old, wider typed line is
// left on the screen, the typed line is drawn again to fit, and what
// streams after wraps at 20 columns by itself, whole words.
func TestShrinkWhileTyping(t *testing.T) {
	t.Parallel()
	text := func(s string) string { return fmt.Sprintf(`{"type":"text","text":%q}`, s) }
	run := `{"model":"faux/x","tools":["sleep"],"faux":{"tokenSize":1,"tokensPerSecond":60,"responses":[` +
		`{"content":[` + text(words(1, 40)) + `,{"type":"toolCall","id":"s1","name":"sleep","arguments":{"seconds":4}}],"stopReason":"toolUse"},` +
		`{"content":[` + text(words(41, 40)) + `]}]}}`
	p := startPTYSize(t, 40, 60, nil, "--request", request(t, run), "count")
	p.reflow = true
	p.waitScreen(t, "word0005", shows("word0005"), 30*time.Second)
	typed := "steer1 steer2 steer3 steer4 steer5 steer6 steer7"
	p.typeLine(t, typed)
	p.waitScreen(t, "the typed line", func(v *vt) bool { return v.cursorLine() == "» "+typed }, 30*time.Second)
	// Narrowed while the run sleeps in its tool: submit writes nothing
	// then (the typed line hides the status), so the terminal reflows
	// what it drew at 60 columns.
	p.waitScreen(t, "the sleep tool running", shows(`⚙ sleep {"seconds":4}`), 30*time.Second)
	p.resize(t, 20)
	v := p.waitScreen(t, "the typed line drawn again", func(v *vt) bool { return strings.HasPrefix(v.cursorLine(), "» …") }, 30*time.Second)
	if l := v.cursorLine(); !strings.HasSuffix(l, " steer6 steer7") || uniseg.StringWidth(l) != 19 {
		t.Errorf("the typed line, fitted to 20 columns: %q", l)
	}
	onlyBottom := func(v *vt) {
		t.Helper()
		lines := v.lines()
		for i, l := range lines[:len(lines)-1] {
			if typedPiece.MatchString(l) || strings.HasPrefix(l, "»") {
				t.Fatalf("a piece of the typed line on row %d, above the bottom one:\n%s", i, v)
			}
		}
	}
	onlyBottom(v)
	p.waitScreen(t, "word0050", shows("word0050"), 30*time.Second)
	onlyBottom(p.screen(t))
	p.typeLine(t, "\x15")
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.screen(t))
	}
	v = p.screen(t)
	lines, wrapped := v.lines(), v.wrapped()
	var got []string
	after := false
	for i, l := range lines {
		if typedPiece.MatchString(l) {
			t.Errorf("a piece of the typed line stayed: %q\n%s", l, v)
		}
		if strings.Contains(l, "word0041") {
			after = true
		}
		if after && (uniseg.StringWidth(l) > 20 || wrapped[i]) {
			t.Errorf("after the resize, a line the terminal had to wrap: %q\n%s", l, v)
		}
		if !strings.Contains(l, "word") {
			continue
		}
		if wrapped[i] && len(got) > 0 && !after { // a row the reflow broke off: one line with the one above
			l = got[len(got)-1] + l
			got = got[:len(got)-1]
		}
		got = append(got, l)
	}
	checkWrapped(t, strings.Fields(strings.Join(got, " ")), words(1, 80), 8)
	t.Logf("the screen:\n%s", v)
}
