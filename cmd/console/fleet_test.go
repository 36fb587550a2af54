package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/testpar"
	"github.com/agentfleet/agentfleet/natsembed"
	"github.com/agentfleet/agentfleet/worker"
)

func TestMain(m *testing.M) {
	// The tests wait (on the browser, the fleet) more than they compute.
	testpar.Default(4)
	goleak.VerifyTestMain(m)
}

// testFleet is the shared harness's fleet (an embedded NATS server and a
// client) with one in-process worker with the faux model, for one test.
type testFleet struct {
	*fleettest.Fleet
	t   testing.TB
	srv *natsembed.Server
	c   *bus.Client
}

func newTestFleet(t testing.TB) *testFleet {
	return newTestFleetN(t, 64)
}

// newTestFleetN is newTestFleet with a worker of that many slots.
func newTestFleetN(t testing.TB, slots int) *testFleet {
	t.Helper()
	fl := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default", "other"}, AckWait: 5 * time.Second}})
	fl.StartWorker(worker.Config{Concurrency: slots, DrainTimeout: 2 * time.Second, WorkerID: "test-worker-1"})
	return &testFleet{Fleet: fl, t: t, srv: fl.Server, c: fl.Client}
}

// submit stores a request on the default queue.
func (f *testFleet) submit(req *bus.RunRequest) string {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := f.c.Submit(ctx, "", req)
	if err != nil {
		f.t.Fatal(err)
	}
	return res.ID
}

// slowText is a faux run that streams each text at about 200 characters a
// second, one response per turn.
func slowText(id string, texts ...string) *bus.RunRequest {
	s := &bus.FauxScript{TokenSize: 1, TokensPerSecond: 50}
	for _, t := range texts {
		s.Responses = append(s.Responses, agent.ScriptedResponse{Content: []agent.Content{agent.Text(t)}})
	}
	return &bus.RunRequest{ID: id, Prompt: "go", Faux: s}
}

// console is a console served by httptest on a fleet.
type console struct {
	*httptest.Server
	s *server
}

func newConsole(t testing.TB, f *testFleet, cfg serverConfig) *console {
	t.Helper()
	return newConsoleWith(t, f, cfg, nil)
}

// newConsoleWith serves the console's handler through wrap (nil: as it is).
func newConsoleWith(t testing.TB, f *testFleet, cfg serverConfig, wrap func(http.Handler) http.Handler) *console {
	t.Helper()
	return startConsole(t, f, cfg, wrap, false)
}

// startConsole is newConsoleWith, over TLS when tls is set.
func startConsole(t testing.TB, f *testFleet, cfg serverConfig, wrap func(http.Handler) http.Handler, tls bool) *console {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: f.srv.URL(), Name: "test-console"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Client = c
	s, err := newServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.background(wctx) })
	var h http.Handler = s
	if wrap != nil {
		h = wrap(s)
	}
	hs := httptest.NewUnstartedServer(h)
	sctx, stopStreams := context.WithCancel(context.Background())
	hs.Config.BaseContext = func(net.Listener) context.Context { return sctx }
	if tls {
		hs.StartTLS()
	} else {
		hs.Start()
	}
	t.Cleanup(func() {
		stopStreams()
		hs.CloseClientConnections()
		hs.Close()
		stop()
		wg.Wait()
		c.Close()
	})
	// Wait until the records are watched, so the test's runs are seen.
	deadline := time.After(10 * time.Second)
	for {
		_, changed := s.records.watchVersion()
		if s.records.isReady() {
			break
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatal("the console never read the run records")
		}
	}
	return &console{Server: hs, s: s}
}

// get does a GET and decodes a JSON answer.
func (c *console) getJSON(t *testing.T, path string, v any) int {
	t.Helper()
	resp, err := c.Client().Get(c.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if v != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v\n%s", path, err, b)
		}
	}
	return resp.StatusCode
}

// csrfToken reads the page's token.
func (c *console) csrfToken(t *testing.T) string {
	t.Helper()
	var s struct {
		CSRF string `json:"csrf"`
	}
	if code := c.getJSON(t, "/api/session", &s); code != http.StatusOK {
		t.Fatalf("session: %d", code)
	}
	return s.CSRF
}

// post sends a control request; token "" sends none.
func (c *console) post(t *testing.T, path, token, body string) (int, string) {
	t.Helper()
	return c.postWith(t, path, token, body, nil)
}

// postWith is post with more headers.
func (c *console) postWith(t *testing.T, path, token, body string, h http.Header) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.URL+path, strings.NewReader(body))
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("X-CSRF-Token", token)
	}
	resp, err := c.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitRun long-polls /api/runs until the run's record satisfies ok.
func (c *console) waitRun(t *testing.T, id string, ok func(bus.RunRecord) bool) bus.RunRecord {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var version *uint64
	for time.Now().Before(deadline) {
		path := "/api/runs?q=" + id
		if version != nil {
			path += "&after=" + jsonNum(*version)
		}
		var page struct {
			Version uint64          `json:"version"`
			Runs    []bus.RunRecord `json:"runs"`
		}
		if code := c.getJSON(t, path, &page); code != http.StatusOK {
			t.Fatalf("%s: %d", path, code)
		}
		for _, r := range page.Runs {
			if r.ID == id && ok(r) {
				return r
			}
		}
		version = &page.Version
	}
	t.Fatalf("run %s never reached the state the test waits for", id)
	return bus.RunRecord{}
}

func jsonNum(n uint64) string { b, _ := json.Marshal(n); return string(b) }

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct {
	Event, ID, Data string
}

// sseStream reads events from a response body.
type sseStream struct {
	resp     *http.Response
	r        *bufio.Reader
	comments int
}

func (c *console) openEvents(t *testing.T, id, lastEventID string) *sseStream {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.URL+"/api/runs/"+id+"/events", nil)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := c.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("events: %d %s\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	s := &sseStream{resp: resp, r: bufio.NewReader(resp.Body)}
	t.Cleanup(s.close)
	return s
}

func (s *sseStream) close() { s.resp.Body.Close() }

// next returns the next event; io.EOF when the stream ended.
func (s *sseStream) next() (sseEvent, error) {
	var ev sseEvent
	var data []string
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "":
			if ev.Event == "" && data == nil {
				continue
			}
			ev.Data = strings.Join(data, "\n")
			return ev, nil
		case strings.HasPrefix(line, ":"):
			s.comments++
		case strings.HasPrefix(line, "event: "):
			ev.Event = line[len("event: "):]
		case strings.HasPrefix(line, "id: "):
			ev.ID = line[len("id: "):]
		case strings.HasPrefix(line, "data: "):
			data = append(data, line[len("data: "):])
		}
	}
}
