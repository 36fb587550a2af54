package agent

import (
	"math"
	"testing"
)

// Expected values printed by Node 20 (Number(s) and String(n)).
func TestJSNumber(t *testing.T) {
	nan := math.NaN()
	inf := math.Inf(1)
	cases := []struct {
		in   string
		want float64
	}{
		{"0x10", 16}, {"0X1f", 31}, {"0b101", 5}, {"0B11", 3}, {"0o17", 15}, {"0O7", 7},
		{" 12 ", 12}, {"\t7\n", 7}, {"1e3", 1000}, {"1E+3", 1000}, {"-2.5", -2.5}, {"+5", 5},
		{"5.", 5}, {".5", 0.5}, {".", nan}, {"-.5", -0.5}, {"1_000", nan}, {"0x1p3", nan},
		{"Infinity", inf}, {"-Infinity", -inf}, {"+Infinity", inf}, {"infinity", nan}, {"NaN", nan},
		{"1e400", inf}, {"-1e400", -inf}, {"1e-400", 0}, {"12abc", nan}, {"-0x10", nan}, {"+0x10", nan},
		{"0x", nan}, {"0b2", nan}, {"0o8", nan}, {"00012", 12}, {"1e", nan}, {"1e+", nan}, {"--1", nan},
		{"+-1", nan}, {"", 0}, {"   ", 0}, {"\u00a0 3 \u3000", 3}, {"\ufeff4", 4}, {"\u00855", nan},
		{"0x1_0", nan}, {"1__0", nan}, {"0.1e-7", 1e-8}, {"9007199254740993", 9007199254740992},
		{"0xffffffffffffffffffff", 1.2089258196146292e+24}, {"1,5", nan}, {"١٢", nan}, {"0.0000001", 1e-7},
	}
	for _, c := range cases {
		got, ok := jsNumber(c.in)
		if math.IsNaN(c.want) {
			if ok {
				t.Errorf("Number(%q) = %v, want NaN", c.in, got)
			}
			continue
		}
		if !ok || got != c.want {
			t.Errorf("Number(%q) = %v (ok %t), want %v", c.in, got, ok, c.want)
		}
	}
}

func TestJSNumberString(t *testing.T) {
	cases := map[float64]string{1e21: "1e+21", 1e-7: "1e-7", 123456789012345680000: "123456789012345680000",
		0.1: "0.1", math.Copysign(0, -1): "0", 1.5e-7: "1.5e-7", 100: "100", 2.5e20: "250000000000000000000", 12.5: "12.5"}
	for in, want := range cases {
		if got := jsNumberString(in); got != want {
			t.Errorf("String(%v) = %q, want %q", in, got, want)
		}
	}
}

// coercePrimitiveByType, case by case.
func TestCoercePrimitive(t *testing.T) {
	cases := []struct {
		typ     string
		in, out any
		changed bool
	}{
		{"number", "0x10", 16.0, true},
		{"number", " 12 ", 12.0, true},
		{"number", "1_000", "1_000", false},
		{"number", "0x1p3", "0x1p3", false},
		{"number", "Infinity", "Infinity", false},
		{"number", "1e400", "1e400", false},
		{"number", "", "", false},
		{"number", " \t", " \t", false},
		{"number", nil, 0.0, true},
		{"number", true, 1.0, true},
		{"number", false, 0.0, true},
		{"number", 2.5, 2.5, false},
		{"integer", "0b101", 5.0, true},
		{"integer", "2.5", "2.5", false},
		{"integer", "1e21", 1e21, true},
		{"integer", nil, 0.0, true},
		{"integer", 2.5, 2.5, false},
		{"boolean", "true", true, true},
		{"boolean", "TRUE", "TRUE", false},
		{"boolean", 1.0, true, true},
		{"boolean", 0.0, false, true},
		{"boolean", 2.0, 2.0, false},
		{"boolean", nil, false, true},
		{"string", 12.5, "12.5", true},
		{"string", 1e21, "1e+21", true},
		{"string", false, "false", true},
		{"string", nil, "", true},
		{"null", "", nil, true},
		{"null", 0.0, nil, true},
		{"null", false, nil, true},
		{"null", "x", "x", false},
	}
	for _, c := range cases {
		out, changed := coercePrimitive(c.typ, c.in)
		if changed != c.changed || out != c.out {
			t.Errorf("%s %#v -> %#v (changed %t), want %#v (changed %t)", c.typ, c.in, out, changed, c.out, c.changed)
		}
	}
}
