package eventpub

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/testpar"
	"github.com/agentfleet/agentfleet/natsembed"
)

func TestMain(m *testing.M) {
	testpar.Default(4) // the tests wait more than they compute
	goleak.VerifyTestMain(m)
}

// testWorker is what a worker gives its publishers, on an embedded
// server: the tests reach into its acks and batch as the worker's own
// tests did.
type testWorker struct {
	c           *bus.Client
	names       bus.Names
	acks        *Acks
	batch       *Batch // nil: no batches
	env         *Env
	wire        *testWire // Env.Out and the batch's
	obs         Metrics
	log         *slog.Logger
	storedReads chanSlots  // the slots, which a test may take
	slots       *testSlots // Env.StoredReads: storedReads, seen by the test
	hardCtx     context.Context
	hardCancel  context.CancelFunc
}

// testConfig is what a test may set of a worker's publishing.
type testConfig struct {
	NoEventBatches    bool
	SkipEnsureStreams bool
	AckWait           time.Duration // the re-send budget; default 60s
	PublishAckTimeout time.Duration // default 15s
	Observer          Metrics
}

// nopMetrics counts nothing; tests embed it.
type nopMetrics struct{}

func (nopMetrics) EventPublished()           {}
func (nopMetrics) PublishFailed(error)       {}
func (nopMetrics) PublishWait(time.Duration) {}

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

// startInternal sets up a worker's publishing on an embedded server until
// the test ends; hooks are set before it starts.
func startInternal(t testing.TB, cfg testConfig, hooks func(w *testWorker)) (*testWorker, *bus.Client) {
	t.Helper()
	return startInternalOn(t, connectTestServer(t), cfg, hooks)
}

// startInternalOn is startInternal on a given connection, as the worker's
// Run sets it up. Once the test ends, every publisher must have been
// flushed or abandoned.
func startInternalOn(t testing.TB, c *bus.Client, cfg testConfig, hooks func(w *testWorker)) (*testWorker, *bus.Client) {
	t.Helper()
	if cfg.AckWait <= 0 {
		cfg.AckWait = 60 * time.Second
	}
	if cfg.PublishAckTimeout <= 0 {
		cfg.PublishAckTimeout = 15 * time.Second
	}
	w := &testWorker{c: c, names: c.Names(), wire: &testWire{nc: c.Conn()}, obs: cfg.Observer,
		log: slog.New(slog.DiscardHandler), storedReads: make(chanSlots, MaxStoredReads)}
	w.slots = &testSlots{Slots: w.storedReads}
	if w.obs == nil {
		w.obs = nopMetrics{}
	}
	w.hardCtx, w.hardCancel = context.WithCancel(context.Background())
	t.Cleanup(w.hardCancel)
	if hooks != nil {
		hooks(w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !cfg.SkipEnsureStreams {
		if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := c.JetStream().Stream(ctx, w.names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	if w.acks, err = StartAcks(c.Conn(), cfg.PublishAckTimeout); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.acks.Close()
		w.acks.mu.Lock()
		defer w.acks.mu.Unlock()
		if n := len(w.acks.pubs); n > 0 {
			t.Errorf("%d event publishers were neither flushed nor abandoned", n)
		}
	})
	if !cfg.NoEventBatches && BatchesAllowed(stream.CachedInfo().Config, w.names) {
		if w.batch, err = StartBatch(c.Conn(), w.wire, w.acks, w.names.EventBatches()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.batch.Close) // before the acks close, as in the worker
		w.batch.ProbeOrOff(ctx, w.log, ReprobeEvery)
	}
	w.env = &Env{Conn: c.Conn(), Out: w.wire, Names: w.names, Stream: stream, Acks: w.acks, Batch: w.batch,
		Window: 256, AckTimeout: cfg.PublishAckTimeout, Budget: cfg.AckWait, Worker: "w-test",
		StoredReads: w.slots, Stop: w.hardCtx, Log: w.log, Metrics: w.obs}
	return w, c
}

// testWire is the worker's connection as its publishers send on it: a
// test sees, stops or refuses what goes out. Set before or while events go.
type testWire struct {
	nc      *nats.Conn
	request atomic.Pointer[func(ctx context.Context, m *nats.Msg)] // before a re-send's request
	publish atomic.Pointer[func(m *nats.Msg) error]                // before a single or batched send; an error is the send's, nothing sent
}

func (w *testWire) PublishMsg(m *nats.Msg) error {
	if f := w.publish.Load(); f != nil {
		if err := (*f)(m); err != nil {
			return err
		}
	}
	return w.nc.PublishMsg(m)
}

func (w *testWire) RequestMsgWithContext(ctx context.Context, m *nats.Msg) (*nats.Msg, error) {
	if f := w.request.Load(); f != nil {
		(*f)(ctx, m)
	}
	return w.nc.RequestMsgWithContext(ctx, m)
}

// onResend calls f with the seq of each event a re-send sends, before it
// goes out.
func (w *testWire) onResend(f func(seq uint64)) {
	w.onResendWithin(func(_ context.Context, seq uint64) { f(seq) })
}

// onResendWithin is onResend with the context of the re-send's request.
func (w *testWire) onResendWithin(f func(ctx context.Context, seq uint64)) {
	g := func(ctx context.Context, m *nats.Msg) { f(ctx, envelopeSeq(m)) }
	w.request.Store(&g)
}

// onPublish calls f before each event sent singly or in a batch (not
// re-sent); an error from f is the send's, and nothing goes out.
func (w *testWire) onPublish(f func(m *nats.Msg) error) { w.publish.Store(&f) }

// errWire is a send a test failed on the wire.
var errWire = errors.New("send failed on the wire (a test's)")

// envelopeSeq is the seq of the event m carries (0 if it carries none).
func envelopeSeq(m *nats.Msg) uint64 {
	e, err := bus.DecodeEnvelope(m.Data)
	if err != nil {
		return 0
	}
	return e.Seq
}

// batched tells whether m goes in a batch (its reply ends the batch's way).
func batched(m *nats.Msg) bool { return strings.HasSuffix(m.Reply, ".$FI") }

// testSlots are the stored reads' slots; acquire, when set, is called as a
// re-send asks for one, before it waits.
type testSlots struct {
	Slots
	acquire func()
}

func (s *testSlots) Acquire(ctx context.Context) error {
	if s.acquire != nil {
		s.acquire()
	}
	return s.Slots.Acquire(ctx)
}

// newPublisher starts a publisher of the run's attempt.
func newPublisher(w *testWorker, run string, attempt int, onFail func(error)) *Publisher {
	return New(w.env, Attempt{Run: run, Attempt: attempt}, onFail)
}

// within receives from ch, or fails the test after d.
func within[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %s", what, d)
		var zero T
		return zero
	}
}

// until polls ok until it holds, for at most 20 s.
func until(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20 s for %s", what)
		}
	}
}
