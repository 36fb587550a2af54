package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// A final record the bucket refuses for good (too large) fails at once;
// it is not retried until the finish's deadline.
func TestFinalRecordPermanentErrorIsNotRetried(t *testing.T) {
	c := connectTestServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := c.JetStream().CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "small", MaxValueSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{kv: kv, id: "w1"}
	l := &lease{w: w, id: "r1", attempt: 1, reqSeq: 7}
	rec := &bus.RunRecord{ID: "r1", State: bus.StateRunning, Attempt: 1, Worker: "w1", RequestSeq: 7}
	if o, _, err := l.take(ctx, nil, rec); err != nil || o != leaseTaken {
		t.Fatalf("take: %v %v", o, err)
	}
	final := *rec
	final.State, final.Error = bus.StatusFailed, strings.Repeat("x", 4096)
	err = l.writeFinal(ctx, &final)
	if err == nil || errors.Is(err, errLeaseLost) || ctx.Err() != nil {
		t.Fatalf("writeFinal: %v (ctx %v): want a prompt permanent error", err, ctx.Err())
	}
	if l.lost.Load() {
		t.Fatal("a refused write is not a lost lease")
	}
}
