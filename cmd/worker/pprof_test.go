package main

import (
	"io"
	"log/slog"
	"testing"
)

func TestPprofLoopbackOnly(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, addr := range []string{"0.0.0.0:0", ":0", "10.1.2.3:0", "example.com:0", "nonsense"} {
		if stop, err := servePprof(addr, log); err == nil {
			stop()
			t.Errorf("--pprof %s was accepted", addr)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0"} {
		stop, err := servePprof(addr, log)
		if err != nil {
			if addr == "[::1]:0" {
				continue // no IPv6 loopback here
			}
			t.Fatalf("--pprof %s: %v", addr, err)
		}
		stop()
	}
}
