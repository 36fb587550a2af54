package park

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// countAPI counts the requests on subj (a JetStream API subject) until
// the test ends.
func countAPI(t *testing.T, nc *nats.Conn, subj string) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	sub, err := nc.Subscribe(subj, func(*nats.Msg) { n.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &n
}

// A wake reads the kept copy by direct get (1.10): AGENTS_PARKED allows
// them, and no STREAM.MSG.GET waits in the server's API queue.
func TestWakeReadsTheKeptCopyByDirectGet(t *testing.T) {
	f := newTestFleet(t)
	ctx := testCtx(t)
	if !f.env.Parked.CachedInfo().Config.AllowDirect {
		t.Fatal("AGENTS_PARKED does not allow direct gets")
	}
	nc := f.c.Conn()
	stream := f.env.Names.ParkedStream()
	api := countAPI(t, nc, "$JS.API.STREAM.MSG.GET."+stream)
	direct := countAPI(t, nc, "$JS.API.DIRECT.GET."+stream)
	_, rec := f.parkDigest(t, "r1", []byte(`{"prompt":"deploy"}`), true)
	if err := f.env.Wake(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if len(f.wakes(t, "r1")) != 1 {
		t.Fatal("no wake stored")
	}
	if err := nc.Flush(); err != nil { // the counting subscriptions have seen the requests
		t.Fatal(err)
	}
	if api.Load() != 0 || direct.Load() != 1 {
		t.Fatalf("the wake's read of the kept copy: %d API gets, %d direct gets; want 0 and 1", api.Load(), direct.Load())
	}
}

// replicaBehind is AGENTS_PARKED answered by a replica that has not
// stored the kept copy yet: every direct get finds nothing.
type replicaBehind struct {
	jetstream.Stream
}

func (replicaBehind) GetMsg(context.Context, uint64, ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	return nil, jetstream.ErrMsgNotFound
}

func (s replicaBehind) CachedInfo() *jetstream.StreamInfo {
	info := *s.Stream.CachedInfo()
	info.Config.Replicas = 3
	return &info
}

// On a stream of more than one replica, a direct get's "not found" is
// asked again of the leader: a replica behind does not lose a wake.
func TestKeptCopyNotFoundOnAReplicaIsReadFromTheLeader(t *testing.T) {
	f := newTestFleet(t)
	ctx := testCtx(t)
	body := []byte(`{"prompt":"deploy"}`)
	_, rec := f.parkDigest(t, "r1", body, true)
	f.env.Parked = replicaBehind{f.env.Parked}
	if err := f.env.Wake(ctx, rec); err != nil {
		t.Fatal(err)
	}
	wakes := f.wakes(t, "r1")
	if len(wakes) != 1 || string(wakes[0].Data) != string(body) || wakes[0].Header.Get(bus.HeaderWakeKey) == "" {
		t.Fatalf("wakes %+v: want the kept copy, with its wake key, read from the leader", wakes)
	}
	// A copy truly gone stays gone (the record moved on, or max age).
	if _, err := f.env.kept(ctx, rec.Parked.Seq+100); err != jetstream.ErrMsgNotFound {
		t.Fatalf("a missing copy: %v, want ErrMsgNotFound", err)
	}
}
