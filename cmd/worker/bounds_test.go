package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/worker"
)

// The per-run bounds and ceilings: their defaults, flags and environment.
func TestBoundFlags(t *testing.T) {
	var out bytes.Buffer
	o, err := parse(nil, &out)
	if err != nil {
		t.Fatal(err)
	}
	var cfg worker.Config
	applyBounds(o, &cfg)
	if cfg.MaxRunEvents != 100_000 || cfg.MaxRunEventBytes != 256<<20 || cfg.MaxQueuedControls != 1024 ||
		cfg.MaxQueuedControlBytes != 4<<20 || cfg.MaxTranscriptBytes != 32<<20 || cfg.LoadBudget != 128<<20 || cfg.MaxRunTimeout != 0 ||
		cfg.MaxTurns != 0 || len(cfg.QueueConcurrency) != 0 || cfg.NoFaux || cfg.MaxApprovalTimeout != 0 || cfg.ScheduleLate != 30*time.Second {
		t.Fatalf("defaults: %+v", cfg)
	}
	t.Setenv("AGENTS_MAX_RUN_EVENT_BYTES", "1MiB")
	t.Setenv("AGENTS_QUEUE_CONCURRENCY", "batch=2")
	o, err = parse([]string{"--max-run-events", "500", "--max-turns", "10", "--max-run-timeout", "1h",
		"--queue-concurrency", "chat=3,bulk=1", "--max-transcript-bytes", "8MiB", "--max-approval-timeout", "10m", "--load-budget", "64MiB", "--schedule-late", "2m"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	cfg = worker.Config{}
	applyBounds(o, &cfg)
	if cfg.MaxRunEvents != 500 || cfg.MaxRunEventBytes != 1<<20 || cfg.MaxTurns != 10 || cfg.MaxRunTimeout != time.Hour ||
		cfg.MaxTranscriptBytes != 8<<20 || cfg.LoadBudget != 64<<20 || cfg.QueueConcurrency["chat"] != 3 || cfg.QueueConcurrency["bulk"] != 1 || cfg.QueueConcurrency["batch"] != 0 ||
		cfg.MaxApprovalTimeout != 10*time.Minute || cfg.ScheduleLate != 2*time.Minute {
		t.Fatalf("flags: %+v", cfg)
	}
	for _, bad := range [][]string{{"--queue-concurrency", "chat"}, {"--queue-concurrency", "chat=0"}, {"--queue-concurrency", "b*d=2"}, {"--max-turns", "-1"}, {"--max-approval-timeout", "-1s"}, {"--schedule-late", "0"}} {
		if _, err := parse(bad, &out); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// Faux is on by default without a model endpoint (the quickstart's demo
// model), off with one, and the flag or environment decides when set.
func TestAllowFauxDefault(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	check := func(args []string, want bool) {
		t.Helper()
		var out bytes.Buffer
		o, err := parse(args, &out)
		if err != nil {
			t.Fatal(err)
		}
		cfg, _, err := modelConfig(o, log)
		if err != nil {
			t.Fatal(err)
		}
		applyBounds(o, &cfg)
		if got := !cfg.NoFaux; got != want {
			t.Fatalf("%v: faux allowed %v, want %v", args, got, want)
		}
	}
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("OPENAI_BASE_URL", "")
	check(nil, true)
	check([]string{"--allow-faux=false"}, false)
	endpoint := []string{"--openai-base-url", "http://127.0.0.1:1/v1"}
	check(endpoint, false)
	check(append(endpoint, "--allow-faux"), true)
	t.Setenv("AGENTS_ALLOW_FAUX", "true")
	check(endpoint, true)
	t.Setenv("AGENTS_ALLOW_FAUX", "maybe")
	var out bytes.Buffer
	if _, err := parse(nil, &out); err == nil || !strings.Contains(err.Error(), "AGENTS_ALLOW_FAUX") {
		t.Fatalf("AGENTS_ALLOW_FAUX=maybe: %v", err)
	}
}
