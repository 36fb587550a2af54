package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentfleet/agentfleet/worker"
)

// The model table's faux/<id> entries give faux models a context window
// (compaction in tests and demos) and are not the endpoint's models; every
// entry's window and compaction defaults reach the worker by provider/id.
func TestModelTableWindows(t *testing.T) {
	path := filepath.Join(t.TempDir(), "models.json")
	table := `[{"id":"gpt-x","contextWindow":128000,"compaction":{"reserveTokens":8000}},{"id":"faux/small","contextWindow":8192}]`
	if err := os.WriteFile(path, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("OPENAI_BASE_URL", "")
	for _, endpoint := range [][]string{nil, {"--openai-base-url", "http://127.0.0.1:1/v1"}} {
		var out bytes.Buffer
		o, err := parse(append([]string{"--models", path}, endpoint...), &out)
		if err != nil {
			t.Fatal(err)
		}
		cfg, ids, err := modelConfig(o, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.ModelWindows["faux/small"]; got != (worker.ModelWindow{ContextWindow: 8192}) {
			t.Errorf("%v: faux/small %+v", endpoint, got)
		}
		if got := cfg.ModelWindows["openai/gpt-x"]; got != (worker.ModelWindow{ContextWindow: 128000, ReserveTokens: 8000}) {
			t.Errorf("%v: openai/gpt-x %+v", endpoint, got)
		}
		for _, id := range ids {
			if id == "faux/small" {
				t.Errorf("%v: the endpoint's models list the faux entry: %v", endpoint, ids)
			}
		}
	}
}
