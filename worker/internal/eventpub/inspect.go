package eventpub

import (
	"fmt"

	"github.com/nats-io/nats.go"
)

// What the worker's tests look at and steer in its publishers; nothing in
// production calls these.

// Unacknowledged counts p's events not yet stored.
func (p *Publisher) Unacknowledged() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, o := range p.queue {
		if !o.acked {
			n++
		}
	}
	return n
}

// WaitingTurn tells whether an event of p waits for its turn.
func (p *Publisher) WaitingTurn() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.turn != nil
}

// SyncWaits returns the waits of p's Sync calls under way (each closed
// when its events are stored).
func (p *Publisher) SyncWaits() []<-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []<-chan struct{}
	for _, sw := range p.syncs {
		out = append(out, sw.ch)
	}
	return out
}

// RouteAcks routes the acks through pass: what it returns (nil: nothing)
// is applied. Call it before the acks are used.
func (a *Acks) RouteAcks(pass func(*nats.Msg) *nats.Msg) error {
	if err := a.sub.Unsubscribe(); err != nil {
		return err
	}
	sub, err := a.nc.Subscribe(a.prefix+"*.*", func(m *nats.Msg) {
		if m := pass(m); m != nil {
			a.route(m)
		}
	})
	if err != nil {
		return fmt.Errorf("event ack subscription: %w", err)
	}
	a.sub = sub
	return a.nc.Flush()
}

// Apply applies an ack that RouteAcks held back.
func (a *Acks) Apply(m *nats.Msg) { a.route(m) }

// Registered counts the publishers neither flushed nor abandoned.
func (a *Acks) Registered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pubs)
}
