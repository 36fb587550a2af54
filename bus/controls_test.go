package bus_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// A control message sent again with the same id (a retry after a lost
// ack) is stored once and answered with the first copy's sequence; ids
// are per run and kind, and without one every send is a new message.
func TestControlRetryWithIDIsStoredOnce(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	run, other := "retried", "other"
	for _, id := range []string{run, other} {
		if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "hi"}); err != nil {
			t.Fatal(err)
		}
	}
	send := func(run, kind string, opts ...bus.ControlOption) uint64 {
		t.Helper()
		seq, err := c.SendControl(ctx, run, kind, bus.Control{Text: "left"}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	first := send(run, bus.KindSteer, bus.WithControlID("k1"))
	if again := send(run, bus.KindSteer, bus.WithControlID("k1")); again != first {
		t.Fatalf("retry stored as %d, the first copy is %d", again, first)
	}
	distinct := []uint64{
		first,
		send(run, bus.KindSteer, bus.WithControlID("k2")),
		send(run, bus.KindFollowUp, bus.WithControlID("k1")),
		send(other, bus.KindSteer, bus.WithControlID("k1")),
		send(run, bus.KindSteer),
		send(run, bus.KindSteer),
	}
	seen := map[uint64]bool{}
	for _, s := range distinct {
		if seen[s] {
			t.Fatalf("sequences %v: different messages stored as one", distinct)
		}
		seen[s] = true
	}
	stream, err := c.JetStream().Stream(ctx, c.Names().ControlStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(c.Names().Control(run, bus.KindSteer)))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[c.Names().Control(run, bus.KindSteer)]; n != 4 {
		t.Fatalf("%d steers stored for the run, want 4 (k1 once, k2, two without an id)", n)
	}
	// The run finishes: a retry of a stored message still gets its first
	// copy's sequence; a new message is refused.
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, run, []byte(`{"id":"retried","queue":"default","state":"succeeded","attempt":1,"turns":1}`)); err != nil {
		t.Fatal(err)
	}
	if again := send(run, bus.KindSteer, bus.WithControlID("k1")); again != first {
		t.Fatalf("retry after the run finished stored as %d, the first copy is %d", again, first)
	}
	// A new message, and a retry of it (its first copy was sent after the
	// finish, so the run ignored it too), are refused.
	for _, opts := range [][]bus.ControlOption{{bus.WithControlID("k3")}, {bus.WithControlID("k3")}, nil} {
		if _, err := c.SendControl(ctx, run, bus.KindSteer, bus.Control{Text: "late"}, opts...); !errors.Is(err, bus.ErrRunFinished) {
			t.Fatalf("a new message to a finished run: %v", err)
		}
	}
	// An id that could leave its header, or is empty or long, is refused
	// before anything is sent.
	for _, id := range []string{"", "k\r\nNats-Expected-Stream: X", "k 1", strings.Repeat("k", bus.MaxControlIDBytes+1)} {
		if _, err := c.SendControl(ctx, run, bus.KindSteer, bus.Control{Text: "left"}, bus.WithControlID(id)); err == nil || !strings.Contains(err.Error(), "invalid control id") {
			t.Errorf("id %q: %v", id, err)
		}
	}
	// 4, and k3's copy, stored to learn it was new (a finished run ignores it).
	if info, err = stream.Info(ctx, jetstream.WithSubjectFilter(c.Names().Control(run, bus.KindSteer))); err != nil || info.State.Subjects[c.Names().Control(run, bus.KindSteer)] != 5 {
		t.Fatalf("refused ids stored something: %+v %v", info.State.Subjects, err)
	}
}
