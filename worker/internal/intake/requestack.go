package intake

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RequestAcks are the acknowledgements a run sends for its request.
type RequestAcks interface {
	Ack() error
	DoubleAck(context.Context) error
	Nak() error
	NakWithDelay(time.Duration) error
	InProgress() error
	TermWithReason(string) error
}

// AckConn is what acknowledgements are sent on: a *nats.Conn (a test may
// wrap it to hold an ack).
type AckConn interface {
	Publish(subj string, data []byte) error
	RequestWithContext(ctx context.Context, subj string, data []byte) (*nats.Msg, error)
}

// requestAck acknowledges a run request whose bytes are no longer needed.
// A jetstream.Msg keeps the request's payload and headers (1.4 KB of a
// waiting run's heap in docs/benchmarks/2026-12.md, 2026-12-02 afternoon)
// for as long as the run lives, hours for a run waiting in a tool; the
// acknowledgement protocol needs only the reply subject. It answers as
// jetstream.Msg does (nats.go's jetstream/message.go; requestack_test.go
// holds the two to the same answers): the same bodies on the same
// connection, and once acked, naked or terminated, every other
// acknowledgement returns jetstream.ErrMsgAlreadyAckd.
type requestAck struct {
	nc    AckConn
	reply string

	mu   sync.Mutex
	ackd bool
}

// doubleAckTimeout bounds a double ack whose context has no deadline
// (jetstream's DefaultTimeout).
const doubleAckTimeout = 5 * time.Second

// SlimAcks returns m's acknowledgements without its bytes, or m itself if
// it cannot be acknowledged that way (no reply subject).
func SlimAcks(nc AckConn, m jetstream.Msg) RequestAcks {
	if nc == nil || m.Reply() == "" {
		return m
	}
	return &requestAck{nc: nc, reply: m.Reply()}
}

func (a *requestAck) Ack() error { return a.send(context.Background(), "+ACK", false) }

func (a *requestAck) DoubleAck(ctx context.Context) error { return a.send(ctx, "+ACK", true) }

func (a *requestAck) Nak() error { return a.send(context.Background(), "-NAK", false) }

func (a *requestAck) NakWithDelay(d time.Duration) error {
	if d <= 0 {
		return a.Nak()
	}
	return a.send(context.Background(), `-NAK {"delay": `+strconv.FormatInt(d.Nanoseconds(), 10)+`}`, false)
}

func (a *requestAck) InProgress() error { return a.send(context.Background(), "+WPI", false) }

func (a *requestAck) TermWithReason(reason string) error {
	if reason == "" {
		return a.send(context.Background(), "+TERM", false)
	}
	return a.send(context.Background(), "+TERM "+reason, false)
}

// send is nats.go's ackReply: the state is checked under mu, the
// acknowledgement sent outside it.
func (a *requestAck) send(ctx context.Context, body string, sync bool) error {
	a.mu.Lock()
	ackd := a.ackd
	a.mu.Unlock()
	if ackd {
		return jetstream.ErrMsgAlreadyAckd
	}
	var err error
	if sync {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, doubleAckTimeout)
			defer cancel()
		}
		_, err = a.nc.RequestWithContext(ctx, a.reply, []byte(body))
	} else {
		err = a.nc.Publish(a.reply, []byte(body))
	}
	if err != nil {
		return err
	}
	if body != "+WPI" {
		a.mu.Lock()
		a.ackd = true
		a.mu.Unlock()
	}
	return nil
}
