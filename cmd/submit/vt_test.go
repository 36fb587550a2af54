package main

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// vt is a minimal VT100 screen: what a person sees of submit's output on
// a terminal. It knows only what submit emits (termui.go): text, \r, \n,
// \b, ESC[K, ESC[nA, ESC[nG and SGR colours, with the deferred wrap of real
// terminals at the last column; anything else is an error, so that a new
// escape in the renderer is taught to the model. Rows scrolled off the top
// go to the scrollback.
type vt struct {
	rows, cols int
	screen     [][]rune
	scrollback []string
	row, col   int
	wrapNext   bool // the last column was written: the next character wraps
	pending    []byte
	err        error
}

func newVT(rows, cols int) *vt {
	v := &vt{rows: rows, cols: cols, screen: make([][]rune, rows)}
	return v
}

// Write interprets output, as the terminal would.
func (v *vt) Write(p []byte) (int, error) {
	b := append(v.pending, p...)
	v.pending = nil
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == '\r':
			v.col, v.wrapNext = 0, false
			i++
		case c == '\n': // the tty's ONLCR: a carriage return too
			v.col = 0
			v.lineFeed()
			i++
		case c == '\b':
			v.col, v.wrapNext = max(0, v.col-1), false
			i++
		case c == 0x1b:
			j := i + 1
			if j >= len(b) {
				v.pending = append([]byte(nil), b[i:]...)
				return len(p), nil
			}
			if b[j] != '[' {
				v.fail("escape ESC %q", b[j])
				i = j + 1
				continue
			}
			j++
			for j < len(b) && (b[j] < 0x40 || b[j] > 0x7e) {
				j++
			}
			if j >= len(b) {
				v.pending = append([]byte(nil), b[i:]...)
				return len(p), nil
			}
			v.csi(string(b[i+2:j]), b[j])
			i = j + 1
		case c < 0x20:
			v.fail("control character %#x", c)
			i++
		default:
			if !utf8.FullRune(b[i:]) {
				v.pending = append([]byte(nil), b[i:]...)
				return len(p), nil
			}
			r, n := utf8.DecodeRune(b[i:])
			v.put(r)
			i += n
		}
	}
	return len(p), nil
}

func (v *vt) fail(format string, args ...any) {
	if v.err == nil {
		v.err = fmt.Errorf(format, args...)
	}
}

func (v *vt) csi(params string, final byte) {
	n := 1
	if params != "" && final != 'm' {
		var err error
		if n, err = strconv.Atoi(params); err != nil {
			v.fail("ESC[%s%c", params, final)
			return
		}
	}
	switch final {
	case 'm': // colours: not part of what is read
	case 'K':
		if params != "" {
			v.fail("ESC[%sK", params)
		}
		if v.col < len(v.screen[v.row]) {
			v.screen[v.row] = v.screen[v.row][:v.col]
		}
		v.wrapNext = false
	case 'A':
		v.row, v.wrapNext = max(0, v.row-n), false
	case 'G':
		v.col, v.wrapNext = min(max(n, 1), v.cols)-1, false
	default:
		v.fail("ESC[%s%c", params, final)
	}
}

func (v *vt) put(r rune) {
	if v.wrapNext {
		v.col = 0
		v.lineFeed()
	}
	line := v.screen[v.row]
	for len(line) < v.col {
		line = append(line, ' ')
	}
	if v.col < len(line) {
		line[v.col] = r
	} else {
		line = append(line, r)
	}
	v.screen[v.row] = line
	if v.col == v.cols-1 {
		v.wrapNext = true
	} else {
		v.col++
	}
}

// lineFeed moves down a row, scrolling at the bottom.
func (v *vt) lineFeed() {
	v.wrapNext = false
	if v.row < v.rows-1 {
		v.row++
		return
	}
	v.scrollback = append(v.scrollback, string(v.screen[0]))
	copy(v.screen, v.screen[1:])
	v.screen[v.rows-1] = nil
}

// resize changes the width for what follows; rows keep what they show.
func (v *vt) resize(cols int) {
	v.cols = cols
	v.col = min(v.col, cols-1)
}

// lines is everything shown: the scrollback, then the screen's rows up to
// the last one written, trailing spaces trimmed.
func (v *vt) lines() []string {
	out := append([]string(nil), v.scrollback...)
	last := -1
	for i, r := range v.screen {
		if strings.TrimSpace(string(r)) != "" || i == v.row {
			last = i
		}
	}
	for _, r := range v.screen[:last+1] {
		out = append(out, strings.TrimRight(string(r), " "))
	}
	return out
}

// cursorLine is the row the cursor is on.
func (v *vt) cursorLine() string { return strings.TrimRight(string(v.screen[v.row]), " ") }

func (v *vt) String() string { return strings.Join(v.lines(), "\n") }
