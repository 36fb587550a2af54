// Package fleettest is the test harness of agentfleet: a fleet on an
// embedded nats-server, workers started in process, and helpers to submit
// runs, follow them and check their envelopes. Everything it starts ends
// with the test (t.Cleanup), so goleak stays quiet.
package fleettest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/freeport"
	"github.com/agentfleet/agentfleet/natsembed"
	"github.com/agentfleet/agentfleet/protocol"
	"github.com/agentfleet/agentfleet/worker"
)

// Options shape a fleet. The zero value is a fresh server on a free port
// with the streams of queue "default".
type Options struct {
	// Port of the server; 0 picks a free one below the ephemeral range,
	// so that Restart can bind it again.
	Port int
	// StoreDir is the JetStream directory; "" is a fresh temporary one.
	StoreDir string
	// Streams are ensured before Start returns (unless NoStreams).
	Streams   bus.StreamsConfig
	NoStreams bool
}

// Fleet is an embedded server and a client connected to it.
type Fleet struct {
	T      testing.TB
	Server *natsembed.Server
	Client *bus.Client
	// StoreDir is the server's JetStream directory (to restart it).
	StoreDir string
	streams  bus.StreamsConfig
	// schema validates what Follow returns against protocol/, strictly.
	schema *protocol.Validator
}

// Start starts a server, connects a client and ensures the streams.
func Start(t testing.TB, o Options) *Fleet {
	t.Helper()
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	var srv *natsembed.Server
	if o.Port == 0 {
		srv = startServerPicked(t, freeport.Pick, o.StoreDir)
	} else {
		srv = StartServer(t, o.Port, o.StoreDir)
	}
	schema, err := protocol.NewValidator(protocol.Strict())
	if err != nil {
		t.Fatal(err)
	}
	f := &Fleet{T: t, Server: srv, StoreDir: o.StoreDir, streams: o.Streams, schema: schema}
	f.Client = Connect(t, srv.URL())
	if !o.NoStreams {
		if err := f.Client.EnsureStreams(Context(t), o.Streams); err != nil {
			t.Fatalf("EnsureStreams: %v", err)
		}
	}
	return f
}

// StartServer starts an embedded server (port 0: a free one) that shuts
// down with the test.
func StartServer(t testing.TB, port int, storeDir string) *natsembed.Server {
	t.Helper()
	srv, err := NewServer(port, storeDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// startServerPicked is StartServer on a port from pick (freeport.Pick:
// below the ephemeral range, so that Restart can bind it again); a port
// another test bound since its pick is picked again.
func startServerPicked(t testing.TB, pick func(testing.TB) int, storeDir string) *natsembed.Server {
	t.Helper()
	for tries := 1; ; tries++ {
		srv, err := NewServer(pick(t), storeDir)
		if err == nil {
			t.Cleanup(srv.Shutdown)
			return srv
		}
		if !errors.Is(err, natsembed.ErrPortBusy) || tries == 3 {
			t.Fatal(err)
		}
	}
}

// NewServer starts an embedded server sized for tests (port 0: a free
// one), for a TestMain that has no testing.TB; the caller shuts it down.
func NewServer(port int, storeDir string) (*natsembed.Server, error) {
	if port == 0 {
		port = -1
	}
	return natsembed.Start(natsembed.Options{Port: port, StoreDir: storeDir, MaxMemory: 64 << 20, MaxStore: 1 << 30})
}

// Connect connects a client that closes with the test.
func Connect(t testing.TB, url string) *bus.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Context is a context that ends with the test, bounded to 3 minutes so
// that a hung operation fails the test instead of the whole package. The
// bound only guards against a hang: tests use one Context for all their
// operations, and a test storing thousands of messages on a loaded
// machine under -race (two CPU burners beside, load 25) spent over 30 s
// on them and failed with "context deadline exceeded".
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// URL is the server's client URL.
func (f *Fleet) URL() string { return f.Server.URL() }

// Port is the server's client port.
func (f *Fleet) Port() int { return f.Server.NATS().Addr().(*net.TCPAddr).Port }

// Restart stops the server and starts it again on the same port and store,
// as a restarted NATS node; clients reconnect on their own, and Restart
// returns once the fleet's own client has.
func (f *Fleet) Restart() {
	f.T.Helper()
	port := f.Port()
	nc := f.Client.Conn()
	before := nc.Stats().Reconnects
	f.Server.Shutdown()
	f.Server = StartServer(f.T, port, f.StoreDir)
	// A request the client sent before it saw the old server go could be
	// written into the dead connection and wait out its whole timeout (a
	// loaded CI did).
	deadline := time.Now().Add(30 * time.Second)
	for nc.Stats().Reconnects == before || !nc.IsConnected() {
		if time.Now().After(deadline) {
			f.T.Fatalf("the fleet's client did not reconnect within 30 s of the restart (%s)", nc.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Worker is a worker running in process until Stop, Kill or the end of
// the test.
type Worker struct {
	*worker.Worker
	Stop func()
	// Kill stops it as if its process died: its NATS connection closes
	// first, so nothing it does afterwards reaches NATS; Run's error is
	// not checked.
	Kill func()
}

// StartWorker runs a worker with cfg on its own connection to the fleet
// until the test ends (see RunWorker); it takes the fleet's queues unless
// cfg names some.
func (f *Fleet) StartWorker(cfg worker.Config) *Worker {
	f.T.Helper()
	cfg.Client = Connect(f.T, f.URL())
	if len(cfg.Queues) == 0 {
		cfg.Queues = f.streams.Queues
	}
	return RunWorker(f.T, cfg)
}

// RunWorker runs a worker with cfg (Client required) until Stop or the end
// of the test, and returns once it is ready. Test defaults: AckWait 5 s,
// PollWait 200 ms, DrainTimeout 5 s. Stop waits for Run (at most 30 s) and
// checks its error.
func RunWorker(t testing.TB, cfg worker.Config) *Worker {
	t.Helper()
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
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	end := func(kill bool) {
		once.Do(func() {
			if kill {
				cfg.Client.Close()
			}
			cancel()
			select {
			case err := <-done:
				if err != nil && !kill {
					t.Errorf("worker.Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("worker did not stop within 30s")
			}
		})
	}
	stop := func() { end(false) }
	t.Cleanup(stop)
	select {
	case <-w.Ready():
	case err := <-done:
		once.Do(func() {})
		t.Fatalf("worker stopped before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("worker not ready after 30s")
	}
	return &Worker{Worker: w, Stop: stop, Kill: func() { end(true) }}
}

// Submit stores a request on a queue ("" is the default) and returns its id.
func (f *Fleet) Submit(queue string, req *bus.RunRequest) string {
	f.T.Helper()
	if queue == "" {
		queue = bus.DefaultQueue
	}
	res, err := f.Client.Submit(Context(f.T), queue, req)
	if err != nil {
		f.T.Fatal(err)
	}
	return res.ID
}

// FollowTimeout bounds Follow (and WaitFinished): a guard against a run
// that never ends, not a measure of speed.
const FollowTimeout = 3 * time.Minute

// Follow collects a run's envelopes up to its run_finished. Each must
// fit the protocol's schema (protocol/event.schema.json), strictly: no
// field it does not name.
func (f *Fleet) Follow(id string) []*bus.Envelope {
	f.T.Helper()
	var out []*bus.Envelope
	// Waiting for a run's end only guards against a hang: on a loaded
	// machine a run queued behind many others (a test's burst of runs)
	// ends well after Context's 30 s.
	ctx, cancel := context.WithTimeout(context.Background(), FollowTimeout)
	defer cancel()
	for env, err := range f.Client.Follow(ctx, id) {
		if err != nil {
			// What came, and where the run's record stands, say why.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			rec, rerr := f.Client.Status(ctx, id)
			cancel()
			f.T.Fatalf("follow %s: %v (after %d envelopes)\nrecord: %+v %v\n%s", id, err, len(out), rec, rerr, Dump(out))
		}
		out = append(out, env)
	}
	for i, env := range out {
		if err := f.schema.Validate(protocol.Envelope, env.AppendJSON(nil)); err != nil {
			f.T.Fatalf("follow %s: envelope %d does not fit protocol/event.schema.json (a wire change goes with `go generate ./protocol`, see protocol/README.md): %v\n%s",
				id, i+1, err, Dump(out[i:i+1]))
		}
	}
	return out
}

// WaitFinished follows a run to its end and returns its run_finished.
func (f *Fleet) WaitFinished(id string) *bus.RunFinished {
	f.T.Helper()
	envs := f.Follow(id)
	if len(envs) == 0 {
		f.T.Fatalf("run %s: no events", id)
	}
	ev := Decode(f.T, envs[len(envs)-1])
	if ev.RunFinished == nil {
		f.T.Fatalf("run %s ended with %s", id, ev.Type)
	}
	return ev.RunFinished
}

// Transcript loads a run's transcript.
func (f *Fleet) Transcript(id string) *bus.Transcript {
	f.T.Helper()
	tr, err := f.Client.LoadTranscript(Context(f.T), id)
	if err != nil {
		f.T.Fatal(err)
	}
	return tr
}

// FauxModel names the scripted model of a request's faux script.
func FauxModel() *bus.ModelRef { return &bus.ModelRef{Provider: "faux", ID: "scripted"} }

// FauxRun is a request that the faux model answers with responses.
func FauxRun(prompt string, responses ...agent.ScriptedResponse) *bus.RunRequest {
	return &bus.RunRequest{Prompt: prompt, Model: FauxModel(), Faux: &bus.FauxScript{Responses: responses}}
}

// Texts is a faux script of text replies.
func Texts(texts ...string) *bus.FauxScript {
	s := &bus.FauxScript{}
	for _, t := range texts {
		s.Responses = append(s.Responses, Text(t))
	}
	return s
}

// Text is a scripted reply with this text.
func Text(s string) agent.ScriptedResponse {
	return agent.ScriptedResponse{Content: []agent.Content{agent.Text(s)}}
}

// ToolCall is a scripted reply that calls one tool with args.
func ToolCall(id, tool string, args map[string]any) agent.ScriptedResponse {
	return agent.ScriptedResponse{Content: []agent.Content{agent.ToolCall(id, tool, args)}, StopReason: agent.StopReasonToolUse}
}

// Decode decodes an envelope's event or fails the test.
func Decode(t testing.TB, e *bus.Envelope) *bus.Event {
	t.Helper()
	ev, err := e.Decode()
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// Types lists the event types of envelopes.
func Types(envs []*bus.Envelope) []string {
	out := make([]string, len(envs))
	for i, e := range envs {
		out[i] = e.Type
	}
	return out
}

// Dump is the envelopes as JSON lines, for failure messages.
func Dump(envs []*bus.Envelope) string {
	var b strings.Builder
	for _, e := range envs {
		j, _ := json.Marshal(e)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// CheckEnvelopes checks what every run's envelopes must satisfy: one run
// id, each attempt starts with run_started at seq 1 and counts up without
// gaps, and exactly one run_finished, last.
func CheckEnvelopes(t testing.TB, envs []*bus.Envelope) {
	t.Helper()
	if err := checkEnvelopes(envs); err != nil {
		t.Fatalf("%v\n%s", err, Dump(envs))
	}
}

func checkEnvelopes(envs []*bus.Envelope) error {
	if len(envs) == 0 {
		return fmt.Errorf("no envelopes")
	}
	attempt, seq, finished := 0, uint64(0), 0
	for i, e := range envs {
		if e.Run != envs[0].Run {
			return fmt.Errorf("envelope %d is of run %s, not %s", i, e.Run, envs[0].Run)
		}
		if e.Attempt != attempt {
			if e.Attempt < attempt || e.Seq != 1 || e.Type != bus.EventRunStarted {
				return fmt.Errorf("envelope %d: attempt %d seq %d %s does not start an attempt", i, e.Attempt, e.Seq, e.Type)
			}
			attempt, seq = e.Attempt, 0
		}
		if e.Seq != seq+1 {
			return fmt.Errorf("envelope %d: seq %d after %d", i, e.Seq, seq)
		}
		seq = e.Seq
		if e.Type == bus.EventRunFinished {
			finished++
		}
	}
	if finished != 1 || envs[len(envs)-1].Type != bus.EventRunFinished {
		return fmt.Errorf("%d run_finished, the last event is %s", finished, envs[len(envs)-1].Type)
	}
	return nil
}

// ServeScheduleOps answers the schedule operations of queues as a worker
// does (bus.Client.ApplyScheduleOp), for tests that run no worker; it
// stops at the test's end.
func (f *Fleet) ServeScheduleOps(queues ...string) {
	f.T.Helper()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		stopping bool
	)
	n := f.Client.Names()
	for _, q := range queues {
		sub, err := f.Client.Conn().QueueSubscribe(n.ScheduleOps(q), bus.ScheduleOpsGroup, func(m *nats.Msg) {
			mu.Lock()
			defer mu.Unlock()
			if stopping {
				return
			}
			wg.Add(1)
			go func() { // it reads and writes NATS: not in the callback
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				queue, name, op, _ := n.ParseScheduleOp(m.Subject)
				b, _ := json.Marshal(f.Client.ApplyScheduleOp(ctx, queue, name, op, m.Data))
				_ = m.Respond(b)
			}()
		})
		if err != nil {
			f.T.Fatal(err)
		}
		f.T.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	f.T.Cleanup(func() {
		mu.Lock()
		stopping = true
		mu.Unlock()
		wg.Wait()
	})
	if err := f.Client.Conn().Flush(); err != nil {
		f.T.Fatal(err)
	}
}
