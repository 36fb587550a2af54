package main

import (
	"context"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
)

// The retention flags reach the streams and the bucket the worker creates.
func TestRetentionFlags(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("OPENAI_BASE_URL", "")
	srv := fleettest.StartServer(t, 0, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan started, 1)
	done := make(chan int, 1)
	var out logbuf.Buffer
	go func() {
		done <- run(ctx, []string{"--nats", srv.URL(), "--metrics-addr", "", "--events-max-age", "1h",
			"--control-max-age", "2h", "--records-ttl", "3h"}, &out, ready)
	}()
	select {
	case <-ready:
	case code := <-done:
		t.Fatalf("worker exited %d:\n%s", code, out.String())
	case <-time.After(20 * time.Second):
		t.Fatal("worker not ready")
	}
	cctx := fleettest.Context(t)
	c := fleettest.Connect(t, srv.URL())
	for name, want := range map[string]time.Duration{
		c.Names().EventsStream():          time.Hour,
		c.Names().ControlStream():         2 * time.Hour,
		"KV_" + c.Names().RecordsBucket(): 3 * time.Hour,
	} {
		s, err := c.JetStream().Stream(cctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(cctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.MaxAge != want {
			t.Errorf("%s max age %v, want %v", name, info.Config.MaxAge, want)
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
}
