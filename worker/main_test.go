package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
	"github.com/agentfleet/agentfleet/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fleet is an embedded server and a client for one test.
type fleet struct {
	t   *testing.T
	srv *natsembed.Server
	c   *bus.Client
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir(), MaxMemory: 64 << 20, MaxStore: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
	if err != nil {
		srv.Shutdown()
		t.Fatal(err)
	}
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{Queues: []string{"default", "other"}, AckWait: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, srv: srv, c: c}
	t.Cleanup(func() {
		c.Close()
		srv.Shutdown()
	})
	return f
}

// startWorker runs a worker until the test ends (or stop is called).
func (f *fleet) startWorker(cfg worker.Config) (stop func()) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: f.srv.URL()})
	if err != nil {
		f.t.Fatal(err)
	}
	cfg.Client = c
	if len(cfg.Queues) == 0 {
		cfg.Queues = []string{"default", "other"}
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = 5 * time.Second
	}
	if cfg.PollWait == 0 {
		cfg.PollWait = 200 * time.Millisecond
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 5 * time.Second
	}
	w, err := worker.New(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			rcancel()
			if err := <-done; err != nil {
				f.t.Errorf("worker.Run: %v", err)
			}
			c.Close()
		})
	}
	f.t.Cleanup(stop)
	return stop
}

// runWorker runs w until the test ends (then stops it and checks Run's
// error), and returns once it is ready.
func runWorker(t *testing.T, w *worker.Worker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	<-w.Ready()
}

func (f *fleet) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	f.t.Cleanup(cancel)
	return ctx
}

// submit stores a request and returns its id.
func (f *fleet) submit(queue string, req *bus.RunRequest) string {
	f.t.Helper()
	res, err := f.c.Submit(f.ctx(), queue, req)
	if err != nil {
		f.t.Fatal(err)
	}
	return res.ID
}

// follow collects a run's envelopes up to run_finished.
func (f *fleet) follow(id string) []*bus.Envelope {
	f.t.Helper()
	var out []*bus.Envelope
	for env, err := range f.c.Follow(f.ctx(), id) {
		if err != nil {
			f.t.Fatalf("follow %s: %v (after %d envelopes)", id, err, len(out))
		}
		out = append(out, env)
	}
	return out
}

func fauxText(texts ...string) *bus.FauxScript {
	s := &bus.FauxScript{}
	for _, t := range texts {
		s.Responses = append(s.Responses, agent.ScriptedResponse{Content: []agent.Content{agent.Text(t)}})
	}
	return s
}

func fauxModel() *bus.ModelRef { return &bus.ModelRef{Provider: "faux", ID: "scripted"} }

func types(envs []*bus.Envelope) []string {
	var out []string
	for _, e := range envs {
		out = append(out, e.Type)
	}
	return out
}

func decode(t *testing.T, e *bus.Envelope) *bus.Event {
	t.Helper()
	ev, err := e.Decode()
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func dump(envs []*bus.Envelope) string {
	s := ""
	for _, e := range envs {
		b, _ := json.Marshal(e)
		s += fmt.Sprintf("%s\n", b)
	}
	return s
}

func TestSmoke(t *testing.T) {
	f := newFleet(t)
	f.startWorker(worker.Config{})
	id := f.submit("", &bus.RunRequest{Prompt: "hi", Model: fauxModel(), Faux: fauxText("hello there")})
	envs := f.follow(id)
	t.Log(dump(envs))
}
