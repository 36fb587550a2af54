package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/freeport"
	"github.com/agentfleet/agentfleet/internal/logbuf"
)

func TestGCPercent(t *testing.T) {
	for _, c := range []struct {
		gogc  string
		limit int64
		want  int
	}{
		{"", math.MaxInt64, 0}, // no limit: the runtime's 100
		{"", 512 << 20, 400},   // a limit bounds the heap
		{"150", 512 << 20, 0},  // GOGC wins
		{"off", math.MaxInt64, 0},
	} {
		if got := gcPercent(c.gogc, c.limit); got != c.want {
			t.Errorf("gcPercent(%q, %d) = %d, want %d", c.gogc, c.limit, got, c.want)
		}
	}
}

// The worker process, not the code under test in this process: its Go
// collector's percent as its own /metrics reports it.
func TestWorkerProcessCollectorPercent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the worker")
	}
	bin := filepath.Join(t.TempDir(), "worker")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	srv := fleettest.StartServer(t, freeport.Pick(t), t.TempDir())
	gogc := regexp.MustCompile(`(?m)^go_gc_gogc_percent (\d+)$`)
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"NO_LIMIT=1"}, "100"},
		{[]string{"GOMEMLIMIT=512MiB"}, "400"},
		{[]string{"GOMEMLIMIT=512MiB", "GOGC=150"}, "150"},
	} {
		t.Run(strings.Join(c.env, ","), func(t *testing.T) {
			addr := fmt.Sprintf("127.0.0.1:%d", freeport.Pick(t))
			cmd := exec.Command(bin, "--nats", srv.URL(), "--metrics-addr", addr)
			for _, kv := range os.Environ() {
				if k, _, _ := strings.Cut(kv, "="); k != "GOGC" && k != "GOMEMLIMIT" && k != "AGENTS_LOG_LEVEL" && !strings.HasPrefix(k, "OPENAI_") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, c.env...)
			var out logbuf.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			defer func() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(20 * time.Second):
					_ = cmd.Process.Kill()
					<-exited
				}
			}()
			body := scrape(t, addr, exited, &out)
			// /metrics is served before the worker ensures its streams:
			// stopping it then leaves stream creations queued at the server,
			// and the server's shutdown at the test's end can race one and
			// leave its file store running (a goleak failure under load).
			waitLog(t, &out, `"worker started"`, exited)
			m := gogc.FindStringSubmatch(body)
			if m == nil {
				t.Fatalf("no go_gc_gogc_percent in /metrics; worker log:\n%s", out.String())
			}
			if m[1] != c.want {
				t.Fatalf("GOGC percent %s, want %s", m[1], c.want)
			}
		})
	}
}

// scrape waits until the process serves /metrics (it connects to NATS
// first) and returns the page; it fails if the process exits first.
func scrape(t *testing.T, addr string, exited <-chan struct{}, log *logbuf.Buffer) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	client := &http.Client{Timeout: 5 * time.Second}
	for {
		if resp, err := client.Get("http://" + addr + "/metrics"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return string(b)
			}
		}
		select {
		case <-tick.C:
		case <-exited:
			t.Fatalf("the worker exited:\n%s", log.String())
		case <-deadline:
			t.Fatalf("no /metrics within 30 s:\n%s", log.String())
		}
	}
}

// waitLog waits until the process's log holds want; it fails if the
// process exits first.
func waitLog(t *testing.T, log *logbuf.Buffer, want string, exited <-chan struct{}) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(log.String(), want) {
		select {
		case <-tick.C:
		case <-exited:
			t.Fatalf("the worker exited before logging %s:\n%s", want, log.String())
		case <-deadline:
			t.Fatalf("no %s in the log within 30 s:\n%s", want, log.String())
		}
	}
}
