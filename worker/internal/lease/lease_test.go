package lease

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testEnv is a worker's lease env on a bucket of an embedded server.
func testEnv(t *testing.T, cfg jetstream.KeyValueConfig) *Env {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
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
	kv, err := c.JetStream().CreateKeyValue(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	read := func(ctx context.Context, id string) (*bus.RunRecord, error) {
		e, err := kv.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		return bus.DecodeRecord(e)
	}
	return &Env{KV: kv, Worker: "w1", Read: read}
}

// A final record the bucket refuses for good (too large) fails at once;
// it is not retried until the finish's deadline.
func TestFinalRecordPermanentErrorIsNotRetried(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	env := testEnv(t, jetstream.KeyValueConfig{Bucket: "small", MaxValueSize: 1024})
	l := New(env, "r1", 1, 7, nil)
	rec := &bus.RunRecord{ID: "r1", State: bus.StateRunning, Attempt: 1, Worker: "w1", RequestSeq: 7}
	if o, _, err := l.Take(ctx, nil, rec); err != nil || o != Taken {
		t.Fatalf("take: %v %v", o, err)
	}
	final := *rec
	final.State, final.Error = bus.StatusFailed, strings.Repeat("x", 4096)
	err := l.WriteFinal(ctx, &final)
	if err == nil || errors.Is(err, ErrLost) || ctx.Err() != nil {
		t.Fatalf("writeFinal: %v (ctx %v): want a prompt permanent error", err, ctx.Err())
	}
	if l.Lost() {
		t.Fatal("a refused write is not a lost lease")
	}
}

// Take never writes over a record of a higher attempt, whoever calls it.
func TestLeaseTakeRefusesAHigherAttempt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	env := testEnv(t, jetstream.KeyValueConfig{Bucket: "records"})
	higher := &bus.RunRecord{ID: "r1", State: bus.StateRunning, Attempt: 4, Worker: "other", RequestSeq: 7}
	data, _ := json.Marshal(higher)
	rev, err := env.KV.Create(ctx, "r1", data)
	if err != nil {
		t.Fatal(err)
	}
	prev, err := env.Read(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	l := New(env, "r1", 3, 7, nil)
	o, cur, err := l.Take(ctx, prev, &bus.RunRecord{ID: "r1", State: bus.StatusFailed, Attempt: 3, Worker: env.Worker, RequestSeq: 7})
	if err != nil || o != Newer || cur == nil || cur.Attempt != 4 {
		t.Fatalf("take over attempt 4 as attempt 3: %v %+v %v", o, cur, err)
	}
	if now, err := env.Read(ctx, "r1"); err != nil || now.Revision != rev {
		t.Fatalf("record rewritten: %+v %v", now, err)
	}
}
