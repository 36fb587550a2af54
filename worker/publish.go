package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// envelopeHeadroom is kept free under the max payload for headers and
// protocol overhead.
const envelopeHeadroom = 4 << 10

var errPublisherClosed = errors.New("publisher closed")

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

// publisher publishes one attempt's events and record writes asynchronously
// with a bounded window of outstanding acks. Every message takes a window
// slot before it is published and gives it back when its ack arrives; a
// full window blocks the caller (the agent's listener): back-pressure.
// Any failed publish fails the attempt: its events would no longer be
// gapless, so the run is stopped and handed back.
type publisher struct {
	w       *Worker
	run     string
	attempt int
	subject string
	record  string
	limit   int

	window  chan struct{}
	futures chan jetstream.PubAckFuture
	done    chan struct{}

	mu     sync.Mutex
	seq    uint64
	final  bool
	closed bool
	err    error
	onFail func(error)
}

func newPublisher(w *Worker, run string, attempt int, onFail func(error)) *publisher {
	n := w.cfg.PublishWindow
	p := &publisher{
		w: w, run: run, attempt: attempt,
		subject: w.names.Events(run), record: w.names.Record(run),
		limit:   int(w.maxPayload()) - envelopeHeadroom,
		window:  make(chan struct{}, n),
		futures: make(chan jetstream.PubAckFuture, n),
		done:    make(chan struct{}),
		onFail:  onFail,
	}
	go p.ackLoop()
	return p
}

func (p *publisher) ackLoop() {
	defer close(p.done)
	for f := range p.futures {
		select {
		case <-f.Ok():
			if f.Msg().Subject == p.subject { // not the record writes
				p.w.obs.EventPublished()
			}
		case err := <-f.Err():
			p.fail(fmt.Errorf("publish to %s: %w", f.Msg().Subject, err))
		}
		<-p.window
	}
}

func (p *publisher) fail(err error) {
	p.mu.Lock()
	first := p.err == nil
	if first {
		p.err = err
	}
	p.mu.Unlock()
	if first {
		p.w.obs.PublishFailed(err)
		if p.onFail != nil {
			p.onFail(err)
		}
	}
}

// acquire takes a window slot; block=false gives up at once when full.
func (p *publisher) acquire(block bool) bool {
	select {
	case p.window <- struct{}{}:
		return true
	default:
	}
	if !block {
		return false
	}
	start := time.Now()
	p.window <- struct{}{}
	p.w.obs.PublishWait(time.Since(start))
	return true
}

// event publishes one encoded event and returns its seq.
func (p *publisher) event(typ string, event []byte, controlSeq uint64) (uint64, error) {
	p.acquire(true)
	p.mu.Lock()
	if p.err != nil || p.closed {
		err := p.err
		p.mu.Unlock()
		<-p.window
		if err == nil {
			err = errPublisherClosed
		}
		return 0, err
	}
	seq := p.seq + 1
	data := bus.AppendEnvelope(make([]byte, 0, len(event)+160), p.run, seq, p.attempt, p.w.id, time.Now().UnixMilli(), controlSeq, event)
	if len(data) > p.limit {
		p.mu.Unlock()
		<-p.window
		return 0, &EventTooLargeError{Type: typ, Size: len(data), Limit: p.limit}
	}
	m := &nats.Msg{Subject: p.subject, Data: data, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, bus.MsgID(p.run, p.attempt, seq))
	f, err := p.w.js.PublishMsgAsync(m)
	if err != nil {
		p.mu.Unlock()
		<-p.window
		err = fmt.Errorf("publish to %s: %w", p.subject, err)
		p.fail(err)
		return 0, err
	}
	p.seq = seq
	p.futures <- f // never blocks: each future holds a window slot
	p.mu.Unlock()
	return seq, nil
}

// fleetEvent encodes and publishes a fleet event (run_started, ...).
func (p *publisher) fleetEvent(typ string, v any) (uint64, error) {
	data, err := encodeJSON(v)
	if err != nil {
		return 0, err
	}
	return p.event(typ, data, 0)
}

// putRecord writes the run record. A final write is the last: later
// writes (a late heartbeat) are dropped. With block=false the write is
// skipped when the window is full.
func (p *publisher) putRecord(rec *bus.RunRecord, final, block bool) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if !p.acquire(block) {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.final || p.closed || p.err != nil {
		<-p.window
		return p.err
	}
	p.final = final
	f, err := p.w.js.PublishAsync(p.record, data)
	if err != nil {
		<-p.window
		return err
	}
	p.futures <- f
	return nil
}

// flush waits until every publish is acked (or ctx is done) and closes
// the publisher. It returns the first publish error.
func (p *publisher) flush(ctx context.Context) error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.futures)
	}
	p.mu.Unlock()
	select {
	case <-p.done:
	case <-ctx.Done():
		return fmt.Errorf("waiting for event acks: %w", ctx.Err())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func encodeJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}
