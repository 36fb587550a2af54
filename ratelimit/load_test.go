//go:build limits

// Load tests of the shared limits with real worker processes against a
// rate-limited provider. They take minutes:
//
//	go test -tags limits -run . -v -timeout 15m ./ratelimit
package ratelimit_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// minuteProvider is an OpenAI-compatible streaming server enforcing RPM
// and TPM over a sliding minute; a call's tokens are ceil(bytes of its
// body / 4) plus the 5 it answers; past a limit it answers 429 with
// Retry-After. It asks for the calculator until the conversation has a
// tool result. hold, when set, keeps the first call open until released.
type minuteProvider struct {
	rpm, tpm int

	mu       sync.Mutex
	calls    []time.Time
	tokens   []int
	rejected int
	hold     chan struct{}
	held     chan struct{} // closed when the held call arrived
	first    bool
	arrivals []time.Time
}

func (p *minuteProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	cost := (len(body)+3)/4 + 5
	now := time.Now()
	p.mu.Lock()
	p.arrivals = append(p.arrivals, now)
	req, tok := 0, 0
	var oldest time.Time
	for i, at := range p.calls {
		if now.Sub(at) < time.Minute {
			if oldest.IsZero() {
				oldest = at
			}
			req++
			tok += p.tokens[i]
		}
	}
	if req+1 > p.rpm || tok+cost > p.tpm {
		p.rejected++
		p.mu.Unlock()
		wait := max(int(time.Until(oldest.Add(time.Minute))/time.Second)+1, 1)
		w.Header().Set("Retry-After", strconv.Itoa(wait))
		http.Error(w, `{"error":{"message":"rate limited","type":"rate_limit"}}`, http.StatusTooManyRequests)
		return
	}
	p.calls, p.tokens = append(p.calls, now), append(p.tokens, cost)
	holdThis := p.hold != nil && !p.first
	p.first = p.first || holdThis
	p.mu.Unlock()
	if holdThis {
		close(p.held)
		select {
		case <-p.hold:
		case <-r.Context().Done():
		}
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := func(delta, finish string) {
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":%q}]}\n\n", delta, finish)
	}
	time.Sleep(50 * time.Millisecond)
	if strings.Contains(string(body), `"role":"tool"`) {
		chunk(`{"role":"assistant","content":"It is 42."}`, "stop")
	} else {
		chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"calculator","arguments":"{\"expression\":\"6*7\"}"}}]}`, "tool_calls")
	}
	fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":5,\"total_tokens\":%d}}\n\n", cost-5, cost)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// tokensBetween is what the provider accepted in [from, to).
func (p *minuteProvider) tokensBetween(from, to time.Time) (calls, tokens int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, at := range p.calls {
		if !at.Before(from) && at.Before(to) {
			calls++
			tokens += p.tokens[i]
		}
	}
	return calls, tokens
}

func (p *minuteProvider) rejections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rejected
}

// workerSeq names worker processes: ids must differ across the fleet.
var workerSeq atomic.Int64

var buildOnce struct {
	sync.Once
	bin string
	err error
}

// workerBinary builds cmd/worker once.
func workerBinary(t *testing.T) string {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ratelimit-load")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.bin = filepath.Join(dir, "worker")
		out, err := exec.Command("go", "build", "-o", buildOnce.bin, "github.com/agentfleet/agentfleet/cmd/worker").CombinedOutput()
		if err != nil {
			buildOnce.err = fmt.Errorf("%v: %s", err, out)
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.bin
}

// startWorkers starts n worker processes with slots each on the NATS
// server, the provider and the model table; they are killed at the end.
func startWorkers(t *testing.T, natsURL, providerURL, table string, n, slots int) []*exec.Cmd {
	bin := workerBinary(t)
	dir := t.TempDir()
	models := filepath.Join(dir, "models.json")
	if err := os.WriteFile(models, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	for i := range n {
		cmd := exec.Command(bin, "--nats", natsURL, "--concurrency", strconv.Itoa(slots), "--models", models,
			"--metrics-addr", "", "--worker-id", fmt.Sprintf("load-%d", workerSeq.Add(1)), "--log-level", "warn")
		cmd.Env = append(os.Environ(), "OPENAI_BASE_URL="+providerURL+"/v1", "OPENAI_API_KEY=test")
		log, err := os.Create(filepath.Join(dir, fmt.Sprintf("worker-%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
			_ = log.Close()
		})
	}
	return cmds
}

// prompt is about 500 tokens a call.
var prompt = "What is 6*7? Use the calculator. " + strings.Repeat("Context that makes the call about five hundred tokens long. ", 26)

// load submits tool-using runs, keeping the queue ahead of the workers,
// for d.
func load(t *testing.T, c *bus.Client, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	end := time.Now().Add(d)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) {
		if _, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: prompt, Tools: []string{"calculator"}}); err != nil {
			t.Fatalf("submit: %v", err)
		}
		<-tick.C
	}
}

// fleetServer is a NATS server with the streams made.
func fleetServer(t *testing.T) (string, *bus.Client) {
	srv := fleettest.StartServer(t, 0, t.TempDir())
	c := fleettest.Connect(t, srv.URL())
	if err := c.EnsureStreams(fleettest.Context(t), bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	return srv.URL(), c
}

func provider(t *testing.T, p *minuteProvider) string {
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv.URL
}

// Three worker processes with 16 slots each, the model's limits at 90% of
// the provider's RPM 600 and TPM 60,000: no 429 in 150 s and at least 80%
// of the configured TPM achieved in the middle minute. Without the limits
// the same load gets 429s.
func TestLoadThreeWorkers(t *testing.T) {
	const tpm = 54000
	t.Run("limited", func(t *testing.T) {
		natsURL, c := fleetServer(t)
		p := &minuteProvider{rpm: 600, tpm: 60000}
		startWorkers(t, natsURL, provider(t, p),
			`[{"id":"m","maxTokens":20,"limits":{"rpm":540,"tpm":54000}}]`, 3, 16)
		start := time.Now()
		load(t, c, 150*time.Second)
		calls, tokens := p.tokensBetween(start.Add(45*time.Second), start.Add(105*time.Second))
		t.Logf("middle minute: %d calls, %d tokens (%.0f%% of the configured TPM); 429s: %d", calls, tokens, 100*float64(tokens)/tpm, p.rejections())
		if n := p.rejections(); n > 0 {
			t.Errorf("%d 429s with the shared limits", n)
		}
		if tokens < tpm*8/10 {
			t.Errorf("middle minute: %d tokens, less than 80%% of the configured %d", tokens, tpm)
		}
	})
	t.Run("unlimited", func(t *testing.T) {
		natsURL, c := fleetServer(t)
		p := &minuteProvider{rpm: 600, tpm: 60000}
		startWorkers(t, natsURL, provider(t, p), `[{"id":"m","maxTokens":20}]`, 3, 16)
		load(t, c, 30*time.Second)
		if n := p.rejections(); n == 0 {
			t.Error("no 429 without limits: the load test measures nothing")
		} else {
			t.Logf("without limits: %d 429s in 30 s", n)
		}
	})
}

// A worker process killed (SIGKILL) while its call holds the group's only
// slot: another worker's call goes through within one window.
func TestKilledWorkerFreesCapacity(t *testing.T) {
	natsURL, c := fleetServer(t)
	p := &minuteProvider{rpm: 600, tpm: 1 << 30, hold: make(chan struct{}), held: make(chan struct{})}
	t.Cleanup(func() { close(p.hold) })
	url := provider(t, p)
	table := `[{"id":"m","maxTokens":20,"limits":{"concurrency":1}}]`
	holder := startWorkers(t, natsURL, url, table, 1, 1)[0]
	ctx := fleettest.Context(t)
	if _, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "hold", Tools: []string{"calculator"}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the first call never arrived")
	}
	startWorkers(t, natsURL, url, table, 1, 1)
	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if _, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "after", Tools: []string{"calculator"}}); err != nil {
		t.Fatal(err)
	}
	deadline := killed.Add(time.Minute)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		n := len(p.arrivals)
		var last time.Time
		if n > 0 {
			last = p.arrivals[n-1]
		}
		p.mu.Unlock()
		if n >= 2 {
			t.Logf("a call went through %v after the holder was killed", last.Sub(killed))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("no call went through within one window (60 s) of the kill")
}
