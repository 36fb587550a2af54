// Package budget keeps per-tenant spending budgets for a fleet: the
// budgets file (what each tenant may spend per period) and a shared
// ledger in one NATS KV bucket, one key per tenant and period, changed
// only by compare-and-set. A model call reserves its worst-case cost
// before it starts and settles to its real cost after, so concurrent runs
// of one tenant cannot together spend past its budget.
package budget

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// What a run of an exhausted tenant does at pickup.
const (
	Refuse = "refuse" // fail budget_exceeded, not retried
	Wait   = "wait"   // wait until the period rolls over
)

// Tenant is one tenant's budget per period.
type Tenant struct {
	// USD is what the tenant may spend per period; 0 lets it run only
	// models without prices (their calls cost nothing a budget counts).
	USD         float64 `json:"usd"`
	OnExhausted string  `json:"onExhausted,omitempty"` // Refuse (default) or Wait
}

// Budgets is a parsed budgets file.
type Budgets struct {
	// Period is the length of a budget period; periods are aligned to the
	// Unix epoch in UTC (a 24h period starts at 00:00 UTC).
	Period time.Duration
	// Tenants are the named budgets; Default, when set, is every other
	// tenant's (each has its own ledger entry).
	Tenants map[string]Tenant
	Default *Tenant
}

// MinPeriod is the shortest period a budgets file may set.
const MinPeriod = time.Second

// MaxTenant bounds a tenant name (it is a metadata value or a queue).
const MaxTenant = 1024

// For returns the tenant's budget: its own, else the default; ok is
// false when neither applies (the tenant's spending is not bounded).
func (b *Budgets) For(tenant string) (Tenant, bool) {
	if b == nil {
		return Tenant{}, false
	}
	if t, ok := b.Tenants[tenant]; ok {
		return t, true
	}
	if b.Default != nil {
		return *b.Default, true
	}
	return Tenant{}, false
}

// Names returns the configured tenants, sorted.
func (b *Budgets) Names() []string {
	if b == nil {
		return nil
	}
	out := make([]string, 0, len(b.Tenants))
	for n := range b.Tenants {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// PeriodAt returns the period containing t: [start, end), aligned to the
// Unix epoch.
func PeriodAt(t time.Time, period time.Duration) (start, end time.Time) {
	p := period.Milliseconds()
	ms := t.UnixMilli()
	s := ms - ((ms%p)+p)%p
	return time.UnixMilli(s).UTC(), time.UnixMilli(s + p).UTC()
}

// FormatPeriod writes a period as a budgets file would: "24h", "90m",
// "2s", else Go's form.
func FormatPeriod(d time.Duration) string {
	for _, u := range []struct {
		d    time.Duration
		unit string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if d > 0 && d%u.d == 0 {
			return fmt.Sprintf("%d%s", d/u.d, u.unit)
		}
	}
	return d.String()
}

// Load reads and parses a budgets file.
func Load(path string) (*Budgets, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("budgets file: %w", err)
	}
	b, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("budgets file %s: %w", path, err)
	}
	return b, nil
}

// ProblemsError lists every problem of a budgets file.
type ProblemsError struct{ Problems []string }

func (e *ProblemsError) Error() string {
	if len(e.Problems) == 1 {
		return e.Problems[0]
	}
	return fmt.Sprintf("%d problems: %s", len(e.Problems), strings.Join(e.Problems, "; "))
}

// Parse parses a budgets file:
//
//	{"period": "24h", "tenants": {"acme": {"usd": 50, "onExhausted": "refuse"}}, "default": {"usd": 5}}
//
// The error lists every problem found.
func Parse(data []byte) (*Budgets, error) {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, &ProblemsError{[]string{"not a JSON object: " + err.Error()}}
	}
	b := &Budgets{Tenants: map[string]Tenant{}}
	for k := range top {
		switch k {
		case "period", "tenants", "default":
		default:
			add("unknown field %q (the fields are period, tenants, default)", k)
		}
	}
	if raw, ok := top["period"]; !ok {
		add(`"period" is required (e.g. "24h")`)
	} else {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			add(`"period" must be a duration string such as "24h", not %s`, clip(string(raw)))
		} else if d, err := time.ParseDuration(s); err != nil {
			add(`"period" %q is not a duration (e.g. "24h", "720h")`, clip(s))
		} else if d < MinPeriod || d%time.Millisecond != 0 {
			add(`"period" %q must be whole milliseconds and at least %s`, s, MinPeriod)
		} else {
			b.Period = d
		}
	}
	if raw, ok := top["tenants"]; ok {
		var tenants map[string]json.RawMessage
		if err := json.Unmarshal(raw, &tenants); err != nil {
			add(`"tenants" must be an object of tenant name to budget`)
		}
		for _, name := range sortedKeys(tenants) {
			where := fmt.Sprintf("tenants[%q]", clip(name))
			if name == "" || len(name) > MaxTenant {
				add("%s: a tenant name must be 1..%d bytes", where, MaxTenant)
			}
			if t, ok := parseTenant(tenants[name], where, add); ok {
				b.Tenants[name] = t
			}
		}
	}
	if raw, ok := top["default"]; ok && string(bytes.TrimSpace(raw)) != "null" {
		if t, ok := parseTenant(raw, `"default"`, add); ok {
			b.Default = &t
		}
	}
	if _, ok := top["tenants"]; !ok && b.Default == nil && len(problems) == 0 {
		add(`no budgets: set "tenants", "default" or both`)
	}
	if len(problems) > 0 {
		return nil, &ProblemsError{problems}
	}
	return b, nil
}

func parseTenant(raw json.RawMessage, where string, add func(string, ...any)) (Tenant, bool) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		add(`%s must be an object such as {"usd": 5}`, where)
		return Tenant{}, false
	}
	var t Tenant
	ok := true
	for k := range fields {
		if k != "usd" && k != "onExhausted" {
			add("%s: unknown field %q (the fields are usd, onExhausted)", where, clip(k))
			ok = false
		}
	}
	if raw, has := fields["usd"]; !has {
		add("%s: usd is required", where)
		ok = false
	} else if err := json.Unmarshal(raw, &t.USD); err != nil {
		add("%s: usd must be a number, not %s", where, clip(string(raw)))
		ok = false
	} else if t.USD < 0 || math.IsInf(t.USD, 0) || math.IsNaN(t.USD) {
		add("%s: usd must be 0 or more, not %v", where, t.USD)
		ok = false
	}
	if raw, has := fields["onExhausted"]; has {
		if err := json.Unmarshal(raw, &t.OnExhausted); err != nil || (t.OnExhausted != Refuse && t.OnExhausted != Wait) {
			add(`%s: onExhausted must be "refuse" or "wait", not %s`, where, clip(string(raw)))
			ok = false
		}
	}
	if t.OnExhausted == "" {
		t.OnExhausted = Refuse
	}
	if ok && t.USD == 0 && t.OnExhausted == Wait {
		// Its priced runs would wait forever: no period pays them.
		add(`%s: usd 0 with onExhausted "wait" would wait forever; use "refuse" (only models without prices run)`, where)
		ok = false
	}
	return t, ok
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
