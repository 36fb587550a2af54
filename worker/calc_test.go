package worker_test

import (
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/worker"
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
		got, err := worker.Calculate(expr)
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
		_, err := worker.Calculate(expr)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.40s: %v, want %q", expr, err, want)
		}
	}
}
