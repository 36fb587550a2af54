//go:build fault && linux

package faultsuite

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/freeport"
)

// bins are the binaries the suite runs, built once by TestMain.
var bins struct {
	dir    string
	worker string
	nats   string
	// replicasFlag is the worker's flag for stream replicas ("" if it has
	// none).
	replicasFlag string
	workerHelp   string
}

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "agentfleet-faultsuite-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "faultsuite:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		bins.dir = dir
		bins.worker = filepath.Join(dir, "worker")
		bins.nats = filepath.Join(dir, "nats-server")
		start := time.Now()
		wargs := []string{"build", "-o", bins.worker}
		if os.Getenv("FAULT_RACE") == "1" {
			wargs = append(wargs, "-race")
		}
		wargs = append(wargs, "./cmd/worker")
		for _, args := range [][]string{wargs, {"build", "-o", bins.nats, "github.com/nats-io/nats-server/v2"}} {
			cmd := exec.Command("go", args...)
			cmd.Dir = ".."
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				fmt.Fprintf(os.Stderr, "faultsuite: go %s: %v\n", strings.Join(args, " "), err)
				return 1
			}
		}
		help, _ := exec.Command(bins.worker, "--help").CombinedOutput()
		bins.workerHelp = string(help)
		if m := regexp.MustCompile(`(?m)^\s+-(\S*replicas\S*)`).FindStringSubmatch(bins.workerHelp); m != nil {
			bins.replicasFlag = "--" + m[1]
		}
		fmt.Fprintf(os.Stderr, "faultsuite: built worker and nats-server in %s (worker replicas flag: %q)\n",
			time.Since(start).Round(time.Millisecond), bins.replicasFlag)
		return m.Run()
	}()
	os.Exit(code)
}

// ---------------------------------------------------------------------------
// processes

// proc is a child process in its own process group, its output (stdout and
// stderr) kept in a file and in memory, line by line.
type proc struct {
	t       testing.TB
	name    string
	cmd     *exec.Cmd
	logPath string
	started time.Time

	mu      sync.Mutex
	lines   []string
	stamps  []time.Time
	waiters []*lineWaiter
	done    chan struct{}
	exitErr error
}

type lineWaiter struct {
	re *regexp.Regexp
	ch chan string
}

func startProc(t testing.TB, dir, name, bin string, args, env []string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	p := &proc{t: t, name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	fmt.Fprintf(f, "=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p.started = time.Now()
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(f, line)
			p.mu.Lock()
			p.lines = append(p.lines, line)
			p.stamps = append(p.stamps, time.Now())
			keep := p.waiters[:0]
			for _, w := range p.waiters {
				if w.re.MatchString(line) {
					w.ch <- line
				} else {
					keep = append(keep, w)
				}
			}
			p.waiters = keep
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		err := cmd.Wait()
		_ = pw.Close()
		<-readDone
		f.Close()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() { p.kill() })
	return p
}

// pid is the process id (and process group id).
func (p *proc) pid() int { return p.cmd.Process.Pid }

// signal sends sig to the whole process group.
func (p *proc) signal(sig syscall.Signal) {
	_ = syscall.Kill(-p.pid(), sig)
}

// kill SIGKILLs the process group and waits (bounded) for the exit.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Errorf("%s: did not exit 10s after SIGKILL", p.name)
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitExit waits for the process to exit and returns its exit code (-1 for
// a signal).
func (p *proc) waitExit(timeout time.Duration) (int, error) {
	select {
	case <-p.done:
	case <-time.After(timeout):
		return 0, fmt.Errorf("%s did not exit within %s", p.name, timeout)
	}
	return p.cmd.ProcessState.ExitCode(), nil
}

// waitLine waits for an output line matching re (also among lines already
// written) and returns it.
func (p *proc) waitLine(re string, timeout time.Duration) (string, error) {
	rx := regexp.MustCompile(re)
	w := &lineWaiter{re: rx, ch: make(chan string, 1)}
	p.mu.Lock()
	for _, l := range p.lines {
		if rx.MatchString(l) {
			p.mu.Unlock()
			return l, nil
		}
	}
	p.waiters = append(p.waiters, w)
	p.mu.Unlock()
	select {
	case l := <-w.ch:
		return l, nil
	case <-p.done:
		select {
		case l := <-w.ch:
			return l, nil
		default:
		}
		return "", fmt.Errorf("%s exited (%v) before printing /%s/; last lines:\n%s", p.name, p.exitErr, re, p.tail(30))
	case <-time.After(timeout):
		return "", fmt.Errorf("%s printed no /%s/ within %s; last lines:\n%s", p.name, re, timeout, p.tail(30))
	}
}

// output returns every line so far.
func (p *proc) output() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// linesSince returns the lines printed at or after t.
func (p *proc) linesSince(t time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for i, s := range p.stamps {
		if !s.Before(t) {
			out = append(out, p.lines[i])
		}
	}
	return out
}

func (p *proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.lines
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return "    " + strings.Join(l, "\n    ")
}

// workDir is the scenario's directory for logs and stores: a t.TempDir, or a
// kept directory with FAULT_KEEP=1.
func workDir(t testing.TB) string {
	if os.Getenv("FAULT_KEEP") == "1" {
		d, err := os.MkdirTemp("", "agentfleet-faultsuite-"+strings.ReplaceAll(t.Name(), "/", "_")+"-")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("keeping logs and stores in %s", d)
		return d
	}
	return t.TempDir()
}

// cleanEnv is the environment without NATS_*, OPENAI_* and AGENTS_*
// variables, plus extra.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "NATS_") || strings.HasPrefix(kv, "OPENAI_") || strings.HasPrefix(kv, "AGENTS_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// ---------------------------------------------------------------------------
// NATS

type natsNode struct {
	name                  string
	port, cport, httpPort int
	dir, conf             string
	p                     *proc
	starts                int
}

// natsCluster is one nats-server, or a cluster of them, with file storage.
type natsCluster struct {
	t     testing.TB
	dir   string
	nodes []*natsNode
	// user and password of clients, when extraConf requires them.
	user, password string
}

// startNATS starts n nats-server processes (n > 1: a cluster with routes
// between all of them) and waits until JetStream answers. auth is the
// user and password clients need when extraConf asks for them.
func startNATS(t testing.TB, dir string, n int, extraConf string, auth ...string) *natsCluster {
	t.Helper()
	c := &natsCluster{t: t, dir: dir}
	if len(auth) == 2 {
		c.user, c.password = auth[0], auth[1]
	}
	ports := freeport.PickN(t, 3*n)
	for i := range n {
		nd := &natsNode{name: fmt.Sprintf("n%d", i+1), port: ports[3*i], cport: ports[3*i+1], httpPort: ports[3*i+2]}
		nd.dir = filepath.Join(dir, nd.name)
		if err := os.MkdirAll(nd.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, nd)
	}
	for _, nd := range c.nodes {
		var b strings.Builder
		fmt.Fprintf(&b, "server_name: %s\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\nmax_payload: 1MB\n", nd.name, nd.port, nd.httpPort)
		fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n  max_memory_store: 64MB\n  max_file_store: 2GB\n}\n", filepath.Join(nd.dir, "store"))
		if n > 1 {
			fmt.Fprintf(&b, "cluster {\n  name: fault\n  listen: 127.0.0.1:%d\n  routes: [\n", nd.cport)
			for _, o := range c.nodes {
				fmt.Fprintf(&b, "    nats-route://127.0.0.1:%d\n", o.cport)
			}
			b.WriteString("  ]\n}\n")
		}
		b.WriteString(extraConf)
		nd.conf = filepath.Join(nd.dir, "nats.conf")
		if err := os.WriteFile(nd.conf, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.nodes {
		c.start(i)
	}
	c.waitJetStream(60 * time.Second)
	return c
}

// start starts node i (again) and waits until it accepts clients.
func (c *natsCluster) start(i int) {
	c.t.Helper()
	nd := c.nodes[i]
	nd.starts++
	nd.p = startProc(c.t, nd.dir, fmt.Sprintf("nats-%s-%d", nd.name, nd.starts), bins.nats, []string{"-c", nd.conf}, cleanEnv())
	if _, err := nd.p.waitLine(`Server is ready`, 30*time.Second); err != nil {
		c.t.Fatal(err)
	}
}

// kill SIGKILLs node i.
func (c *natsCluster) kill(i int) { c.nodes[i].p.kill() }

// URL lists every node's client URL.
func (c *natsCluster) URL() string {
	var u []string
	for _, nd := range c.nodes {
		u = append(u, fmt.Sprintf("nats://127.0.0.1:%d", nd.port))
	}
	return strings.Join(u, ",")
}

// waitJetStream waits until JetStream answers account info (a cluster has
// elected its meta leader).
func (c *natsCluster) waitJetStream(timeout time.Duration) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cl := c.client()
	defer cl.Close()
	for {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cl.JetStream().AccountInfo(actx)
		acancel()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("JetStream not available within %s: %v%s", timeout, err, c.nodeTails(20))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// nodeTails is each node's state and last n log lines, for a failure's
// message: whether a cluster formed is only in the servers' logs.
func (c *natsCluster) nodeTails(n int) string {
	var b strings.Builder
	for _, nd := range c.nodes {
		state := "running"
		if nd.p.exited() {
			state = "exited"
		}
		fmt.Fprintf(&b, "\n  %s (%s, log %s):\n%s", nd.name, state, nd.p.logPath, nd.p.tail(n))
	}
	return b.String()
}

// client connects to the servers (with the cluster's user and password).
func (c *natsCluster) client() *bus.Client {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := bus.Connect(ctx, bus.ConnectOptions{URL: c.URL(), Name: "faultsuite", User: c.user, Password: c.password})
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// ---------------------------------------------------------------------------
// workers

// fleet is NATS, the worker processes and a client.
type fleet struct {
	t       *testing.T
	dir     string
	nats    *natsCluster
	c       *bus.Client
	ackWait time.Duration
	drain   time.Duration
	// maxDeliver is the worker's --max-deliver.
	maxDeliver int
	// concurrency is each worker's --concurrency.
	concurrency int
	extraArgs   []string

	mu      sync.Mutex
	workers map[string]*proc // by worker id
	gen     int
}

func ackWait() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("FAULT_ACK_WAIT")); err == nil && d >= time.Second {
		return d
	}
	return 4 * time.Second
}

func newFleet(t *testing.T, dir string, nc *natsCluster) *fleet {
	f := &fleet{t: t, dir: dir, nats: nc, ackWait: ackWait(), drain: 2 * time.Second,
		maxDeliver: 10, concurrency: 8, workers: map[string]*proc{}}
	f.c = nc.client()
	t.Cleanup(f.c.Close)
	return f
}

// startWorker starts a worker process named id and waits until it pulls.
func (f *fleet) startWorker(id string) *proc {
	f.t.Helper()
	args := []string{"--nats", f.nats.URL(), "--queue", "default",
		"--concurrency", strconv.Itoa(f.concurrency),
		"--ack-wait", f.ackWait.String(), "--drain-timeout", f.drain.String(),
		"--max-deliver", strconv.Itoa(f.maxDeliver), "--worker-id", id,
		"--log-format", "json", "--log-level", "info",
		"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", freeport.Pick(f.t)),
		"--data-dir", filepath.Join(f.dir, "data-"+id)}
	args = append(args, f.extraArgs...)
	p := startProc(f.t, f.dir, "worker-"+id, bins.worker, args, cleanEnv())
	if _, err := p.waitLine(`"msg":"worker started"`, 60*time.Second); err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.workers[id] = p
	f.mu.Unlock()
	return p
}

func (f *fleet) worker(id string) *proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.workers[id]
}

// ctx is a bounded context for one client call.
func (f *fleet) ctx(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// ---------------------------------------------------------------------------
// seeds

func seed(t testing.TB) *rand.Rand {
	s := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("FAULT_SEED"), 10, 64); err == nil {
		s = v
	}
	t.Logf("seed %d (FAULT_SEED=%d reproduces the schedule)", s, s)
	return rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
}

// ---------------------------------------------------------------------------
// raw events

// rawEvents reads every envelope stored for a run, stale attempts included,
// in stream order: up to the run's last stored message as the stream's
// leader answers now (the consumer may sit on a replica that lags behind).
func rawEvents(ctx context.Context, c *bus.Client, id string) ([]*bus.Envelope, error) {
	n := c.Names()
	s, err := c.JetStream().Stream(ctx, n.EventsStream())
	if err != nil {
		return nil, err
	}
	last, err := s.GetLastMsgForSubject(ctx, n.Events(id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	cons, release, err := c.OrderedEvents(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{n.Events(id)}, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return nil, err
	}
	defer release()
	it, err := cons.Messages()
	if err != nil {
		return nil, err
	}
	defer it.Stop()
	var out []*bus.Envelope
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return out, err
		}
		env, err := bus.DecodeEnvelope(m.Data())
		if err != nil {
			return out, fmt.Errorf("envelope %d of %s: %w", len(out)+1, id, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return out, err
		}
		env.StreamSeq = md.Sequence.Stream
		out = append(out, env)
		if env.StreamSeq >= last.Sequence {
			return out, nil
		}
	}
}
