package main

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/rivo/uniseg"
)

// vt is a minimal VT100 screen: what a person sees of submit's output on
// a terminal. It knows only what submit emits (termui.go): text, \r, \n,
// \b, ESC[K, ESC[J, ESC[nA, ESC[nG and SGR colours, with the deferred wrap of real
// terminals at the last column; anything else is an error, so that a new
// escape in the renderer is taught to the model. Rows scrolled off the top
// go to the scrollback. A cell holds a character as a grapheme-aware
// terminal shows it (a grapheme cluster, uniseg's width): a mark, a joiner
// or VS16 written right after a character joins its cell, and a wide one
// takes the next cell too ("" there).
type vt struct {
	rows, cols int
	screen     [][]string
	scrollback []string
	scrollCont []bool
	row, col   int
	wrapNext   bool // the last column was written: the next character wraps
	// joinAt is the cell written last, while the cursor has not moved but
	// for that write: what follows may join it.
	joinAt   [2]int
	joinable bool
	// reflow: a shrink breaks rows wider than the terminal into rows of
	// its width, the cursor going with its cell, as tmux does (else rows
	// keep what they show, as xterm). cont marks a row that goes on the
	// row above (broken by a wrap or a reflow).
	reflow  bool
	cont    []bool
	pending []byte
	err     error
}

func newVT(rows, cols int) *vt {
	v := &vt{rows: rows, cols: cols, screen: make([][]string, rows), cont: make([]bool, rows)}
	return v
}

// Write interprets output, as the terminal would.
func (v *vt) Write(p []byte) (int, error) {
	b := append(v.pending, p...)
	v.pending = nil
	for i := 0; i < len(b); {
		c := b[i]
		if c < 0x20 {
			v.joinable = false
		}
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
	case 'J':
		if params != "" {
			v.fail("ESC[%sJ", params)
		}
		if v.col < len(v.screen[v.row]) {
			v.screen[v.row] = v.screen[v.row][:v.col]
		}
		for i := v.row + 1; i < v.rows; i++ {
			v.screen[i], v.cont[i] = nil, false
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
	if v.joinable {
		row, col := v.joinAt[0], v.joinAt[1]
		cell := v.screen[row][col]
		if g, rest, _, _ := uniseg.FirstGraphemeClusterInString(cell+string(r), -1); rest == "" {
			v.screen[row][col] = g
			if uniseg.StringWidth(g) > uniseg.StringWidth(cell) && col+1 < v.cols {
				v.set(row, col+1, "")
				if col+2 < v.cols {
					v.col = col + 2
				} else {
					v.col, v.wrapNext = v.cols-1, true
				}
			}
			return
		}
	}
	w := uniseg.StringWidth(string(r))
	if w == 0 {
		return // joins nothing: not shown
	}
	if v.wrapNext || w == 2 && v.col == v.cols-1 {
		v.col = 0
		v.lineFeed()
		v.cont[v.row] = true
	}
	v.set(v.row, v.col, string(r))
	if w == 2 {
		v.set(v.row, v.col+1, "")
	}
	v.joinAt, v.joinable = [2]int{v.row, v.col}, true
	if v.col+w >= v.cols {
		v.col, v.wrapNext = v.cols-1, true
	} else {
		v.col += w
	}
}

// set writes a cell; a wide character it overwrites half of is blanked.
func (v *vt) set(row, col int, cell string) {
	line := v.screen[row]
	for len(line) <= col {
		line = append(line, " ")
	}
	if line[col] == "" && col > 0 && cell != "" {
		line[col-1] = " "
	}
	if col+1 < len(line) && line[col+1] == "" && uniseg.StringWidth(line[col]) == 2 {
		line[col+1] = " "
	}
	line[col] = cell
	v.screen[row] = line
}

// lineFeed moves down a row, scrolling at the bottom.
func (v *vt) lineFeed() {
	v.wrapNext = false
	if v.row < v.rows-1 {
		v.row++
		v.cont[v.row] = false
		return
	}
	v.scrollback = append(v.scrollback, strings.Join(v.screen[0], ""))
	v.scrollCont = append(v.scrollCont, v.cont[0])
	v.joinAt[0]--
	copy(v.screen, v.screen[1:])
	copy(v.cont, v.cont[1:])
	v.screen[v.rows-1], v.cont[v.rows-1] = nil, false
}

// resize changes the width for what follows; on a shrink with reflow, rows
// wider than cols are broken (the top rows going to the scrollback if the
// screen overflows), else rows keep what they show.
func (v *vt) resize(cols int) {
	if v.reflow && cols < v.cols {
		last := v.row
		for i := range v.screen {
			if strings.TrimSpace(strings.Join(v.screen[i], "")) != "" {
				last = max(last, i)
			}
		}
		var rows [][]string
		var cont []bool
		row, col := 0, 0
		for i := 0; i <= last; i++ {
			cells := v.screen[i]
			for len(cells) > 0 && cells[len(cells)-1] == " " && !(i == v.row && len(cells) <= v.col) {
				cells = cells[:len(cells)-1]
			}
			start, x := 0, 0
			var chunks [][]string
			var starts []int
			for j := 0; j < len(cells); j++ {
				if cells[j] == "" {
					continue
				}
				w := uniseg.StringWidth(cells[j])
				if x+w > cols {
					chunks, starts = append(chunks, cells[start:j]), append(starts, start)
					start, x = j, 0
				}
				x += w
				if w == 2 {
					j++
				}
			}
			chunks, starts = append(chunks, cells[start:]), append(starts, start)
			for k, c := range chunks {
				if i == v.row {
					at := v.col
					if v.wrapNext {
						at++
					}
					if at >= starts[k] && (k == len(chunks)-1 || at < starts[k+1]) {
						row, col = len(rows), at-starts[k]
					}
				}
				rows = append(rows, append([]string(nil), c...))
				cont = append(cont, k > 0 || v.cont[i])
			}
		}
		for len(rows) > v.rows {
			v.scrollback = append(v.scrollback, strings.Join(rows[0], ""))
			v.scrollCont = append(v.scrollCont, cont[0])
			rows, cont, row = rows[1:], cont[1:], row-1
		}
		v.screen, v.cont = make([][]string, v.rows), make([]bool, v.rows)
		copy(v.screen, rows)
		copy(v.cont, cont)
		v.row, v.col, v.wrapNext, v.joinable = row, col, false, false
		if col >= cols {
			v.col, v.wrapNext = cols-1, true
		}
	}
	v.cols = cols
	v.col = min(v.col, cols-1)
}

// lines is everything shown: the scrollback, then the screen's rows up to
// the last one written, trailing spaces trimmed.
func (v *vt) lines() []string {
	out := append([]string(nil), v.scrollback...)
	last := -1
	for i, r := range v.screen {
		if strings.TrimSpace(strings.Join(r, "")) != "" || i == v.row {
			last = i
		}
	}
	for _, r := range v.screen[:last+1] {
		out = append(out, strings.TrimRight(strings.Join(r, ""), " "))
	}
	return out
}

// wrapped reports, for each of lines, whether the terminal broke it off
// the line above (an autowrap or a reflow) rather than a newline.
func (v *vt) wrapped() []bool {
	out := append([]bool(nil), v.scrollCont...)
	return append(out, v.cont[:len(v.lines())-len(v.scrollback)]...)
}

// cursorLine is the row the cursor is on.
func (v *vt) cursorLine() string { return strings.TrimRight(strings.Join(v.screen[v.row], ""), " ") }

// cursorCol is the cursor's column (0 the first), as the terminal shows it.
func (v *vt) cursorCol() int { return v.col }

func (v *vt) String() string { return strings.Join(v.lines(), "\n") }
