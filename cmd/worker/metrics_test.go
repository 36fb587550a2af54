package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/freeport"
	"github.com/agentfleet/agentfleet/internal/logbuf"
)

// get fetches a path of the worker's metrics server.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitStatus polls a path until it answers code (a condition, not a sleep).
func waitStatus(t *testing.T, addr, path string, code int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if got, _ := get(t, addr, path); got == code {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered %d", path, code)
		}
		<-tick.C
	}
}

// /metrics shows the worker's families; /readyz follows NATS going away and
// coming back.
func TestMetricsAndReadiness(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("OPENAI_BASE_URL", "")
	port := freeport.Pick(t)
	store := t.TempDir()
	srv := fleettest.StartServer(t, port, store)

	var out logbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan started, 1)
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--nats", srv.URL(), "--metrics-addr", "127.0.0.1:0", "--ack-wait", "5s", "--log-format", "json"}, &out, ready)
	}()
	var st started
	select {
	case st = <-ready:
	case code := <-done:
		t.Fatalf("worker exited %d:\n%s", code, out.String())
	case <-time.After(20 * time.Second):
		t.Fatal("worker not ready")
	}

	// The queue depth appears after the first poll, right after start.
	var body string
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(body, "agentfleet_queue_depth") && time.Now().Before(deadline) {
		var code int
		if code, body = get(t, st.MetricsAddr, "/metrics"); code != 200 {
			t.Fatalf("/metrics: %d", code)
		}
		<-tick.C
	}
	for _, family := range []string{"agentfleet_worker_slots 8", "agentfleet_worker_slots_busy", "agentfleet_queue_depth{queue=\"default\"}",
		"go_goroutines", "process_cpu_seconds_total"} {
		if !strings.Contains(body, family) {
			t.Errorf("/metrics lacks %s", family)
		}
	}
	if code, _ := get(t, st.MetricsAddr, "/healthz"); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}
	waitStatus(t, st.MetricsAddr, "/readyz", 200)

	srv.Shutdown()
	waitStatus(t, st.MetricsAddr, "/readyz", http.StatusServiceUnavailable)
	if code, _ := get(t, st.MetricsAddr, "/healthz"); code != 200 {
		t.Fatalf("/healthz while NATS is away: %d", code)
	}

	fleettest.StartServer(t, port, store)
	waitStatus(t, st.MetricsAddr, "/readyz", 200)

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("worker did not stop")
	}
	if !strings.Contains(out.String(), `"addr":"`+st.MetricsAddr) {
		t.Errorf("log does not say where metrics are served:\n%s", out.String())
	}
}

// A second worker on one machine does not fail on the default metrics port;
// a port chosen explicitly that is busy is an error.
func TestBusyMetricsPort(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("OPENAI_BASE_URL", "")
	t.Setenv("AGENTS_METRICS_ADDR", "")
	srv := fleettest.StartServer(t, 0, t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	var out logbuf.Buffer
	if code := run(context.Background(), []string{"--nats", srv.URL(), "--metrics-addr", ln.Addr().String()}, &out, nil); code != 1 ||
		!strings.Contains(out.String(), "cannot serve metrics") {
		t.Fatalf("explicit busy port: exit %d\n%s", code, out.String())
	}

	// Make sure the default port is busy (if something else holds it, so much the better).
	if def, err := net.Listen("tcp", "127.0.0.1:9464"); err == nil {
		defer def.Close()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan started, 1)
	done := make(chan int, 1)
	var out2 logbuf.Buffer
	go func() { done <- run(ctx, []string{"--nats", srv.URL()}, &out2, ready) }()
	select {
	case st := <-ready:
		if st.MetricsAddr == "" || strings.HasSuffix(st.MetricsAddr, ":9464") {
			t.Fatalf("metrics served on %q", st.MetricsAddr)
		}
	case code := <-done:
		t.Fatalf("worker exited %d:\n%s", code, out2.String())
	case <-time.After(20 * time.Second):
		t.Fatal("worker not ready")
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d:\n%s", code, out2.String())
	}
	if !strings.Contains(out2.String(), "serving metrics on a free port") {
		t.Errorf("no warning about the busy default port:\n%s", out2.String())
	}
}

// /metrics listens on loopback unless told otherwise, as everything else
// the worker opens does; deployments pass --metrics-addr=:9464.
func TestMetricsDefaultIsLoopback(t *testing.T) {
	t.Setenv("AGENTS_METRICS_ADDR", "")
	o, err := parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := net.SplitHostPort(o.metricsAddr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		t.Errorf("default --metrics-addr %q is not a loopback address", o.metricsAddr)
	}
}
