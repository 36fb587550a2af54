package worker

import (
	"context"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// Tests stop a run at a step by wrapping what it reads or sends there
// (Worker.records, controlReads, wire); set before Run.

// beforeRecordRead calls before with the run's id before each read of a
// run's record.
func beforeRecordRead(w *Worker, before func(id string)) {
	w.records = recordsBefore{next: w.records, before: before}
}

type recordsBefore struct {
	next   recordReader
	before func(id string)
}

func (r recordsBefore) read(ctx context.Context, id string) (jetstream.KeyValueEntry, error) {
	r.before(id)
	return r.next.read(ctx, id)
}

// beforeControlRead calls before with the run's id before each read of
// the run's control messages (a catch-up: the pickup's, the idle check's,
// one a live message out of order started).
func beforeControlRead(w *Worker, before func(run string)) {
	w.controlReads = controlsBefore{controlReads: w.controlReads, read: before}
}

// beforeFenceRead runs before with each try's context before each try to
// read a gated call's fence; an error it returns is the try's.
func beforeFenceRead(w *Worker, before func(ctx context.Context) error) {
	w.controlReads = controlsBefore{controlReads: w.controlReads, fence: before}
}

type controlsBefore struct {
	controlReads
	read  func(run string)
	fence func(ctx context.Context) error
}

func (c controlsBefore) since(ctx context.Context, run string, last kindSeqs, probe bool) ([]*jetstream.RawStreamMsg, error) {
	if c.read != nil {
		c.read(run)
	}
	return c.controlReads.since(ctx, run, last, probe)
}

func (c controlsBefore) lastSeq(ctx context.Context) (uint64, error) {
	if c.fence != nil {
		if err := c.fence(ctx); err != nil {
			return 0, err
		}
	}
	return c.controlReads.lastSeq(ctx)
}

// sends wraps what the worker sends. Each hook that is set is called on
// the sender's goroutine: beforeEvent before an event goes out (singly
// or in a batch), afterEvent once it went out, beforeResend before an
// event is re-sent, beforeAck before a request's ack (its stream
// sequence; DoubleAck's round trip).
type sends struct {
	wire
	beforeEvent  func(e *bus.Envelope)
	afterEvent   func(e *bus.Envelope)
	beforeResend func(e *bus.Envelope)
	beforeAck    func(requestSeq uint64)
}

// wrapSends puts s between w and its connection.
func wrapSends(w *Worker, s sends) {
	s.wire = w.wire
	w.wire = s
}

func (s sends) PublishMsg(m *nats.Msg) error {
	e, _ := bus.DecodeEnvelope(m.Data)
	if e != nil && s.beforeEvent != nil {
		s.beforeEvent(e)
	}
	err := s.wire.PublishMsg(m)
	if e != nil && s.afterEvent != nil {
		s.afterEvent(e)
	}
	return err
}

func (s sends) RequestMsgWithContext(ctx context.Context, m *nats.Msg) (*nats.Msg, error) {
	if e, _ := bus.DecodeEnvelope(m.Data); e != nil && s.beforeResend != nil {
		s.beforeResend(e)
	}
	return s.wire.RequestMsgWithContext(ctx, m)
}

func (s sends) RequestWithContext(ctx context.Context, subj string, data []byte) (*nats.Msg, error) {
	if s.beforeAck != nil && strings.HasPrefix(subj, "$JS.ACK.") {
		s.beforeAck(ackStreamSeq(subj))
	}
	return s.wire.RequestWithContext(ctx, subj, data)
}

// ackStreamSeq is the stream sequence in a JetStream ack subject:
// $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>... or, with a domain
// and an account hash, $JS.ACK.<domain>.<hash>.<stream>....
func ackStreamSeq(subj string) uint64 {
	t := strings.Split(subj, ".")
	i := 5
	if len(t) >= 12 {
		i = 7
	}
	if i >= len(t) {
		return 0
	}
	n, _ := strconv.ParseUint(t[i], 10, 64)
	return n
}
