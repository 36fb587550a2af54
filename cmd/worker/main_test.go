package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/logbuf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHelp(t *testing.T) {
	var out logbuf.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, nil); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, f := range []string{"-nats ", "-queue", "-concurrency", "-ack-wait", "-max-deliver", "-drain-timeout",
		"-data-dir", "-metrics-addr", "-log-format", "-models", "-default-model", "-openai-base-url",
		"-openai-api-key-file", "-creds", "-nkey", "-tlscert", "-user", "-password", "-token", "NATS_URL", "OPENAI_API_KEY"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("--help does not mention %s", f)
		}
	}
	if code := run(context.Background(), []string{"--bogus"}, &out, nil); code != 2 {
		t.Fatalf("bad flag: exit %d", code)
	}
	if code := run(context.Background(), []string{"--queue", "a.b"}, &out, nil); code != 2 {
		t.Fatalf("bad queue: exit %d", code)
	}
}

// An environment value that does not parse stops the worker before it
// starts anything, naming the variable and what is wrong, instead of being
// replaced by the default.
func TestEnvironmentThatDoesNotParseIsRefused(t *testing.T) {
	t.Setenv("AGENTS_ACK_WAIT", "30")
	t.Setenv("AGENTS_CONCURRENCY", "eight")
	t.Setenv("AGENTS_NATS_LISTEN", "127.0.0.1:0")
	t.Setenv("AGENTS_DATA_DIR", t.TempDir())
	t.Setenv("AGENTS_METRICS_ADDR", "")
	var out logbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan started, 1)
	done := make(chan int, 1)
	go func() { done <- run(ctx, nil, &out, ready) }()
	select {
	case code := <-done:
		if code != 2 {
			t.Fatalf("exit %d:\n%s", code, out.String())
		}
	case <-ready:
		cancel()
		<-done
		t.Fatalf("the worker started with AGENTS_ACK_WAIT=30:\n%s", out.String())
	}
	for _, want := range []string{`AGENTS_ACK_WAIT="30" is not a duration`, "needs a unit", `AGENTS_CONCURRENCY="eight" is not a whole number`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	// A valid value in the environment is taken.
	t.Setenv("AGENTS_ACK_WAIT", "30s")
	t.Setenv("AGENTS_CONCURRENCY", "3")
	o, err := parse(nil, &out)
	if err != nil || o.ackWait != 30*time.Second || o.concurrency != 3 {
		t.Fatalf("parse: %+v %v", o, err)
	}
}

func TestEmbeddedWorkerRunsADemoRun(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("OPENAI_BASE_URL", "")
	t.Setenv("NATS_URL", "")
	var out logbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan started, 1)
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--nats-listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-format", "json", "--ack-wait", "5s", "--metrics-addr", ""}, &out, ready)
	}()
	var url string
	select {
	case st := <-ready:
		url = st.NATSURL
	case code := <-done:
		t.Fatalf("worker exited %d:\n%s", code, out.String())
	case <-time.After(20 * time.Second):
		t.Fatal("worker not ready")
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	c, err := bus.Connect(cctx, bus.ConnectOptions{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Submit(cctx, "", &bus.RunRequest{Prompt: "ping"})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.LoadTranscript(cctx, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Finished.Status != bus.StatusSucceeded || !strings.Contains(tr.FinalText(), "You said: ping") {
		t.Fatalf("demo run: %+v %q", tr.Finished, tr.FinalText())
	}
	cancel() // SIGTERM
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("worker did not stop")
	}
	log := out.String()
	for _, want := range []string{"DEMO model", "embedded NATS server started", `"run":"` + res.ID + `"`, "worker exited",
		`ready: in another terminal, submit --nats ` + url + ` \"Hello, fleet\"`} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	// The embedded server's banner stays out of the log: one line says
	// where it listens.
	for _, banner := range []string{"Starting nats-server", "JETSTREAM", "Server is ready", "Initiating Shutdown"} {
		if strings.Contains(log, banner) {
			t.Errorf("log has the server's banner line %q:\n%s", banner, log)
		}
	}
}

// The first start says what to run next and where the data lives.
func TestNextSteps(t *testing.T) {
	var out strings.Builder
	o := &options{queues: []string{"default"}, dataDir: "/home/u/.agentfleet", logFormat: "text"}
	nextSteps(&out, nil, o, "nats://127.0.0.1:4222")
	for _, want := range []string{"In another terminal:\n\n    submit \"Hello, fleet\"\n", "kept in /home/u/.agentfleet across restarts",
		"delete that directory", "go install ./cmd/..."} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	out.Reset()
	o.queues = []string{"mcp"}
	nextSteps(&out, nil, o, "nats://127.0.0.1:5222")
	if !strings.Contains(out.String(), `submit --nats nats://127.0.0.1:5222 --queue mcp "Hello, fleet"`) {
		t.Errorf("another port and queue:\n%s", out.String())
	}
}

func TestBusyPort(t *testing.T) {
	t.Setenv("NATS_URL", "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var out logbuf.Buffer
	code := run(context.Background(), []string{"--nats-listen", ln.Addr().String(), "--data-dir", t.TempDir(), "--metrics-addr", ""}, &out, nil)
	if code != 1 || !strings.Contains(out.String(), "already in use") {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
}

// Sizes and the embedded server's sync setting parse, and bad values stop
// the worker naming the flag or variable.
func TestSizeAndSyncFlags(t *testing.T) {
	var out logbuf.Buffer
	o, err := parse([]string{"--events-max-bytes", "10GiB", "--requests-max-bytes", "1048576", "--nats-sync", "always"}, &out)
	if err != nil || o.eventsMaxBytes != 10<<30 || o.requestsMaxBytes != 1<<20 || o.controlMaxBytes != 0 || o.natsSync != "always" || o.fetchBytes != 16<<20 {
		t.Fatalf("parse: %+v %v", o, err)
	}
	t.Setenv("AGENTS_CONTROL_MAX_BYTES", "512MiB")
	t.Setenv("AGENTS_NATS_SYNC", "10s")
	t.Setenv("AGENTS_FETCH_BYTES", "4MiB")
	if o, err = parse(nil, &out); err != nil || o.controlMaxBytes != 512<<20 || o.natsSync != "10s" || o.fetchBytes != 4<<20 {
		t.Fatalf("parse from env: %+v %v", o, err)
	}
	for _, c := range []struct {
		args []string
		env  [2]string
		want string
	}{
		{[]string{"--events-max-bytes", "lots"}, [2]string{}, `"lots" is not a size`},
		{nil, [2]string{"AGENTS_CONTROL_MAX_BYTES", "-5"}, `AGENTS_CONTROL_MAX_BYTES: "-5" is not a size`},
		{[]string{"--nats-sync", "sometimes"}, [2]string{}, `--nats-sync: sync "sometimes" must be "always"`},
		{nil, [2]string{"AGENTS_NATS_SYNC", "30"}, `--nats-sync: sync "30"`},
		{[]string{"--fetch-bytes", "0"}, [2]string{}, `--fetch-bytes must be at least 1`},
		{nil, [2]string{"AGENTS_FETCH_BYTES", "much"}, `AGENTS_FETCH_BYTES: "much" is not a size`},
	} {
		t.Run(strings.Join(c.args, " ")+c.env[0], func(t *testing.T) {
			if c.env[0] != "" {
				t.Setenv(c.env[0], c.env[1])
			}
			var msgs logbuf.Buffer
			if _, err := parse(c.args, &msgs); err == nil || !strings.Contains(err.Error()+msgs.String(), c.want) {
				t.Fatalf("got %v / %s, want %q", err, msgs.String(), c.want)
			}
		})
	}
}

// The child runs' ceilings (issue 56): defaults, flags, and bounds.
func TestChildCeilingFlags(t *testing.T) {
	var out logbuf.Buffer
	o, err := parse(nil, &out)
	if err != nil || o.maxChildDepth != 3 || o.maxChildren != 100 {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	if o, err = parse([]string{"--max-child-depth", "5", "--max-children", "20"}, &out); err != nil || o.maxChildDepth != 5 || o.maxChildren != 20 {
		t.Fatalf("flags: %+v %v", o, err)
	}
	for _, args := range [][]string{{"--max-child-depth", "0"}, {"--max-children", "-1"}, {"--max-child-depth", "33"}} {
		var msgs logbuf.Buffer
		if _, err := parse(args, &msgs); err == nil || !strings.Contains(err.Error(), "--max-child-depth must be in 1..32 and --max-children in 1..10000") {
			t.Errorf("%q: %v", args, err)
		}
	}
}
