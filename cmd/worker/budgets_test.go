package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --budgets, --tenant-key and --tenant-from, and a bad file's error that
// lists every problem before the worker starts.
func TestBudgetFlags(t *testing.T) {
	var out bytes.Buffer
	o, err := parse(nil, &out)
	if err != nil {
		t.Fatal(err)
	}
	if o.budgets.config() != nil {
		t.Fatal("budgets without a budgets file")
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := os.WriteFile(good, []byte(`{"period": "24h", "tenants": {"acme": {"usd": 50}}, "default": {"usd": 5}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AGENTS_BUDGETS", good)
	t.Setenv("AGENTS_TENANT_KEY", "org")
	o, err = parse([]string{"--tenant-from", "queue"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	tb := o.budgets.config()
	if tb == nil || tb.Key != "org" || !tb.FromQueue || tb.Budgets.Tenants["acme"].USD != 50 || tb.Stats == nil {
		t.Fatalf("config %+v", tb)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"period": "1 day", "tenants": {"acme": {"usd": "50"}}, "default": {"usd": 5, "onExhausted": "later"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = parse([]string{"--budgets", bad}, &out)
	if err == nil {
		t.Fatal("a bad budgets file was accepted")
	}
	for _, want := range []string{"--budgets", bad, "3 problems", `"period"`, `tenants["acme"]: usd must be a number`, `"default": onExhausted`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if _, err := parse([]string{"--tenant-from", "header"}, &out); err == nil || !strings.Contains(err.Error(), "--tenant-from") {
		t.Fatalf("--tenant-from header: %v", err)
	}
}
