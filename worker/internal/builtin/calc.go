package builtin

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// calculate evaluates an arithmetic expression with a recursive-descent
// parser: numbers (decimal, optional exponent), + - * / % ^ (power, right
// associative, binding tighter than unary minus: -2^2 = -4), unary + and -,
// and parentheses. Nothing else is accepted; nothing is executed.
func calculate(expr string) (float64, error) {
	if len(expr) > 4096 {
		return 0, errors.New("expression longer than 4096 characters")
	}
	p := &calcParser{s: expr}
	v, err := p.expr()
	if err != nil {
		return 0, err
	}
	p.skip()
	if p.i < len(p.s) {
		return 0, fmt.Errorf("unexpected %q at position %d", p.s[p.i], p.i+1)
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, errors.New("result is not a finite number")
	}
	return v, nil
}

type calcParser struct {
	s     string
	i     int
	depth int
}

const maxCalcDepth = 200

func (p *calcParser) skip() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == '\n' || p.s[p.i] == '\r') {
		p.i++
	}
}

func (p *calcParser) peek() byte {
	p.skip()
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

// expr := term (('+' | '-') term)*
func (p *calcParser) expr() (float64, error) {
	v, err := p.term()
	if err != nil {
		return 0, err
	}
	for {
		switch p.peek() {
		case '+', '-':
			op := p.s[p.i]
			p.i++
			r, err := p.term()
			if err != nil {
				return 0, err
			}
			if op == '+' {
				v += r
			} else {
				v -= r
			}
		default:
			return v, nil
		}
	}
}

// term := unary (('*' | '/' | '%') unary)*
func (p *calcParser) term() (float64, error) {
	v, err := p.unary()
	if err != nil {
		return 0, err
	}
	for {
		switch p.peek() {
		case '*', '/', '%':
			op := p.s[p.i]
			p.i++
			r, err := p.unary()
			if err != nil {
				return 0, err
			}
			switch op {
			case '*':
				v *= r
			case '/':
				if r == 0 {
					return 0, errors.New("division by zero")
				}
				v /= r
			case '%':
				if r == 0 {
					return 0, errors.New("modulo by zero")
				}
				v = math.Mod(v, r)
			}
		default:
			return v, nil
		}
	}
}

// unary := ('-' | '+') unary | power
func (p *calcParser) unary() (float64, error) {
	switch p.peek() {
	case '-', '+':
		op := p.s[p.i]
		p.i++
		if p.depth++; p.depth > maxCalcDepth {
			return 0, errors.New("expression nested too deeply")
		}
		v, err := p.unary()
		p.depth--
		if op == '-' {
			v = -v
		}
		return v, err
	}
	return p.power()
}

// power := primary ('^' unary)?
func (p *calcParser) power() (float64, error) {
	base, err := p.primary()
	if err != nil {
		return 0, err
	}
	if p.peek() != '^' {
		return base, nil
	}
	p.i++
	if p.depth++; p.depth > maxCalcDepth {
		return 0, errors.New("expression nested too deeply")
	}
	exp, err := p.unary()
	p.depth--
	if err != nil {
		return 0, err
	}
	return math.Pow(base, exp), nil
}

// primary := number | '(' expr ')'
func (p *calcParser) primary() (float64, error) {
	c := p.peek()
	switch {
	case c == '(':
		p.i++
		if p.depth++; p.depth > maxCalcDepth {
			return 0, errors.New("expression nested too deeply")
		}
		v, err := p.expr()
		p.depth--
		if err != nil {
			return 0, err
		}
		if p.peek() != ')' {
			return 0, fmt.Errorf("missing ')' at position %d", p.i+1)
		}
		p.i++
		return v, nil
	case c >= '0' && c <= '9' || c == '.':
		start := p.i
		for p.i < len(p.s) && (p.s[p.i] >= '0' && p.s[p.i] <= '9' || p.s[p.i] == '.') {
			p.i++
		}
		if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
			j := p.i + 1
			if j < len(p.s) && (p.s[j] == '+' || p.s[j] == '-') {
				j++
			}
			if j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
				for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
					j++
				}
				p.i = j
			}
		}
		v, err := strconv.ParseFloat(p.s[start:p.i], 64)
		if err != nil {
			return 0, fmt.Errorf("bad number %q at position %d", p.s[start:p.i], start+1)
		}
		return v, nil
	case c == 0:
		return 0, errors.New("unexpected end of expression")
	}
	return 0, fmt.Errorf("unexpected %q at position %d", c, p.i+1)
}

// formatNumber prints a calculator result for people and models to read:
// an integral value below 2^53 as its digits, anything else rounded to 15
// significant digits (what a float64 holds reliably), without an exponent
// for 1e-6 <= |v| < 1e21 and trailing zeros trimmed, as JavaScript does.
func formatNumber(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
		return strconv.FormatInt(int64(v), 10)
	}
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 15, 64), 64)
	if a := math.Abs(r); a >= 1e-6 && a < 1e21 {
		return strconv.FormatFloat(r, 'f', -1, 64)
	}
	return strconv.FormatFloat(r, 'e', -1, 64)
}
