package fleettest

import (
	"encoding/json"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/freeport"
	"github.com/agentfleet/agentfleet/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFauxRunOnAnInProcessWorker(t *testing.T) {
	f := Start(t, Options{})
	f.StartWorker(worker.Config{})
	id := f.Submit("", FauxRun("what is 6*7?", ToolCall("c1", "calculator", map[string]any{"expression": "6*7"}), Text("42")))
	envs := f.Follow(id)
	CheckEnvelopes(t, envs)
	started := Decode(t, envs[0]).RunStarted
	if started.Protocol != bus.ProtocolVersion {
		t.Errorf("run_started protocol %q, want %q", started.Protocol, bus.ProtocolVersion)
	}
	if fin := Decode(t, envs[len(envs)-1]).RunFinished; fin.Status != bus.StatusSucceeded {
		t.Fatalf("%+v\n%s", fin, Dump(envs))
	}
	if tr := f.Transcript(id); tr.FinalText() != "42" || len(tr.Messages) != 4 {
		t.Fatalf("transcript %q, %d messages", tr.FinalText(), len(tr.Messages))
	}
}

func TestCheckEnvelopes(t *testing.T) {
	env := func(attempt int, seq uint64, typ string) *bus.Envelope {
		b, _ := json.Marshal(map[string]string{"type": typ})
		return &bus.Envelope{Run: "r", Attempt: attempt, Seq: seq, Type: typ, Event: b}
	}
	good := []*bus.Envelope{env(1, 1, "run_started"), env(1, 2, "agent_start"),
		env(2, 1, "run_started"), env(2, 2, "run_finished")}
	if err := checkEnvelopes(good); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		envs []*bus.Envelope
		want string
	}{
		"gap":          {[]*bus.Envelope{env(1, 1, "run_started"), env(1, 3, "run_finished")}, "seq 3 after 1"},
		"no start":     {[]*bus.Envelope{env(1, 1, "run_started"), env(2, 2, "run_finished")}, "does not start"},
		"two finishes": {[]*bus.Envelope{env(1, 1, "run_started"), env(1, 2, "run_finished"), env(1, 3, "run_finished")}, "2 run_finished"},
		"unfinished":   {[]*bus.Envelope{env(1, 1, "run_started")}, "0 run_finished"},
		"empty":        {nil, "no envelopes"},
	} {
		if err := checkEnvelopes(c.envs); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

// After a restart the stored runs are there and the client reconnects.
func TestRestartKeepsTheStore(t *testing.T) {
	f := Start(t, Options{})
	id := f.Submit("", FauxRun("hi", Text("hello")))
	port := f.Port()
	f.Restart()
	if f.Port() != port {
		t.Fatalf("port %d after restart, was %d", f.Port(), port)
	}
	f.StartWorker(worker.Config{})
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("%+v", fin)
	}
}

func TestFleetPortIsBelowTheEphemeralRange(t *testing.T) {
	// Restart binds the port again: one from the ephemeral range could be
	// taken by a connection while the server is down.
	low := freeport.EphemeralLow()
	if low <= freeport.Lowest {
		t.Skip("the ephemeral range starts too low to stay below it")
	}
	f := Start(t, Options{NoStreams: true})
	if port := f.Port(); port >= low {
		t.Fatalf("port %d, in the ephemeral range from %d", port, low)
	}
}

func TestAPickedPortTakenBeforeTheBindIsPickedAgain(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	busy := held.Addr().(*net.TCPAddr).Port
	var picks []int
	pick := func(t testing.TB) int {
		port := busy // the first pick was taken before the bind
		if len(picks) > 0 {
			port = freeport.Pick(t)
		}
		picks = append(picks, port)
		return port
	}
	srv := startServerPicked(t, pick, t.TempDir())
	if port := srv.NATS().Addr().(*net.TCPAddr).Port; len(picks) != 2 || port != picks[1] {
		t.Fatalf("picks %v, server on %d", picks, port)
	}
}

// Follow fails a test whose run stored an event the protocol's schema
// does not allow, and takes the same run with the event fixed.
func TestFollowChecksTheSchema(t *testing.T) {
	f := Start(t, Options{})
	started, _ := json.Marshal(bus.RunStarted{Type: bus.EventRunStarted, Queue: "default", Worker: "w", Attempt: 1, Tools: []string{}})
	finished := func(status string) []byte {
		b, _ := json.Marshal(bus.RunFinished{Type: bus.EventRunFinished, Status: status, Reason: bus.ReasonInternal, DurationMs: 1})
		return b
	}
	for run, status := range map[string]string{"bad": "done", "good": bus.StatusFailed} {
		for seq, ev := range [][]byte{started, finished(status)} {
			env := &bus.Envelope{Run: run, Seq: uint64(seq + 1), Attempt: 1, Worker: "w", TS: 1, Event: ev}
			if _, err := f.Client.JetStream().Publish(Context(t), f.Client.Names().Events(run), env.AppendJSON(nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if envs := f.Follow("good"); len(envs) != 2 {
		t.Fatalf("%d envelopes", len(envs))
	}
	rec := &fatalRecorder{TB: t}
	f.T = rec
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Follow("bad")
	}()
	<-done
	f.T = t
	if !strings.Contains(rec.msg, "envelope 2 does not fit protocol/event.schema.json") || !strings.Contains(rec.msg, "at '/status'") {
		t.Fatalf("Follow of a run_finished with status \"done\": %q", rec.msg)
	}
}

// fatalRecorder keeps a test's fatal message and ends its goroutine, as
// testing.T does, without failing the test.
type fatalRecorder struct {
	testing.TB
	msg string // written before the goroutine ends; read after
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *fatalRecorder) Fatal(args ...any) {
	r.msg = fmt.Sprint(args...)
	runtime.Goexit()
}
