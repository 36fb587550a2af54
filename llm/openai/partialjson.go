package openai

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// parseArguments turns streamed tool-call arguments into an object, as pi's
// parseStreamingJson does: valid JSON as is, otherwise the best partial
// reading of it, otherwise {}. It never fails and always returns a new map.
func parseArguments(s string) map[string]any {
	t := strings.TrimSpace(s)
	if t == "" {
		return map[string]any{}
	}
	var v any
	if err := json.Unmarshal([]byte(t), &v); err != nil {
		p := partialParser{s: t}
		p.ws()
		if v, _ = p.value(0); p.tooDeep {
			return map[string]any{}
		}
	}
	switch x := v.(type) {
	case map[string]any:
		return x
	case string:
		// Some servers encode the arguments twice.
		if inner := strings.TrimSpace(x); strings.HasPrefix(inner, "{") {
			return parseArguments(inner)
		}
	}
	return map[string]any{}
}

// partialParser reads a possibly truncated JSON text. It is lenient where
// models are sloppy (raw control characters in strings, trailing garbage) and
// keeps what is complete enough to use: partial strings, numbers and
// containers; a key without a value or a cut literal is dropped.
type partialParser struct {
	s       string
	i       int
	tooDeep bool // nesting beyond maxDepth: give up rather than recurse
}

const maxDepth = 512

func (p *partialParser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// value parses one value; ok is false when nothing usable was found.
func (p *partialParser) value(depth int) (v any, ok bool) {
	if depth > maxDepth {
		p.tooDeep, p.i = true, len(p.s)
	}
	if p.i >= len(p.s) {
		return nil, false
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		s, _ := p.str()
		return s, true
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	default:
		return p.literal()
	}
}

func (p *partialParser) object(depth int) (any, bool) {
	m := map[string]any{}
	p.i++ // {
	for {
		p.ws()
		if p.i >= len(p.s) {
			return m, true
		}
		switch p.s[p.i] {
		case '}':
			p.i++
			return m, true
		case ',':
			p.i++
			continue
		case '"':
		default:
			return m, true // not JSON any more: keep what we have
		}
		key, complete := p.str()
		if !complete {
			return m, true
		}
		p.ws()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return m, true
		}
		p.i++
		p.ws()
		v, ok := p.value(depth + 1)
		if !ok {
			return m, true
		}
		m[key] = v
	}
}

func (p *partialParser) array(depth int) (any, bool) {
	a := []any{}
	p.i++ // [
	for {
		p.ws()
		if p.i >= len(p.s) {
			return a, true
		}
		switch p.s[p.i] {
		case ']':
			p.i++
			return a, true
		case ',':
			p.i++
			continue
		}
		v, ok := p.value(depth + 1)
		if !ok {
			return a, true
		}
		a = append(a, v)
	}
}

// str reads a string starting at the opening quote. complete is false when
// the text ends inside it; a cut escape sequence is dropped.
func (p *partialParser) str() (string, bool) {
	p.i++ // "
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return b.String(), true
		case c == '\\':
			if p.i+1 >= len(p.s) {
				p.i = len(p.s)
				return b.String(), false
			}
			e := p.s[p.i+1]
			p.i += 2
			switch e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'u':
				r, ok := p.unicode()
				if !ok {
					p.i = len(p.s)
					return b.String(), false
				}
				b.WriteRune(r)
			default: // \" \\ \/ and anything a sloppy model invents
				b.WriteByte(e)
			}
		case c < utf8.RuneSelf:
			// Copy a run of plain ASCII at once. Raw control characters are
			// invalid JSON but common in model output: keep them.
			j := p.i + 1
			for j < len(p.s) && p.s[j] < utf8.RuneSelf && p.s[j] != '"' && p.s[j] != '\\' {
				j++
			}
			b.WriteString(p.s[p.i:j])
			p.i = j
		default:
			r, size := utf8.DecodeRuneInString(p.s[p.i:])
			b.WriteRune(r) // invalid UTF-8 becomes U+FFFD, as encoding/json does
			p.i += size
		}
	}
	return b.String(), false
}

// unicode reads the hex digits of \uXXXX (and a following low surrogate).
func (p *partialParser) unicode() (rune, bool) {
	hex4 := func() (rune, bool) {
		if p.i+4 > len(p.s) {
			return 0, false
		}
		n, err := strconv.ParseUint(p.s[p.i:p.i+4], 16, 32)
		if err != nil {
			return utf8.RuneError, true
		}
		p.i += 4
		return rune(n), true
	}
	r, ok := hex4()
	if !ok {
		return 0, false
	}
	if r >= 0xD800 && r < 0xDC00 {
		if p.i+6 > len(p.s) {
			return 0, false
		}
		if p.s[p.i] == '\\' && p.s[p.i+1] == 'u' {
			p.i += 2
			lo, ok := hex4()
			if !ok {
				return 0, false
			}
			if lo >= 0xDC00 && lo < 0xE000 {
				return (r-0xD800)<<10 + (lo - 0xDC00) + 0x10000, true
			}
			return utf8.RuneError, true
		}
		return utf8.RuneError, true
	}
	return r, true
}

func (p *partialParser) number() (any, bool) {
	start := p.i
	for p.i < len(p.s) && strings.IndexByte("+-0123456789.eE", p.s[p.i]) >= 0 {
		p.i++
	}
	// A cut number ("1.", "-", "2e") loses its dangling tail.
	num := strings.TrimRight(p.s[start:p.i], "+-.eE")
	if num == "" {
		return nil, false
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return nil, false
	}
	return f, true
}

func (p *partialParser) literal() (any, bool) {
	for _, lit := range []struct {
		text string
		v    any
	}{{"true", true}, {"false", false}, {"null", nil}} {
		if strings.HasPrefix(p.s[p.i:], lit.text) {
			p.i += len(lit.text)
			return lit.v, true
		}
	}
	return nil, false
}
