package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/testpar"
)

// raceEnabled is set by race_test.go: the submit binary is then built with
// -race too.
var raceEnabled bool

// fleet is what every test of this package shares: the two binaries, an
// embedded NATS server on a random port, and one worker process on it.
var fleet struct {
	dir    string // binaries
	submit string
	worker string
	url    string
	// The nats CLI, built when not on the PATH (natscli_test.go).
	natsOnce sync.Once
	natsDir  string
	natsErr  error
}

func TestMain(m *testing.M) {
	// The tests wait on processes (submit, workers) more than they compute.
	testpar.Default(4)
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "submit-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := buildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv, err := fleettest.NewServer(0, filepath.Join(dir, "nats"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fleet.url = srv.URL()
	// faux/small has a window: docs/protocol.md's compaction example.
	models := filepath.Join(dir, "models.json")
	if err := os.WriteFile(models, []byte(`[{"id":"faux/small","contextWindow":8192}]`), 0o600); err != nil {
		srv.Shutdown()
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stopWorker, _, err := startWorkerProcess(filepath.Join(dir, "worker.log"), nil, "--nats", fleet.url, "--concurrency", "16", "--models", models)
	if err != nil {
		srv.Shutdown()
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if err := stopWorker(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		code = 1
	}
	srv.Shutdown()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// buildBinaries builds cmd/submit and cmd/worker into dir, once per test
// binary.
func buildBinaries(dir string) error {
	build := func(pkg, name string, race bool) error {
		args := []string{"build", "-o", filepath.Join(dir, name)}
		if race {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, pkg)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
		return nil
	}
	errs := make(chan error, 2)
	go func() { errs <- build("github.com/agentfleet/agentfleet/cmd/submit", "submit", raceEnabled) }()
	go func() { errs <- build("github.com/agentfleet/agentfleet/cmd/worker", "worker", false) }()
	if err := errors.Join(<-errs, <-errs); err != nil {
		return err
	}
	fleet.dir = dir
	fleet.submit = filepath.Join(dir, "submit")
	fleet.worker = filepath.Join(dir, "worker")
	return nil
}

// startWorkerProcess starts the worker binary and waits until it has
// created the streams and pulls. Without --nats in args it starts its
// embedded server: url is where. stop sends SIGTERM and waits.
func startWorkerProcess(logPath string, env []string, args ...string) (stop func() error, url string, err error) {
	stop, _, url, err = startKillableWorker(logPath, env, args...)
	return stop, url, err
}

// startKillableWorker is startWorkerProcess that can also kill the worker
// (SIGKILL, as kill -9); kill waits for it to be gone.
func startKillableWorker(logPath string, env []string, args ...string) (stop func() error, kill func(), url string, err error) {
	// Metrics on a free port: workers of parallel tests must not collide.
	args = append([]string{"--ack-wait", "10s", "--drain-timeout", "2s", "--log-format", "json", "--metrics-addr", "127.0.0.1:0"}, args...)
	cmd := exec.Command(fleet.worker, args...)
	cmd.Env = append(append(os.Environ(), "OPENAI_API_KEY=", "OPENAI_BASE_URL=", "NATS_URL="), env...)
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, nil, "", err
	}
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, nil, "", err
	}
	ready := make(chan struct{})
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			var rec struct {
				Msg string `json:"msg"`
				URL string `json:"url"`
			}
			_ = json.Unmarshal([]byte(line), &rec)
			if strings.HasPrefix(rec.Msg, "embedded NATS server started") {
				url = rec.URL // read after ready
			}
			if rec.Msg == "worker started" {
				once.Do(func() { close(ready) })
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		pw.Close()
		exited <- err
	}()
	var once sync.Once
	var stopErr error
	end := func(sig os.Signal) error {
		once.Do(func() {
			_ = cmd.Process.Signal(sig)
			stopErr = <-exited
			<-copied
			logf.Close()
		})
		return stopErr
	}
	stop = func() error { return end(syscall.SIGTERM) }
	kill = func() { _ = end(syscall.SIGKILL) }
	select {
	case <-ready:
		return stop, kill, url, nil
	case err := <-exited:
		<-copied
		logf.Close()
		log, _ := os.ReadFile(logPath)
		return nil, nil, "", fmt.Errorf("worker exited before it was ready: %v\n%s", err, log)
	case <-time.After(30 * time.Second):
		_ = stop()
		return nil, nil, "", errors.New("worker not ready after 30s")
	}
}

// outBuf is a concurrency-safe buffer that can wait for text to appear.
type outBuf struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{}
}

func newOutBuf() *outBuf { return &outBuf{changed: make(chan struct{}, 1)} }

func (o *outBuf) Write(p []byte) (int, error) {
	o.mu.Lock()
	n, err := o.b.Write(p)
	o.mu.Unlock()
	select {
	case o.changed <- struct{}{}:
	default:
	}
	return n, err
}

func (o *outBuf) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// waitFor waits until the output (without colour and status-line escapes)
// contains s.
func (o *outBuf) waitFor(t *testing.T, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if strings.Contains(clean(o.String()), s) {
			return
		}
		select {
		case <-o.changed:
		case <-deadline.C:
			t.Fatalf("no %q in the output after %s:\n%s", s, timeout, o.String())
		}
	}
}

// clean removes escape sequences and carriage returns.
func clean(s string) string {
	return strings.ReplaceAll(stripANSI(s), "\r", "")
}

// proc is a submit process running in the background.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *outBuf
	done           chan struct{}
	code           int
}

func submitEnv(extra ...string) []string {
	// A race-built submit would sleep a second at every exit (the race
	// runtime's atexit_sleep_ms): a race it found still makes it exit 66.
	env := []string{"NATS_URL=" + fleet.url, "NO_COLOR=1", "PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "GORACE=atexit_sleep_ms=0"}
	return append(env, extra...)
}

// start runs submit in the background.
func start(t *testing.T, stdin io.Reader, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(fleet.submit, args...), stdout: newOutBuf(), stderr: newOutBuf(), done: make(chan struct{})}
	p.cmd.Env = submitEnv()
	p.cmd.Stdout, p.cmd.Stderr, p.cmd.Stdin = p.stdout, p.stderr, stdin
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
		default:
			p.code = -1
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(60 * time.Second):
		t.Fatalf("submit %v did not exit:\nstdout:\n%s\nstderr:\n%s", p.cmd.Args[1:], p.stdout, p.stderr)
		return -1
	}
}

// submit runs submit to the end: stdout, stderr and the exit code.
func submit(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return submitIn(t, nil, args...)
}

func submitIn(t *testing.T, stdin io.Reader, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	p := start(t, stdin, args...)
	code = p.wait(t)
	return p.stdout.String(), p.stderr.String(), code
}

// request writes a run request file.
func request(t *testing.T, body string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "run.json")
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}
