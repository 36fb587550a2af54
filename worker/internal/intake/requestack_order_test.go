package intake

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// heldConn holds a +WPI in its Publish (the beat's goroutine descheduled
// between the acks' check and the write) and records what was written.
type heldConn struct {
	mu      sync.Mutex
	sent    []string
	holdWPI chan struct{}
	inWPI   chan struct{}
}

func (c *heldConn) write(body string) {
	c.mu.Lock()
	c.sent = append(c.sent, body)
	c.mu.Unlock()
}

func (c *heldConn) Publish(_ string, data []byte) error {
	if string(data) == "+WPI" {
		close(c.inWPI)
		<-c.holdWPI
	}
	c.write(string(data))
	return nil
}

func (c *heldConn) RequestWithContext(_ context.Context, _ string, data []byte) (*nats.Msg, error) {
	c.write(string(data))
	return &nats.Msg{}, nil
}

func (c *heldConn) wire() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.sent...)
}

// settleWaits reports whether a settle has begun and waits for a beat.
func (a *requestAck) settleWaits() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.settling > 0 && a.beating > 0
}

// A settle begun while an InProgress is under way is written after it, and
// an InProgress asked for once the settle began is refused: no +WPI
// follows a settle of the same delivery (the server would reset a NAK's
// delay to a whole AckWait, or extend a redelivered copy's AckWait).
func TestAckSettleAfterAnInProgressUnderWay(t *testing.T) {
	for _, tc := range []struct {
		name   string
		settle func(a *requestAck) error
		body   string
	}{
		{"NakWithDelay", func(a *requestAck) error { return a.NakWithDelay(2 * time.Second) }, `-NAK {"delay": 2000000000}`},
		{"Nak", func(a *requestAck) error { return a.Nak() }, "-NAK"},
		{"Ack", func(a *requestAck) error { return a.Ack() }, "+ACK"},
		{"Term", func(a *requestAck) error { return a.TermWithReason("x") }, "+TERM x"},
		{"DoubleAck", func(a *requestAck) error { return a.DoubleAck(context.Background()) }, "+ACK"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &heldConn{holdWPI: make(chan struct{}), inWPI: make(chan struct{})}
			a := &requestAck{nc: c, reply: "$JS.ACK.x"}
			beat := make(chan error, 1)
			go func() { beat <- a.InProgress() }()
			<-c.inWPI
			settled := make(chan error, 1)
			go func() { settled <- tc.settle(a) }()
			// Until the settle waits for the beat (or, wrongly, is done).
			for !a.settleWaits() {
				select {
				case err := <-settled:
					close(c.holdWPI)
					<-beat
					t.Fatalf("the settle (%v) returned while an InProgress was under way: wire %q", err, c.wire())
				default:
					runtime.Gosched()
				}
			}
			if err := a.InProgress(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
				t.Fatalf("an InProgress once the settle began: %v", err)
			}
			close(c.holdWPI)
			if err := <-beat; err != nil {
				t.Fatal(err)
			}
			if err := <-settled; err != nil {
				t.Fatal(err)
			}
			if got := c.wire(); len(got) != 2 || got[0] != "+WPI" || got[1] != tc.body {
				t.Fatalf("wire order %q, want [+WPI %q]", got, tc.body)
			}
			if err := a.InProgress(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
				t.Fatalf("an InProgress after the settle: %v", err)
			}
		})
	}
}

// A double ack waiting for an InProgress under way gives up with its
// context, and the acknowledgements are not settled.
func TestAckDoubleAckWaitBoundedByItsContext(t *testing.T) {
	c := &heldConn{holdWPI: make(chan struct{}), inWPI: make(chan struct{})}
	a := &requestAck{nc: c, reply: "$JS.ACK.x"}
	beat := make(chan error, 1)
	go func() { beat <- a.InProgress() }()
	<-c.inWPI
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.DoubleAck(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("DoubleAck: %v", err)
	}
	close(c.holdWPI)
	<-beat
	if err := a.Ack(); err != nil {
		t.Fatal(err)
	}
	if got := c.wire(); len(got) != 2 || got[1] != "+ACK" {
		t.Fatalf("wire %q", got)
	}
}
