package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The worker's own memory limit: 90% of a cgroup v2 (else v1) limit, none without
// one, and never over the operator's GOMEMLIMIT.
func TestAutoMemLimit(t *testing.T) {
	dir := t.TempDir()
	limited := filepath.Join(dir, "limited")
	if err := os.WriteFile(limited, []byte("1073741824\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	unlimited := filepath.Join(dir, "unlimited")
	if err := os.WriteFile(unlimited, []byte("max\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	v1none := filepath.Join(dir, "v1none")
	if err := os.WriteFile(v1none, []byte("9223372036854771712\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		name, env string
		paths     []string
		want      memLimit
	}{
		{"cgroup limit", "", []string{limited}, memLimit{Bytes: 966367641, Cgroup: 1 << 30}},
		{"GOMEMLIMIT set", "500MiB", []string{limited}, memLimit{}},
		{"no cgroup limit", "", []string{unlimited, limited}, memLimit{}},
		{"v1 limit, no v2 file", "", []string{missing, limited}, memLimit{Bytes: 966367641, Cgroup: 1 << 30}},
		{"v1 without a limit", "", []string{missing, v1none}, memLimit{}},
		{"no cgroup file", "", []string{missing}, memLimit{}},
	} {
		if got := autoMemLimit(tc.env, readMemoryMax(tc.paths...)); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// A limit main set is in the startup log.
func TestMemLimitLogged(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the worker stops right after its first lines
	var out bytes.Buffer
	runWith(ctx, []string{"--nats", "nats://127.0.0.1:1"}, &out, nil, memLimit{Bytes: 966367641, Cgroup: 1 << 30})
	if !strings.Contains(out.String(), "memory limit set from the container's") || !strings.Contains(out.String(), "limitBytes=966367641") {
		t.Fatalf("startup log:\n%s", out.String())
	}
}
