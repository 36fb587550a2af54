package main

import (
	"os"
	"path/filepath"
	"testing"
)

// The worker's own memory limit: 90% of a cgroup v2 limit, none without
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
	for _, tc := range []struct {
		name, env, path string
		want            memLimit
	}{
		{"cgroup limit", "", limited, memLimit{Bytes: 966367641, Cgroup: 1 << 30}},
		{"GOMEMLIMIT set", "500MiB", limited, memLimit{}},
		{"no cgroup limit", "", unlimited, memLimit{}},
		{"no cgroup v2 file", "", filepath.Join(dir, "missing"), memLimit{}},
	} {
		if got := autoMemLimit(tc.env, readMemoryMax(tc.path)); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
