package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
)

// The package's own tests reach into the worker (hooks, its runs), so
// they cannot use internal/fleettest, which imports this package; this
// file is their one copy of the server and worker setup.

// connectTestServer starts an embedded server and connects a client; both
// end with the test.
func connectTestServer(t testing.TB) *bus.Client {
	t.Helper()
	c, _ := startTestServer(t)
	return c
}

// startTestServer starts an embedded server for the test, which it may
// shut down, and connects to it.
func startTestServer(t testing.TB) (*bus.Client, *natsembed.Server) {
	t.Helper()
	return startTestServerWith(t, natsembed.Options{})
}

// startTestServerWith is startTestServer with o's settings (port, store
// and bounds are the test's).
func startTestServerWith(t testing.TB, o natsembed.Options) (*bus.Client, *natsembed.Server) {
	t.Helper()
	o.Port, o.StoreDir, o.MaxMemory, o.MaxStore = -1, t.TempDir(), 64<<20, 1<<30
	srv, err := natsembed.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, srv
}

// startInternal runs a worker on an embedded server until the test ends;
// hooks are set before it starts.
func startInternal(t testing.TB, cfg Config, hooks func(w *Worker)) (*Worker, *bus.Client) {
	t.Helper()
	return startInternalOn(t, connectTestServer(t), cfg, hooks)
}

// startInternalOn is startInternal on a given connection. Once the worker
// has stopped, every publisher must have been flushed or abandoned.
func startInternalOn(t testing.TB, c *bus.Client, cfg Config, hooks func(w *Worker)) (*Worker, *bus.Client) {
	t.Helper()
	cfg.Client = c
	if cfg.PollWait == 0 {
		cfg.PollWait = 200 * time.Millisecond
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if hooks != nil {
		hooks(w)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() {
		wcancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if w.events == nil {
			return
		}
		if n := w.events.Acks.Registered(); n > 0 {
			t.Errorf("%d event publishers were neither flushed nor abandoned", n)
		}
	})
	select {
	case <-w.Ready():
	case err := <-done:
		t.Fatalf("worker stopped before it was ready: %v", err)
	}
	return w, c
}

// routeAcks routes the worker's event acks through pass: what it returns
// (nil: nothing) is applied.
func routeAcks(t *testing.T, w *Worker, pass func(*nats.Msg) *nats.Msg) {
	t.Helper()
	if err := w.events.Acks.RouteAcks(pass); err != nil {
		t.Fatal(err)
	}
}

// publishFailures counts the failed publishes an Observer is told of.
type publishFailures struct {
	NopObserver
	n atomic.Int64
}

func (o *publishFailures) PublishFailed(error) { o.n.Add(1) }
