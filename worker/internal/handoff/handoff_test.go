package handoff

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/natsembed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Each message is handled off the callback (two handlings block at once);
// stop waits for the handlings in progress and starts none after.
func TestConsumeHandsOffAndStopWaits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"t.1", "t.2"} {
		if _, err := js.Publish(ctx, subj, nil); err != nil {
			t.Fatal(err)
		}
	}
	started := make(chan string, 2)
	release := make(chan struct{})
	stop, err := Consume(ctx, cons, 4, "test consumer", slog.New(slog.DiscardHandler), func(_ context.Context, m jetstream.Msg) {
		started <- m.Subject()
		<-release
		_ = m.Ack()
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // both at once: neither blocks the callback
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("the two messages were not handled at once")
		}
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while handlings were in progress")
	case <-time.After(100 * time.Millisecond): // a stop that did not wait returns at once
	}
	close(release)
	<-stopped
	if _, err := js.Publish(ctx, "t.3", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case subj := <-started:
		t.Fatalf("%s handled after stop", subj)
	default:
	}
}
