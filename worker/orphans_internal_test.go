package worker

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// deleteTimesOut is the runs stream with a delete the server never
// answers: it returns when its context ends.
type deleteTimesOut struct{ jetstream.Stream }

func (deleteTimesOut) DeleteMsg(ctx context.Context, _ uint64) error {
	<-ctx.Done()
	return ctx.Err()
}

// A delete that timed out leaves the look-up that checks it its own
// timeout: a message that is not there is reported so, not as the
// delete's failure.
func TestDeleteRequestLooksUpWithItsOwnTimeout(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	s, err := c.Stream(ctx, c.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{runsStream: deleteTimesOut{s}}
	if gone, err := w.deleteRequest(ctx, 12345); gone || err != nil {
		t.Fatalf("deleting a message that is not there: gone %v, err %v; want not gone, no error", gone, err)
	}
}
