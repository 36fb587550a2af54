//go:build fault && linux

package faultsuite

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/freeport"
)

// TestNoSecretsInLogsEventsRecords runs two worker processes that hold a
// NATS password and an OpenAI API key (one from the environment, one from
// the URL and a key file), at debug level, through successful, failing
// and bad runs, and checks that neither secret appears in their logs
// (start, runs, errors, shutdown), --help, /metrics, any event or any
// record, while both secrets were in use (the fake model endpoint saw the
// key; the workers are connected with the password).
func TestNoSecretsInLogsEventsRecords(t *testing.T) {
	const (
		password = "nats-pw-Zq8vLr2Xw9SECRET"
		apiKey   = "sk-test-Hn4Jk7Pq1ApiKeySECRET"
	)
	secrets := []string{password, apiKey}
	dir := workDir(t)

	var authorized, unauthorized atomic.Int64
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+apiKey {
			unauthorized.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}`)
			return
		}
		authorized.Add(1)
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), "please fail") {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"the fake model refuses","type":"invalid_request_error"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range []string{
			`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello "}}]}`,
			`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"from the fake model."},"finish_reason":"stop"}]}`,
			`{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`,
			`[DONE]`,
		} {
			_, _ = io.WriteString(w, "data: "+c+"\n\n")
		}
	}))
	t.Cleanup(model.Close)

	nc := startNATS(t, dir, 1, fmt.Sprintf("authorization {\n  users: [ {user: fleet, password: %q} ]\n}\n", password), "fleet", password)
	c := nc.client()
	t.Cleanup(c.Close)

	keyFile := filepath.Join(dir, "openai.key")
	if err := os.WriteFile(keyFile, []byte(apiKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"--queue", "default", "--ack-wait", "4s", "--drain-timeout", "2s", "--log-level", "debug",
		"--openai-base-url", model.URL + "/v1", "--default-model", "openai/fake-model"}
	ports := freeport.PickN(t, 2)
	metricsA := fmt.Sprintf("127.0.0.1:%d", ports[0])
	metricsB := fmt.Sprintf("127.0.0.1:%d", ports[1])
	// Worker A: secrets from the environment.
	a := startProc(t, dir, "worker-secret-a", bins.worker, append([]string{"--nats", nc.URL(), "--worker-id", "sa",
		"--log-format", "text", "--metrics-addr", metricsA}, common...),
		cleanEnv("NATS_USER=fleet", "NATS_PASSWORD="+password, "OPENAI_API_KEY="+apiKey))
	// Worker B: the password in the URL, the key in a file.
	urlWithPassword := strings.Replace(nc.URL(), "nats://", "nats://fleet:"+password+"@", 1)
	b := startProc(t, dir, "worker-secret-b", bins.worker, append([]string{"--nats", urlWithPassword, "--worker-id", "sb",
		"--log-format", "json", "--metrics-addr", metricsB, "--openai-api-key-file", keyFile}, common...), cleanEnv())
	for _, p := range []*proc{a, b} {
		if _, err := p.waitLine(`worker started`, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var ids []string
	submit := func(req *bus.RunRequest) {
		res, err := c.Submit(ctx, "", req)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	for i := range 4 {
		submit(&bus.RunRequest{Prompt: fmt.Sprintf("hello %d", i), Metadata: map[string]string{"team": "docs"}})
	}
	submit(&bus.RunRequest{Prompt: "please fail"})
	submit(&bus.RunRequest{Prompt: "unknown tool", Tools: []string{"no_such_tool"}})
	submit(&bus.RunRequest{Prompt: "unknown provider", Model: &bus.ModelRef{Provider: "nope", ID: "x"}})
	if _, err := c.SubmitRaw(ctx, "", "secret-raw-bad", []byte(`{"prompt": 42}`)); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, "secret-raw-bad")
	statuses := map[string]int{}
	for _, id := range ids {
		tr, err := c.LoadTranscript(ctx, id)
		if err != nil || !tr.Done() {
			t.Fatalf("run %s: %v", id, err)
		}
		statuses[tr.Finished.Status+"/"+tr.Finished.Reason]++
	}
	t.Logf("runs: %v; model endpoint: %d calls with the key, %d without", statuses, authorized.Load(), unauthorized.Load())
	if authorized.Load() < 5 || unauthorized.Load() != 0 {
		t.Errorf("the API key was not in use as expected: %d authorized, %d unauthorized calls", authorized.Load(), unauthorized.Load())
	}
	if statuses["succeeded/"] != 4 {
		t.Errorf("want 4 succeeded runs, got %v", statuses)
	}

	// /metrics, if this build serves it.
	var scraped []string
	for _, addr := range []string{metricsA, metricsB} {
		hc := &http.Client{Timeout: 5 * time.Second}
		resp, err := hc.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Logf("no /metrics on %s: %v", addr, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		scraped = append(scraped, string(body))
	}

	// Stop both (shutdown logs count too).
	for _, p := range []*proc{a, b} {
		p.signal(syscall.SIGTERM)
		if code, err := p.waitExit(30 * time.Second); err != nil || code != 0 {
			t.Errorf("%s: exit %d, %v", p.name, code, err)
		}
	}
	help, _ := runCmd(t, cleanEnv("NATS_PASSWORD="+password, "OPENAI_API_KEY="+apiKey, "NATS_TOKEN="+password), bins.worker, "--help")

	where := map[string]string{"worker A log": strings.Join(a.output(), "\n"), "worker B log": strings.Join(b.output(), "\n"),
		"worker --help": help}
	for i, s := range scraped {
		where[fmt.Sprintf("/metrics of worker %c", 'A'+i)] = s
	}
	events, n := allEvents(t, c)
	where["events"] = events
	records := allRecords(t, c)
	where["records"] = records
	for what, text := range where {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				i := strings.Index(text, s)
				t.Errorf("FAIL: %s contains a secret: …%s…", what, text[max(0, i-120):min(len(text), i+len(s)+40)])
			}
		}
	}
	t.Logf("CHECKED for the NATS password and the API key: %d log lines of 2 workers, --help, %d /metrics pages, %d events of %d runs, %d bytes of records",
		len(a.output())+len(b.output()), len(scraped), n, len(ids), len(records))
}

func runCmd(t *testing.T, env []string, bin string, args ...string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	p := startProc(t, dir, "cmd", bin, args, env)
	if _, err := p.waitExit(30 * time.Second); err != nil {
		return "", err
	}
	return strings.Join(p.output(), "\n"), nil
}

// allEvents reads the whole events stream.
func allEvents(t *testing.T, c *bus.Client) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := c.JetStream().OrderedConsumer(ctx, c.Names().EventsStream(), jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	n := 0
	for {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		last, got := false, 0
		for m := range batch.Messages() {
			got++
			n++
			b.Write(m.Data())
			b.WriteByte('\n')
			if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
				last = true
			}
		}
		if last || got == 0 {
			return b.String(), n
		}
	}
}

// allRecords reads every run record.
func allRecords(t *testing.T, c *bus.Client) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(e.Value())
		b.WriteByte('\n')
	}
	return b.String()
}
