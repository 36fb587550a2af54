package eventpub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// Env is what the publishers of one worker share: where events go, the
// acks and batches every publisher uses, and the worker's bounds.
type Env struct {
	Conn        *nats.Conn       // acks come back on it; its state and bounds are the events'
	Out         Out              // events go out on it (the Conn, or a test's wrapper of it)
	Names       bus.Names        // the events subjects
	Stream      jetstream.Stream // the events stream: a re-send reads what it holds
	Acks        *Acks            // every publisher's acks (acks.go)
	Batch       *Batch           // event batches (batch.go); nil: every event goes singly
	Window      int              // a publisher's events unacknowledged at most
	AckTimeout  time.Duration    // an ack's wait before its event is re-sent
	Budget      time.Duration    // how long a re-send may try (the run's AckWait)
	Worker      string           // the worker's id, in every envelope
	StoredReads chan struct{}    // re-sends reading the stream at a time (MaxStoredReads)
	Stop        context.Context  // ends at the worker's hard stop: waits and re-sends give up
	Log         *slog.Logger
	Metrics     Metrics
	Signals     *Signals // tests'; nil in production
}

// Out is where events are sent (a re-send as a request): a *nats.Conn. A
// test wraps it to stop a send, or to see which events go out.
type Out interface {
	PublishMsg(m *nats.Msg) error
	RequestMsgWithContext(ctx context.Context, m *nats.Msg) (*nats.Msg, error)
}

// Metrics is what the publishers report (the worker's Observer has it).
type Metrics interface {
	EventPublished()
	PublishFailed(error)
	PublishWait(time.Duration)
}

// Signals let tests stop a publisher at the steps whose races they pin.
// Each is called when set; a nil *Signals calls none.
type Signals struct {
	BeforeResend     func(seq uint64)               // before each event a re-send sends
	BeforeAcksSweep  func()                         // before each pass of the acks' sweep
	BeforeStoredRead func(p *Publisher)             // before a re-send takes a slot to read the stream
	BeforeHeldSend   func(seq uint64)               // before a re-send ends sending what it held from seq on
	BeforeBatchSend  func(p *Publisher, seq uint64) // before an event goes to the batch, after p's checks
	BeforeSingleSend func(p *Publisher, seq uint64) // before an event goes out singly (not re-sent)
	BatchWait        func(p *Publisher, seq uint64) // an event waits for its run's earlier batch
}

func (s *Signals) beforeResend(seq uint64) {
	if s != nil && s.BeforeResend != nil {
		s.BeforeResend(seq)
	}
}

func (s *Signals) beforeAcksSweep() {
	if s != nil && s.BeforeAcksSweep != nil {
		s.BeforeAcksSweep()
	}
}

func (s *Signals) beforeStoredRead(p *Publisher) {
	if s != nil && s.BeforeStoredRead != nil {
		s.BeforeStoredRead(p)
	}
}

func (s *Signals) beforeHeldSend(seq uint64) {
	if s != nil && s.BeforeHeldSend != nil {
		s.BeforeHeldSend(seq)
	}
}

func (s *Signals) beforeBatchSend(p *Publisher, seq uint64) {
	if s != nil && s.BeforeBatchSend != nil {
		s.BeforeBatchSend(p, seq)
	}
}

func (s *Signals) beforeSingleSend(p *Publisher, seq uint64) {
	if s != nil && s.BeforeSingleSend != nil {
		s.BeforeSingleSend(p, seq)
	}
}

func (s *Signals) batchWait(p *Publisher, seq uint64) {
	if s != nil && s.BatchWait != nil {
		s.BatchWait(p, seq)
	}
}

var (
	// ErrFenced: the attempt lost its run (Fence); nothing more was sent.
	ErrFenced = errors.New("the run's lease was lost: another attempt owns it")
	// ErrStopped: the hard stop (Env.Stop) cut a wait or a re-send short;
	// the run is handed back as any run at a hard stop is.
	ErrStopped = errors.New("worker stopping")
	// ErrClosed: an event after Flush or Abandon.
	ErrClosed = errors.New("publisher closed")

	errOutOfOrder = errors.New("events were stored out of order after a reconnect")
	errSuperseded = errors.New("a newer attempt published on the run")
	errNoProgress = errors.New("re-send refused, and nothing new stored")
)

// EventTooLargeError is a single event that would not fit in one NATS
// message. The run fails with reason event_too_large.
type EventTooLargeError struct {
	Type  string
	Size  int
	Limit int
}

func (e *EventTooLargeError) Error() string {
	return fmt.Sprintf("%s event is %d bytes, more than the %d bytes a NATS message may carry", e.Type, e.Size, e.Limit)
}

// Options are an event's envelope fields beyond its seq and time.
type Options struct {
	ControlSeq  uint64 // the control message a user message came from; 0: none
	Interrupted bool   // a message_end cut off because the worker was stopping
}

// BatchesAllowed tells whether the events stream, as configured, takes
// event batches: it allows them and has the commit subject.
func BatchesAllowed(cfg jetstream.StreamConfig, names bus.Names) bool {
	return cfg.AllowBatchPublish && slices.Contains(cfg.Subjects, names.EventBatches())
}
