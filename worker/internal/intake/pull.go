package intake

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Puller are one pull loop's pull requests, sent by the loop itself
// rather than by nats.go's Consumer.Fetch. Fetch reads each request's
// messages on an inbox it gives up a second after the last one: what the
// server sent a reader slower than that waited for AckWait's redelivery,
// one delivery used up. And Fetch cannot bound the bytes of a no-wait
// fetch.
//
// Invariants:
//  1. A loop reads one request at a time. It asks for no more messages
//     than the slots it holds, and a short request for at most maxBytes.
//  2. Every request has an expiry, past which the server sends it nothing
//     (without one, a no_wait request at the consumer's MaxAckPending is
//     neither served nor ended).
//  3. Every request replies to the loop's inbox subscription, which lives
//     until the loop ends or moves on: nothing the server sends is left
//     unread because a reader gave up early.
//  4. A request ends at its batch-th message, at maxBytes (a batch that
//     fills it exactly gets no status after), or at a status (404, 408,
//     409). The server sends it no message after these, only, after the
//     last message of a byte-bounded batch with bytes to spare, a "409
//     Batch Completed". A status names its request (its subject is the
//     request's reply subject, inbox.<k>); a message does not (it keeps
//     its stream subject), so the inbox must hold no message of an earlier
//     request when the next one is read.
//  5. So the loop moves to a new inbox when a request ends otherwise: a
//     refusal that may leave messages on their way (a leader change: the
//     old leader's may follow the new one's 409), or a request lost (a
//     lost connection, a restarted server): nothing for requestGrace past
//     the expiry, and a ping's pong then read with nothing of the request
//     before it. Silence alone is not loss: behind a slow reader the
//     request's messages and its end wait in the server's buffer for
//     seconds, and giving up then handed every one of them back (attempt
//     2 of a run never started). What still reaches the old inbox has no
//     slot: it is handed back at once, not left for AckWait; the request
//     it came for has ended, so it goes to another.
type Puller struct {
	nc      *nats.Conn
	subject string // the consumer's next-message API subject
	inbox   string // request k replies to inbox.k
	sub     *nats.Subscription
	seq     uint64
	grace   time.Duration
	late    sync.WaitGroup // hand-backs of abandoned inboxes
	closing chan struct{}  // closed by Close: hand-backs stop at their next silence
	// handedBack counts late messages handed back (a message for an
	// inbox the loop had left), behind the silent inboxes found behind,
	// not done: what a slow read side costs the loop.
	handedBack atomic.Int64
	behind     atomic.Int64
}

// requestGrace is how long past its expiry (and then between checks) a
// request may go silent before the loop asks whether it is behind or the
// request lost (caughtUp).
const requestGrace = 2 * time.Second

func NewPuller(nc *nats.Conn, cons jetstream.Consumer) (*Puller, error) {
	info := cons.CachedInfo()
	p := &Puller{nc: nc, subject: "$JS.API.CONSUMER.MSG.NEXT." + info.Stream + "." + info.Name,
		inbox: nc.NewInbox(), grace: requestGrace, closing: make(chan struct{})}
	sub, err := p.subscribe(p.inbox)
	if err != nil {
		return nil, err
	}
	p.sub = sub
	return p, nil
}

func (p *Puller) subscribe(inbox string) (*nats.Subscription, error) {
	sub, err := p.nc.SubscribeSync(inbox + ".*")
	if err != nil {
		return nil, fmt.Errorf("pull inbox: %w", err)
	}
	// The server bounds what a request brings (batch, max_bytes); a limit
	// here would only drop messages that then wait for AckWait.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("pull inbox: %w", err)
	}
	return sub, nil
}

// Close ends the loop's inbox once its last request has ended, and waits
// for the hand-back of abandoned inboxes: each ends at its next silence of
// requestGrace, caught up or not (a stopping worker does not wait on a
// stalled connection).
func (p *Puller) Close() {
	_ = p.sub.Unsubscribe()
	close(p.closing)
	p.late.Wait()
}

// RefusedError is a request's end other than its batch, no messages or
// its expiry: the server's status code and description.
type RefusedError struct{ code, description string }

func (e *RefusedError) Error() string {
	return "pull request: " + e.code + " " + e.description
}

// LeadershipChanged reports whether the consumer's leader changed: every
// open request ends, and pulling again at once is right.
func (e *RefusedError) LeadershipChanged() bool {
	return e.code == "409" && e.description == "Leadership Change"
}

var errRequestLost = errors.New("pull request: no answer")

// Fetch asks for up to n messages, for at most wait, and calls each for
// every one, in order; it returns how many came. With maxBytes > 0 it is
// a short request: no_wait (it ends once the consumer has nothing more),
// within maxBytes. A request that ends with no message or at its expiry
// returns no error. Once ctx is done, a request silent for requestGrace
// past its expiry is given up without the proof that it is lost (what
// still comes is handed back).
func (p *Puller) Fetch(ctx context.Context, n, maxBytes int, wait time.Duration, each func(jetstream.Msg)) (int, error) {
	p.seq++
	token := strconv.FormatUint(p.seq, 10)
	var body []byte
	if maxBytes > 0 {
		body = fmt.Appendf(nil, `{"batch":%d,"max_bytes":%d,"no_wait":true,"expires":%d}`, n, maxBytes, wait.Nanoseconds())
	} else {
		body = fmt.Appendf(nil, `{"batch":%d,"expires":%d}`, n, wait.Nanoseconds())
	}
	expiresAt := time.Now().Add(wait)
	if err := p.nc.PublishRequest(p.subject, p.inbox+"."+token, body); err != nil {
		return 0, err
	}
	got, left := 0, maxBytes
	deadline := expiresAt.Add(p.grace)
	for got < n {
		m, err := p.sub.NextMsg(time.Until(deadline))
		if errors.Is(err, nats.ErrTimeout) {
			if ctx.Err() != nil || p.caughtUp(p.sub) {
				return got, p.moveOn(errRequestLost)
			}
			p.behind.Add(1)
			deadline = time.Now().Add(p.grace)
			continue
		}
		if err != nil {
			return got, err
		}
		if m.Reply == "" { // a status: a message has its ack subject
			if m.Subject != p.inbox+"."+token {
				continue // an earlier request's "409 Batch Completed"
			}
			code := m.Header.Get("Status")
			switch code {
			case "100": // a heartbeat
				continue
			case "404", "408":
				return got, nil
			}
			desc := m.Header.Get("Description")
			if code == "409" && (desc == "Message Size Exceeds MaxBytes" || desc == "Batch Completed") {
				return got, nil
			}
			return got, p.moveOn(&RefusedError{code: code, description: desc})
		}
		got++
		left -= m.Size() // as the server counts it: subject, reply, headers, data
		each(newPulledMsg(p.nc, m))
		if maxBytes > 0 && left <= 0 {
			break
		}
	}
	return got, nil
}

// caughtUp reports whether the loop has read all the server sent it before
// now, so that a request still without its end is lost. The server writes
// a pong after what it queued for the connection before the ping (the
// request's messages and its end status among them, past its expiry): a
// pong read with nothing pending on the inbox is the proof. A pong not
// back within grace on a live connection says the reader is behind; on a
// connection that is gone or came back, what was on its way is lost.
func (p *Puller) caughtUp(sub *nats.Subscription) bool {
	err := p.nc.FlushTimeout(p.grace)
	if errors.Is(err, nats.ErrTimeout) && p.nc.IsConnected() {
		return false
	}
	if err != nil {
		return true
	}
	pending, _, err := sub.Pending()
	return err != nil || pending == 0
}

// moveOn moves the loop to a new inbox after a request that ended with
// cause, and returns cause.
func (p *Puller) moveOn(cause error) error {
	if err := p.abandon(); err != nil {
		return errors.Join(cause, err)
	}
	return cause
}

// abandon moves the loop to a new inbox, and hands back what reaches the
// old one: it has no slot. The old inbox goes once nothing came for
// requestGrace and the loop has read all the server sent before
// (caughtUp): behind a slow reader, a message unsubscribed from was
// dropped, and waited for AckWait's redelivery.
func (p *Puller) abandon() error {
	old := p.sub
	inbox := p.nc.NewInbox()
	sub, err := p.subscribe(inbox)
	if err != nil {
		return err
	}
	p.inbox, p.sub = inbox, sub
	p.late.Add(1)
	deadline := time.Now().Add(p.grace)
	go func() {
		defer p.late.Done()
		defer func() { _ = old.Unsubscribe() }()
		for {
			m, err := old.NextMsg(time.Until(deadline))
			if errors.Is(err, nats.ErrTimeout) {
				if p.caughtUp(old) {
					return
				}
				select {
				case <-p.closing:
					return
				default:
				}
				p.behind.Add(1)
				deadline = time.Now().Add(p.grace)
				continue
			}
			if err != nil {
				return
			}
			if m.Reply != "" {
				_ = p.nc.Publish(m.Reply, []byte("-NAK"))
				p.handedBack.Add(1)
			}
		}
	}()
	return nil
}

// pulledMsg is a request message read from a pull loop's inbox, as
// jetstream.Msg: its metadata is in its reply subject, its
// acknowledgements are requestAck's.
type pulledMsg struct {
	m *nats.Msg
	requestAck
}

func newPulledMsg(nc *nats.Conn, m *nats.Msg) *pulledMsg {
	return &pulledMsg{m: m, requestAck: requestAck{nc: nc, reply: m.Reply}}
}

func (p *pulledMsg) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := p.m.Metadata()
	if err != nil {
		return nil, err
	}
	return &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Consumer: md.Sequence.Consumer, Stream: md.Sequence.Stream},
		NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp,
		Stream: md.Stream, Consumer: md.Consumer, Domain: md.Domain,
	}, nil
}

func (p *pulledMsg) Data() []byte         { return p.m.Data }
func (p *pulledMsg) Headers() nats.Header { return p.m.Header }
func (p *pulledMsg) Subject() string      { return p.m.Subject }
func (p *pulledMsg) Reply() string        { return p.m.Reply }
func (p *pulledMsg) Term() error          { return p.TermWithReason("") }

var _ jetstream.Msg = (*pulledMsg)(nil)

// ShortWait bounds a fetch of several: it ends once the consumer has
// nothing more, or at this expiry (at MaxAckPending the server neither
// serves nor ends a no_wait request without one).
const ShortWait = 5 * time.Millisecond
