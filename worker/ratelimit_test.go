package worker_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/llm/openai"
	"github.com/agentfleet/agentfleet/ratelimit"
	"github.com/agentfleet/agentfleet/worker"
)

// limitedProvider is an OpenAI-compatible streaming server that enforces
// RPM and TPM over a sliding window, as providers do, and answers 429 with
// Retry-After past them. A call's tokens are ceil(bytes of its body / 4)
// plus the 5 it answers. It asks for the calculator until the
// conversation has a tool result, then answers in text.
type limitedProvider struct {
	rpm, tpm int
	window   time.Duration
	extra    int // input tokens reported beyond the real ones

	mu       sync.Mutex
	calls    []time.Time
	tokens   []int
	rejected int
	inFlight int
	maxIn    int
}

func (p *limitedProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	cost := (len(body)+3)/4 + 5
	now := time.Now()
	p.mu.Lock()
	req, tok := 0, 0
	for i, at := range p.calls {
		if now.Sub(at) < p.window {
			req++
			tok += p.tokens[i]
		}
	}
	if req+1 > p.rpm || tok+cost > p.tpm {
		p.rejected++
		p.mu.Unlock()
		w.Header().Set("Retry-After", strconv.Itoa(max(int(p.window/time.Second), 1)))
		http.Error(w, `{"error":{"message":"rate limited","type":"rate_limit"}}`, http.StatusTooManyRequests)
		return
	}
	p.calls, p.tokens = append(p.calls, now), append(p.tokens, cost)
	p.inFlight++
	p.maxIn = max(p.maxIn, p.inFlight)
	p.mu.Unlock()
	defer func() { p.mu.Lock(); p.inFlight--; p.mu.Unlock() }()

	w.Header().Set("Content-Type", "text/event-stream")
	chunk := func(delta string, finish string) {
		f := "null"
		if finish != "" {
			f = strconv.Quote(finish)
		}
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":%s}]}\n\n", delta, f)
	}
	time.Sleep(20 * time.Millisecond) // a model takes a while
	if strings.Contains(string(body), `"role":"tool"`) {
		chunk(`{"role":"assistant","content":"It is 42."}`, "stop")
	} else {
		chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"calculator","arguments":"{\"expression\":\"6*7\"}"}}]}`, "tool_calls")
	}
	fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":5,\"total_tokens\":%d}}\n\n", cost-5+p.extra, cost+p.extra)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// modelAt is the provider of model "m" (50 output tokens) served at url.
func modelAt(t *testing.T, url string) *openai.Provider {
	t.Helper()
	prov, err := openai.New(openai.Config{BaseURL: url + "/v1", Models: []openai.ModelInfo{{ID: "m", MaxTokens: 50}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prov.CloseIdleConnections)
	return prov
}

func (p *limitedProvider) stats() (rejected, calls, maxIn int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rejected, len(p.calls), p.maxIn
}

// limitsFleet runs workers against the provider, with the model's shared
// limits or without, and n tool-using runs; it returns the runs' events.
func limitsFleet(t *testing.T, p *limitedProvider, lim *ratelimit.Limits, workers, slots, runs int) [][]*bus.Envelope {
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	f := newFleet(t)
	for range workers {
		cfg := worker.Config{Concurrency: slots, DefaultModel: "openai/m"}
		pcfg := openai.Config{BaseURL: srv.URL + "/v1", Models: []openai.ModelInfo{{ID: "m", MaxTokens: 50}},
			RetryBaseDelay: 50 * time.Millisecond, MaxRetries: 20}
		if lim != nil {
			seam := ratelimit.NewSeam(map[string]string{"m": "main"})
			cfg.RateLimits = &worker.RateLimits{Window: p.window, Liveness: p.window, Seam: seam,
				Models: map[string]worker.ModelLimit{"openai/m": {Group: "main", Limits: *lim, MaxTokens: 50}}}
			pcfg.Gate, pcfg.OnRetryAfter = seam.Gate, seam.OnRetryAfter
		}
		prov, err := openai.New(pcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(prov.CloseIdleConnections)
		cfg.Providers = map[string]worker.Provider{"openai": prov}
		f.StartWorker(cfg)
	}
	ids := make([]string, runs)
	for i := range ids {
		ids[i] = f.Submit("", &bus.RunRequest{Prompt: "what is 6*7?", Tools: []string{"calculator"}})
	}
	out := make([][]*bus.Envelope, runs)
	for i, id := range ids {
		fin := f.WaitFinished(id)
		if fin.Status != bus.StatusSucceeded {
			t.Fatalf("run %s: %s %s %s", id, fin.Status, fin.Reason, fin.Error)
		}
		out[i] = f.Follow(id)
	}
	return out
}

// Three workers share a model's limits set below the provider's: the
// provider never answers 429, and calls that had to wait say so. Without
// the limits the same load gets 429s: the test measures something.
//
// The limit is half the provider's. The limiter counts a call when it
// grants it, the provider when the request arrives; on a loaded machine a
// grant can take hundreds of milliseconds to arrive, so six grants that
// arrive late and the next window's three on time were nine in one of the
// provider's windows (one 429 in a loaded run at 6 against 8). With half,
// only a delay of a whole window could do that (the window is the
// providers' minute shortened to a second: the skew is 60 times larger
// against it than in production).
func TestSharedLimitsAvoid429s(t *testing.T) {
	t.Parallel()
	const window = time.Second
	t.Run("limited", func(t *testing.T) {
		p := &limitedProvider{rpm: 8, tpm: 100000, window: window}
		envs := limitsFleet(t, p, &ratelimit.Limits{RPM: 4, TPM: 90000}, 3, 4, 8)
		rejected, calls, _ := p.stats()
		if rejected > 0 {
			t.Fatalf("%d calls got a 429 with the shared limits (%d calls)", rejected, calls)
		}
		waits := 0
		for _, run := range envs {
			for _, e := range run {
				if ev := fleettest.Decode(t, e); ev.ModelWait != nil {
					if ev.ModelWait.Reason != bus.WaitRateLimit || ev.ModelWait.WaitedMs <= 0 {
						t.Fatalf("model_wait %+v", ev.ModelWait)
					}
					waits++
				}
			}
		}
		if waits == 0 {
			t.Fatal("16 calls at 4 a second never waited")
		}
		t.Logf("%d calls, %d waited", calls, waits)
	})
	t.Run("unlimited", func(t *testing.T) {
		p := &limitedProvider{rpm: 8, tpm: 100000, window: window}
		limitsFleet(t, p, nil, 3, 4, 8)
		if rejected, calls, _ := p.stats(); rejected == 0 {
			t.Fatalf("no 429 without limits (%d calls): the test proves nothing", calls)
		}
	})
}

// Concurrency caps the calls in flight across the fleet.
func TestSharedConcurrency(t *testing.T) {
	t.Parallel()
	p := &limitedProvider{rpm: 1000, tpm: 1 << 30, window: time.Second}
	limitsFleet(t, p, &ratelimit.Limits{Concurrency: 2}, 3, 4, 8)
	if _, _, maxIn := p.stats(); maxIn > 2 {
		t.Fatalf("%d calls in flight at once, limit 2", maxIn)
	}
}
