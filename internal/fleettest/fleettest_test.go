package fleettest

import (
	"encoding/json"
	"net"
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
