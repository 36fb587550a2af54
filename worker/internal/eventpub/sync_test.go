package eventpub

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
)

// TestSyncWaitsForTheEventsBeforeIt: a sync returns once the events
// published before it are stored, while one published after it still
// waits for its ack (a parallel call's updates would otherwise keep a
// call waiting as long as they come).
func TestSyncWaitsForTheEventsBeforeIt(t *testing.T) {
	t.Parallel()
	w, _ := startInternal(t, testConfig{NoEventBatches: true, PublishAckTimeout: time.Minute}, nil)
	var mu sync.Mutex
	var held []*nats.Msg
	routeAcks(t, w, func(m *nats.Msg) *nats.Msg {
		mu.Lock()
		defer mu.Unlock()
		held = append(held, m)
		return nil
	})
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	publishN(t, p, 3)
	synced := make(chan error, 1)
	go func() { synced <- p.Sync(context.Background()) }()
	until(t, "the sync waiting", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.syncs) == 1
	})
	if _, err := p.Event("x", []byte(`{"type":"x","i":4}`), Options{}); err != nil {
		t.Fatal(err)
	}
	var four *nats.Msg
	until(t, "four acks", func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(held) < 4 {
			return false
		}
		for _, m := range held {
			if strings.HasSuffix(m.Subject, ".4") {
				four = m
			} else {
				w.acks.route(m)
			}
		}
		held = nil
		return true
	})
	if err := within(t, synced, 20*time.Second, "the sync, events 1-3 stored"); err != nil {
		t.Fatal(err)
	}
	if n := p.Unacknowledged(); n != 1 {
		t.Fatalf("%d events unacknowledged, want event 4 alone", n)
	}
	w.acks.route(four)
	if err := flushWithin(t, p); err != nil {
		t.Fatal(err)
	}
}
