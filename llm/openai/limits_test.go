package openai_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/llm/openai"
)

func TestModelTableLimits(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "models.json")
	table := `[{"id":"a","limits":{"rpm":500,"tpm":200000,"concurrency":64},"limitGroup":"openai-main"},
		{"id":"b","limits":{"rpm":5}}, {"id":"c"}]`
	if err := os.WriteFile(path, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	models, err := openai.LoadModels(path)
	if err != nil {
		t.Fatal(err)
	}
	if l := models[0].Limits; l == nil || *l != (openai.ModelLimits{RPM: 500, TPM: 200000, Concurrency: 64}) {
		t.Fatalf("limits %+v", l)
	}
	if g := models[0].Group(); g != "openai-main" {
		t.Fatalf("group %q", g)
	}
	if g := models[1].Group(); g != "b" {
		t.Fatalf("default group %q, want the id", g)
	}
	if models[2].Limits != nil {
		t.Fatal("a model without limits got some")
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`[{"id":"a","limits":{"tpm":-1}}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := openai.LoadModels(bad); err == nil || !strings.Contains(err.Error(), "negative limit") {
		t.Fatalf("negative limit: %v", err)
	}
}
