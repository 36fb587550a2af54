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
//
// Unlike jetstream.Msg, a settle (ack, nak, term) and an InProgress are
// ordered: once a settle has begun, no InProgress starts (it returns
// ErrMsgAlreadyAckd), and the settle is sent only after an InProgress
// under way went out. The server matches +WPI by stream sequence and
// resets the pending entry's time (consumer.progressUpdate): a +WPI
// written after a NAK turned its delay into a whole AckWait, and after a
// NAK whose copy was redelivered it extended the new owner's AckWait.
// No lock is held while sending: a settle waits (on a channel) for the
// InProgress's publish to return, which is what its own publish on the
// same connection would wait for anyway.
type requestAck struct {
	nc    AckConn
	reply string

	mu       sync.Mutex
	ackd     bool
	settling int           // settles under way: no InProgress starts
	beating  int           // InProgress sends under way
	beatDone chan struct{} // closed when beating drops to 0
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

func (a *requestAck) InProgress() error {
	a.mu.Lock()
	if a.ackd || a.settling > 0 {
		a.mu.Unlock()
		return jetstream.ErrMsgAlreadyAckd
	}
	if a.beating == 0 {
		a.beatDone = make(chan struct{})
	}
	a.beating++
	a.mu.Unlock()
	err := a.nc.Publish(a.reply, []byte("+WPI"))
	a.mu.Lock()
	a.beating--
	if a.beating == 0 {
		close(a.beatDone)
		a.beatDone = nil
	}
	a.mu.Unlock()
	return err
}

func (a *requestAck) TermWithReason(reason string) error {
	if reason == "" {
		return a.send(context.Background(), "+TERM", false)
	}
	return a.send(context.Background(), "+TERM "+reason, false)
}

// send settles the request: the state is checked under mu, an
// InProgress under way is waited for (ctx bounds the wait), and the
// acknowledgement is sent outside the lock.
func (a *requestAck) send(ctx context.Context, body string, sync bool) error {
	a.mu.Lock()
	if a.ackd {
		a.mu.Unlock()
		return jetstream.ErrMsgAlreadyAckd
	}
	a.settling++
	beatDone := a.beatDone
	a.mu.Unlock()
	err := a.settle(ctx, beatDone, body, sync)
	a.mu.Lock()
	a.settling--
	if err == nil {
		a.ackd = true
	}
	a.mu.Unlock()
	return err
}

func (a *requestAck) settle(ctx context.Context, beatDone <-chan struct{}, body string, sync bool) error {
	if sync {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, doubleAckTimeout)
			defer cancel()
		}
	}
	if beatDone != nil {
		select {
		case <-beatDone:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if sync {
		_, err := a.nc.RequestWithContext(ctx, a.reply, []byte(body))
		return err
	}
	return a.nc.Publish(a.reply, []byte(body))
}
