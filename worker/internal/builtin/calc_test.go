package builtin

import (
	"strings"
	"testing"
)

func TestCalculate(t *testing.T) {
	good := map[string]float64{
		"1+2*3":         7,
		"(1+2)*3":       9,
		"2^3^2":         512,
		"-2^2":          -4,
		"(-2)^2":        4,
		"--3":           3,
		"+4":            4,
		"7 % 4":         3,
		"10/4":          2.5,
		" 1.5e2 + .5 ":  150.5,
		"2*(3+(4-1))/3": 4,
		"1-2-3":         -4,
		"2^-1":          0.5,
		"100":           100,
		"1e3*1E-3":      1,
		"3 * -2":        -6,
		"((((((1))))))": 1,
		"6/3/2":         1,
		"2 ^ 0.5 ^ 2":   2*0 + 1.189207115002721,
	}
	for expr, want := range good {
		got, err := calculate(expr)
		if err != nil || got != want {
			t.Errorf("%s = %v (%v), want %v", expr, got, err, want)
		}
	}
	bad := map[string]string{
		"":           "end of expression",
		"1+":         "end of expression",
		"1/0":        "division by zero",
		"5%0":        "modulo by zero",
		"(1+2":       "missing ')'",
		"1+2)":       "unexpected ')'",
		"2**3":       "unexpected '*'",
		"os.exit(1)": "unexpected 'o'",
		"1..2":       "bad number",
		"10^400":     "finite",
		strings.Repeat("(", 300) + "1" + strings.Repeat(")", 300): "nested too deeply",
		strings.Repeat("-", 300) + "1":                            "nested too deeply",
	}
	for expr, want := range bad {
		_, err := calculate(expr)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.40s: %v, want %q", expr, err, want)
		}
	}
}

func TestFormatNumber(t *testing.T) {
	cases := map[float64]string{
		1234 * 5678:         "7006652",
		-7006652:            "-7006652",
		0:                   "0",
		1 << 52:             "4503599627370496",
		1.0 / 3:             "0.333333333333333",
		123456.789:          "123456.789",
		2.5:                 "2.5",
		-0.1 + 0.3:          "0.2",
		1.5e-7:              "1.5e-07",
		1e21:                "1e+21",
		1e-6:                "0.000001",
		1e20 + 1<<20:        "100000000000001000000",
		9007199254740993e10: "9.00719925474099e+25",
		-2.5e-9:             "-2.5e-09",
	}
	for v, want := range cases {
		if got := formatNumber(v); got != want {
			t.Errorf("formatNumber(%v) = %q, want %q", v, got, want)
		}
	}
	for _, expr := range []string{"(-1)^0.5", "10^400", "-(10^400)"} {
		if _, err := calculate(expr); err == nil || !strings.Contains(err.Error(), "not a finite number") {
			t.Errorf("%s: %v, want a not-a-finite-number error", expr, err)
		}
	}
}

// The calculator tool is what the model and the user read.
func TestCalculatorToolPrintsDigits(t *testing.T) {
	for _, tool := range Tools() {
		if tool.Name != "calculator" {
			continue
		}
		res, err := tool.Execute(t.Context(), "c1", map[string]any{"expression": "1234*5678"}, nil)
		if err != nil || len(res.Content) != 1 || res.Content[0].Text != "7006652" {
			t.Fatalf("calculator(1234*5678) = %+v, %v; want 7006652", res.Content, err)
		}
		return
	}
	t.Fatal("no calculator tool")
}

// The built-in tools' argument schemas, as docs/protocol.md §3 gives them:
// a description keeps its commas (a bare comma in the tag would end it).
func TestBuiltinToolSchemas(t *testing.T) {
	want := map[string]string{
		"calculator":   `{"properties":{"expression":{"type":"string","description":"An arithmetic expression: numbers, + - * / % ^ and parentheses, e.g. (2+3)*4^2"}},"additionalProperties":false,"type":"object","required":["expression"]}`,
		"current_time": `{"properties":{"timezone":{"type":"string","description":"IANA time zone such as Europe/Paris; default UTC"}},"additionalProperties":false,"type":"object"}`,
		"sleep":        `{"properties":{"seconds":{"type":"number","maximum":60,"minimum":0,"description":"How long to wait, at most 60 seconds"}},"additionalProperties":false,"type":"object","required":["seconds"]}`,
	}
	for _, tool := range Tools() {
		if got := string(tool.Parameters); got != want[tool.Name] {
			t.Errorf("%s's schema\n%s\nwant\n%s", tool.Name, got, want[tool.Name])
		}
	}
}
