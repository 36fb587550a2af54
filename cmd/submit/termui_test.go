package main

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// words is a text of numbered words: a word split across lines shows as
// a token that is not one of them.
func words(from, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("word%04d", from+i)
	}
	return strings.Join(w, " ")
}

var wordToken = regexp.MustCompile(`^word\d{4}$`)

// checkWrapped checks that lines hold the words of text, in order, whole,
// each line within width.
func checkWrapped(t *testing.T, lines []string, text string, width int) {
	t.Helper()
	var got []string
	for _, l := range lines {
		if n := len([]rune(l)); n > width {
			t.Errorf("line of %d columns (width %d): %q", n, width, l)
		}
		for _, tok := range strings.Fields(l) {
			if !wordToken.MatchString(tok) {
				t.Errorf("%q is not a whole word (line %q)", tok, l)
			}
			got = append(got, tok)
		}
	}
	if strings.Join(got, " ") != text {
		t.Errorf("the words on screen are not the text:\n%s", strings.Join(lines, "\n"))
	}
}

// chunks cuts text at random places, as a model's deltas come.
func chunks(rng *rand.Rand, text string) []string {
	var out []string
	for text != "" {
		n := min(len(text), 1+rng.IntN(7))
		out = append(out, text[:n])
		text = text[n:]
	}
	return out
}

func TestScreenWrapsStreamedTextAtWords(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, width := range []int{12, 20, 33, 80} {
		v := newVT(200, width)
		s := &screen{w: v, width: width}
		text := words(1, 120)
		for _, c := range chunks(rng, text) {
			s.write(c)
		}
		s.flush()
		if v.err != nil {
			t.Fatal(v.err)
		}
		checkWrapped(t, v.lines(), text, width)
	}
	// A word longer than a line is broken where the line ends.
	v := newVT(10, 10)
	s := &screen{w: v, width: 10}
	s.write("ab " + strings.Repeat("x", 25) + " cd")
	s.flush()
	if got := strings.Join(v.lines(), "|"); got != "ab|xxxxxxxxxx|xxxxxxxxxx|xxxxx cd" {
		t.Errorf("long word: %q", got)
	}
	// Wide characters take two columns, combining marks none.
	if got := wrapText("漢字漢字 漢字漢字 漢字漢字 e\u0301e\u0301", 20); got != "漢字漢字 漢字漢字\n漢字漢字 e\u0301e\u0301" {
		t.Errorf("wide: %q", got)
	}
	if got := fitBottom("» ", "漢字漢字漢字", 10); got != "» …字漢字" {
		t.Errorf("fitBottom: %q", got)
	}
	// Colours do not count; a tab goes to the next stop.
	if got := wrapText("\x1b[2maaaa bbbb\x1b[0m cccc\tdd", 10); got != "\x1b[2maaaa bbbb\x1b[0m\ncccc    dd" {
		t.Errorf("wrapText: %q", got)
	}
}

// What is typed stays in the bottom row while text streams above it, and
// the acknowledgement of a line sent ends the answer's line after a whole
// word: the word being received goes on below it.
func TestScreenKeepsTheTypedLineApart(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const width = 30
	v := newVT(12, width)
	s := &screen{w: v, width: width}
	var in lineInput
	text := words(1, 150)
	typing := []byte("use metric units\n")
	var ack bool
	for i, c := range chunks(rng, text) {
		s.write(c)
		if i%5 == 0 && len(typing) > 0 {
			lines, _ := in.feed(typing[:1])
			typing = typing[1:]
			if len(lines) > 0 {
				s.setBottom("")
				s.insertLine(s.w, "→ steering sent")
				ack = true
			} else {
				s.setBottom(fitBottom("» ", in.text(), width))
			}
		}
		if v.err != nil {
			t.Fatal(v.err)
		}
		// The typed text is on the cursor's row, nowhere else on screen.
		if typed := in.text(); typed != "" {
			if got, want := v.cursorLine(), strings.TrimRight("» "+typed, " "); got != want {
				t.Fatalf("the cursor's row is %q, want %q:\n%s", got, want, v)
			}
		}
	}
	s.flush()
	if !ack {
		t.Fatal("the line was never sent")
	}
	var answer []string
	for _, l := range v.lines() {
		if l == "→ steering sent" {
			continue
		}
		if strings.Contains(l, "»") || strings.Contains(l, "use") {
			t.Errorf("typed text in the output: %q\n%s", l, v)
		}
		answer = append(answer, l)
	}
	checkWrapped(t, answer, text, width)
}

func TestLineInputEditing(t *testing.T) {
	var in lineInput
	lines, eof := in.feed([]byte("héllo wor\x7f\x7fld\x1b[D\x1bOA x\x17y\x15steer me\r/abort\n"))
	if eof || len(lines) != 2 || lines[0] != "steer me" || lines[1] != "/abort" {
		t.Errorf("lines %q eof %v", lines, eof)
	}
	// A rune split across reads.
	in.feed([]byte{'a', 0xc3})
	in.feed([]byte{0xa9})
	if in.text() != "aé" {
		t.Errorf("text %q", in.text())
	}
	// Backspace takes a character whole: its mark, its joined emoji.
	in.feed([]byte("\x15ae\u0301👩\u200d💻❤\ufe0f\x7f\x7f\x7f"))
	if in.text() != "a" {
		t.Errorf("after three Backspaces: %q", in.text())
	}
	in.feed([]byte{0x15})
	if _, eof := in.feed([]byte{0x04}); !eof {
		t.Error("Ctrl-D on an empty line does not end the input")
	}
}

// A shrink below the output's last line (a reflowing terminal): what
// follows starts on a row of its own, no space before its first word, and
// nothing of the bottom row stays.
func TestScreenShrinkBelowTheOutputsLine(t *testing.T) {
	v := newVT(10, 40)
	v.reflow = true
	s := &screen{w: v, width: 40}
	s.write("word0001 word0002 word0003 ")
	s.setBottom("» typed text that is thirty-seven wide")
	v.resize(20)
	s.resize(20)
	s.setBottom("» …thirty-seven wide")
	s.write("word0004 word0005")
	s.flush()
	if v.err != nil {
		t.Fatal(v.err)
	}
	want := []string{"word0001 word0002 wo", "rd0003", "word0004 word0005", "» …thirty-seven wide"}
	if got := v.lines(); !slices.Equal(got, want) {
		t.Errorf("the screen:\n%q\nwant\n%q", got, want)
	}
}
