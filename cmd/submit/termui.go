package main

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/rivo/uniseg"
)

// screen is where a followed run is printed. On a terminal it wraps the
// output at word boundaries to the terminal's width and keeps the bottom
// row for the line being typed (or the live status): before output it
// clears that row and puts the cursor back at the end of the output, after
// it draws the row again below. On a pipe (no width, no bottom row) it
// passes the output through unchanged.
//
// Escapes it emits: \r, \n, ESC[K (clear to the end of the row), ESC[J
// (to the end of the screen), ESC[nA (up n rows), ESC[nG (to column n)
// and the SGR colours it is given.
type screen struct {
	w     io.Writer
	width int // columns; 0: no wrapping
	col   int // columns printed on the output's last line
	// last is the last character (grapheme cluster) on the output's last
	// line: what follows may join it.
	last string
	// sgr is the colour escapes in force in the output (since the last
	// reset): the bottom row is drawn without them, the output goes on
	// with them.
	sgr string
	// A word being received is held until its end (a space, a newline,
	// the end of the block) says which line it goes on; spaces are
	// printed only before the next word on the same line.
	word   strings.Builder
	wordW  int
	spaces int
	bottom string // the bottom row's text, "" for none
	shown  bool   // the bottom row is drawn; the cursor is at its end
}

// write prints output text (which may hold SGR escapes).
func (s *screen) write(text string) {
	if text == "" {
		return
	}
	s.hide()
	s.feed(text)
	s.show()
}

// flush ends a block of output: the word held is printed, trailing spaces
// dropped.
func (s *screen) flush() {
	if s.word.Len() == 0 && s.spaces == 0 {
		return
	}
	s.hide()
	s.flushWord()
	s.spaces = 0
	s.show()
}

// settle prints the word held, keeping the spaces after it pending: the
// text written is whole.
func (s *screen) settle() {
	if s.word.Len() == 0 {
		return
	}
	s.hide()
	s.flushWord()
	s.show()
}

// insertLine prints a whole line of submit's own (an acknowledgement, a
// notice) to w (the output or stderr) while a block may be streaming: the
// output's last line ends after its last whole word, the line is printed
// (wrapped), and the word being received goes on below it. No word is
// ever split.
func (s *screen) insertLine(w io.Writer, line string) {
	s.hide()
	if s.col > 0 {
		s.out("\n")
	}
	word, wordW, sgr := s.word.String(), s.wordW, s.sgr
	s.word.Reset()
	s.wordW, s.spaces = 0, 0
	if sgr != "" {
		s.out("\x1b[0m")
	}
	if w == s.w {
		s.feed(line + "\n")
	} else {
		// Another stream (stderr on the same terminal): wrapped alike, the
		// output's column unchanged (0).
		_, _ = io.WriteString(w, wrapText(line, s.width)+"\n")
	}
	if sgr != "" {
		s.out(sgr)
	}
	s.word.WriteString(word)
	s.wordW = wordW
	s.show()
}

// setBottom draws text in the bottom row ("" removes the row). The text
// must fit the width (see fitBottom).
func (s *screen) setBottom(text string) {
	if text == s.bottom {
		return
	}
	if s.shown && text != "" {
		_, _ = io.WriteString(s.w, "\r\x1b[K"+text)
		s.bottom = text
		return
	}
	s.hide()
	s.bottom = text
	s.show()
}

// resize takes the terminal's new width for what follows; the bottom row
// is then to be set again, fitted to it. A terminal that reflows on a
// shrink (tmux, VTE, kitty, iTerm2 and most others) has broken the bottom
// row into rows of the new width, the cursor on the last: they are all
// cleared, not only that one, and the output's last line, broken too if
// now wider than the terminal, is left as it is: what follows goes on
// below it. (A terminal that does not reflow, xterm, loses the rows of
// output above the bottom row from its screen.)
func (s *screen) resize(width int) {
	if width == s.width {
		return
	}
	if !s.shown || width <= 0 || s.width > 0 && width > s.width {
		s.hide()
		s.width, s.bottom = width, ""
		return
	}
	if up := rowsAt(s.bottom, width) - 1; up > 0 {
		_, _ = fmt.Fprintf(s.w, "\x1b[%dA", up)
	}
	_, _ = io.WriteString(s.w, "\r\x1b[J")
	s.shown = false
	if s.col >= width {
		s.col, s.last, s.spaces = 0, "", 0 // no spaces at the start of the row
	} else if s.col > 0 {
		_, _ = fmt.Fprintf(s.w, "\x1b[A\x1b[%dG", s.col+1)
	}
	if s.sgr != "" {
		_, _ = io.WriteString(s.w, s.sgr)
	}
	// The bottom row's text was fitted to the old width: the caller
	// draws it anew (setBottom).
	s.width, s.bottom = width, ""
}

// rowsAt is the rows text takes on a terminal width columns wide, broken
// between characters (a wide one that does not fit goes to the next row).
func rowsAt(text string, width int) int {
	rows, x := 1, 0
	for _, g := range graphemes(stripANSI(text)) {
		w := uniseg.StringWidth(g)
		if x+w > width {
			rows, x = rows+1, 0
		}
		x += w
	}
	return rows
}

// suspend clears the bottom row and the colours for the shell, which
// takes the terminal (Ctrl-Z).
func (s *screen) suspend() {
	s.hide()
	if s.sgr != "" {
		_, _ = io.WriteString(s.w, "\x1b[0m")
	}
}

// resume takes the terminal back after a stop: the shell has printed
// below the output (fg), the cursor is at the start of a row of its own,
// or, stopped without the shell, on the bottom row still. What follows
// starts on that row, the bottom row below it.
func (s *screen) resume() {
	_, _ = io.WriteString(s.w, "\r\x1b[K"+s.sgr)
	s.shown = false
	s.col, s.last, s.spaces = 0, "", 0
	s.show()
}

// hide clears the bottom row and puts the cursor back at the end of the
// output.
func (s *screen) hide() {
	if !s.shown {
		return
	}
	_, _ = io.WriteString(s.w, "\r\x1b[K")
	if s.col > 0 {
		_, _ = fmt.Fprintf(s.w, "\x1b[A\x1b[%dG", s.col+1)
	}
	if s.sgr != "" {
		_, _ = io.WriteString(s.w, s.sgr)
	}
	s.shown = false
}

// show draws the bottom row below the output.
func (s *screen) show() {
	if s.shown || s.bottom == "" {
		return
	}
	if s.sgr != "" {
		_, _ = io.WriteString(s.w, "\x1b[0m")
	}
	if s.col > 0 {
		_, _ = io.WriteString(s.w, "\n")
	}
	_, _ = io.WriteString(s.w, "\r\x1b[K"+s.bottom)
	s.shown = true
}

// feed wraps text into the output.
func (s *screen) feed(text string) {
	if s.width <= 0 {
		s.out(text)
		return
	}
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == 0x1b:
			j := escapeEnd(text, i)
			if s.word.Len() > 0 || s.spaces > 0 {
				s.word.WriteString(text[i:j])
			} else {
				s.out(text[i:j])
			}
			i = j
		case c == '\n':
			s.flushWord()
			s.spaces = 0
			s.out("\n")
			i++
		case c == ' ':
			s.flushWord()
			s.spaces++
			i++
		case c == '\t':
			s.flushWord()
			s.spaces += 8 - (s.col+s.spaces)%8
			i++
		default:
			// A run of characters up to the next space, newline or escape:
			// measured whole with the word held, as a mark or a joiner
			// changes the width of the character before it.
			j := i + 1
			for j < len(text) && text[j] != 0x1b && text[j] != '\n' && text[j] != ' ' && text[j] != '\t' {
				j++
			}
			for _, g := range graphemes(text[i:j]) {
				s.word.WriteString(g)
				s.wordW = textWidth(s.word.String())
				if s.wordW >= s.width {
					s.flushWord() // longer than a line: no end to wait for
				}
			}
			i = j
		}
	}
}

// flushWord prints the word held: on this line if it fits after the
// spaces, else on the next; a word longer than a line is broken at its end.
func (s *screen) flushWord() {
	if s.word.Len() == 0 {
		return
	}
	w := s.word.String()
	s.word.Reset()
	if s.wordW == 0 { // escapes only: the spaces wait for a word
		s.out(w)
		return
	}
	if s.col > 0 && s.col+s.spaces+s.wordW > s.width {
		s.out("\n")
	} else if s.spaces > 0 && s.col+s.spaces < s.width {
		s.out(strings.Repeat(" ", s.spaces))
	}
	s.spaces = 0
	for s.col+s.wordW > s.width {
		head, rest := splitVisible(w, s.width-s.col)
		s.out(head + "\n")
		s.wordW -= textWidth(head)
		w = rest
	}
	s.out(w)
	s.wordW = 0
}

// out writes text that needs no wrapping, keeping the column and the
// colour state.
func (s *screen) out(text string) {
	_, _ = io.WriteString(s.w, text)
	for i := 0; i < len(text); {
		switch c := text[i]; {
		case c == '\n':
			s.col, s.last = 0, ""
			i++
		case c == 0x1b:
			j := escapeEnd(text, i)
			if seq := text[i:j]; strings.HasSuffix(seq, "m") {
				if seq == "\x1b[0m" || seq == "\x1b[m" {
					s.sgr = ""
				} else {
					s.sgr += seq
				}
			}
			i = j
		default:
			j := i + 1
			for j < len(text) && text[j] != 0x1b && text[j] != '\n' {
				j++
			}
			// Measured with the line's last character: a mark or a
			// joiner written after it may change its width.
			seg := s.last + text[i:j]
			s.col += uniseg.StringWidth(seg) - uniseg.StringWidth(s.last)
			gs := graphemes(seg)
			s.last = gs[len(gs)-1]
			i = j
		}
	}
}

// textWidth is the columns text takes, escapes aside: a grapheme
// cluster's (uniseg), so a combining mark or a zero-width joiner adds
// none and VS16 makes an emoji two wide.
func textWidth(text string) int { return uniseg.StringWidth(stripANSI(text)) }

// graphemes splits text into its characters as a person counts them
// (grapheme clusters).
func graphemes(text string) []string {
	var out []string
	state := -1
	for text != "" {
		var g string
		g, text, _, state = uniseg.FirstGraphemeClusterInString(text, state)
		out = append(out, g)
	}
	return out
}

// escapeEnd returns the end of the escape sequence at text[i] (ESC [ ...
// final byte).
func escapeEnd(text string, i int) int {
	j := i + 1
	if j < len(text) && text[j] == '[' {
		j++
		for j < len(text) && (text[j] < 0x40 || text[j] > 0x7e) {
			j++
		}
		if j < len(text) {
			j++
		}
	}
	return j
}

// splitVisible splits text after at most n columns (escapes go with the
// head), at least one character.
func splitVisible(text string, n int) (head, rest string) {
	first := true
	for i := 0; i < len(text); {
		if text[i] == 0x1b {
			i = escapeEnd(text, i)
			continue
		}
		j := i + 1
		for j < len(text) && text[j] != 0x1b {
			j++
		}
		for _, g := range graphemes(text[i:j]) {
			if w := uniseg.StringWidth(g); w > n && !first {
				return text[:i], text[i:]
			} else {
				n -= w
			}
			first = false
			i += len(g)
		}
	}
	return text, ""
}

// wrapText wraps a whole text at word boundaries to width (0: as it is).
func wrapText(text string, width int) string {
	var b strings.Builder
	s := &screen{w: &b, width: width}
	s.feed(text)
	s.flushWord()
	return b.String()
}

// fitBottom makes a bottom row fit width-1 columns (the last column would
// wrap on some terminals), keeping its end: what is being typed.
func fitBottom(prefix, text string, width int) string {
	if width <= 0 {
		return prefix + text
	}
	room := width - 1 - textWidth(prefix)
	if textWidth(text) > room && room > 1 {
		gs := graphemes(text)
		w := 1 // "…"
		i := len(gs)
		for i > 0 && w+uniseg.StringWidth(gs[i-1]) <= room {
			i--
			w += uniseg.StringWidth(gs[i])
		}
		text = "…" + strings.Join(gs[i:], "")
	}
	return prefix + text
}

// lineInput is the line being typed while a run is followed, the terminal
// in cbreak mode (no echo, keys as they come): submit draws it in the
// bottom row. Enter sends it; Backspace, Ctrl-U and Ctrl-W edit it;
// cursor keys and other escape sequences are ignored.
type lineInput struct {
	buf []rune
	esc int    // 1 after ESC, 2 in ESC [ ... or ESC O
	utf []byte // an incomplete UTF-8 sequence
}

// feed takes the bytes typed and returns the lines ended by Enter; eof is
// Ctrl-D on an empty line.
func (in *lineInput) feed(b []byte) (lines []string, eof bool) {
	b = append(in.utf, b...)
	in.utf = nil
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case in.esc == 1:
			in.esc = 0
			if c == '[' || c == 'O' {
				in.esc = 2
			}
			i++
			continue
		case in.esc == 2:
			if c >= 0x40 && c <= 0x7e {
				in.esc = 0
			}
			i++
			continue
		}
		switch {
		case c == 0x1b:
			in.esc = 1
		case c == '\r' || c == '\n':
			lines = append(lines, string(in.buf))
			in.buf = in.buf[:0]
		case c == 0x7f || c == 0x08: // Backspace: the last character, marks and all
			if gs := graphemes(string(in.buf)); len(gs) > 0 {
				in.buf = in.buf[:len(in.buf)-utf8.RuneCountInString(gs[len(gs)-1])]
			}
		case c == 0x15: // Ctrl-U
			in.buf = in.buf[:0]
		case c == 0x17: // Ctrl-W: the last word
			n := len(in.buf)
			for n > 0 && in.buf[n-1] == ' ' {
				n--
			}
			for n > 0 && in.buf[n-1] != ' ' {
				n--
			}
			in.buf = in.buf[:n]
		case c == 0x04: // Ctrl-D
			if len(in.buf) == 0 {
				return lines, true
			}
		case c < 0x20:
		default:
			if !utf8.FullRune(b[i:]) {
				in.utf = append([]byte(nil), b[i:]...)
				return lines, false
			}
			r, n := utf8.DecodeRune(b[i:])
			if r != utf8.RuneError && r >= 0xa0 || r < 0x80 {
				in.buf = append(in.buf, r)
			}
			i += n
			continue
		}
		i++
	}
	return lines, false
}

func (in *lineInput) text() string { return string(in.buf) }
