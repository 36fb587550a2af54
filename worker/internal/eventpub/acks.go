package eventpub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Acks takes the JetStream acks of every publisher of a worker on one
// subscription and applies each to its publisher (doc.go: Acks).
type Acks struct {
	nc      *nats.Conn
	prefix  string // <inbox>.
	sub     *nats.Subscription
	timeout time.Duration
	now     chan struct{} // sweep at once

	statusMu    sync.Mutex
	status      chan nats.Status // the connection's losses, not counted yet
	epoch       uint64           // the losses counted
	epochCtx    context.Context  // ends (errConnectionLost) when the next loss is counted
	endEpochCtx context.CancelCauseFunc

	// highest is the highest stream sequence of an event ack seen: the
	// floor of every event sent after (batch.go).
	highest atomic.Uint64

	mu   sync.Mutex
	next uint64
	pubs map[uint64]*Publisher

	stop chan struct{}
	done chan struct{} // the sweep has stopped
}

const sweepEvery = 100 * time.Millisecond

// StartAcks subscribes to the acks of the publishers to come and starts
// their sweep; an event unacknowledged for timeout is re-sent. Close
// stops it, once the publishers are done.
func StartAcks(nc *nats.Conn, timeout time.Duration) (*Acks, error) {
	a := &Acks{
		nc: nc, prefix: nc.NewInbox() + ".", timeout: timeout,
		pubs: map[uint64]*Publisher{}, now: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	sub, err := nc.Subscribe(a.prefix+"*.*", a.route)
	if err != nil {
		return nil, fmt.Errorf("event ack subscription: %w", err)
	}
	sub.SetPendingLimits(-1, 64<<20)
	a.sub = sub
	a.status = nc.StatusChanged(nats.RECONNECTING, nats.DISCONNECTED)
	a.epochCtx, a.endEpochCtx = context.WithCancelCause(context.Background())
	go a.sweep()
	return a, nil
}

// Close stops the sweep, the status listener and the subscription.
func (a *Acks) Close() {
	close(a.stop)
	<-a.done
	a.nc.RemoveStatusListener(a.status)
	_ = a.sub.Unsubscribe()
	a.statusMu.Lock()
	a.endEpochCtx(errAcksClosed) // not a loss: nothing re-sends for it
	a.statusMu.Unlock()
}

// errConnectionLost ends an epoch's context: the connection was lost.
var errConnectionLost = errors.New("NATS connection lost")

// errAcksClosed ends the last epoch's context when the acks close: the
// worker is stopping, so a re-send bound to it gives up instead of retrying.
var errAcksClosed = errors.New("event acks closed")

// lostSince reports whether the connection was lost since the epoch
// whose context is sentIn.
func lostSince(sentIn context.Context) bool {
	return errors.Is(context.Cause(sentIn), errConnectionLost)
}

// current returns the epoch: the connection's losses so far, those just
// put into the status channel counted first. A new loss has the sweep
// look at once.
func (a *Acks) current() uint64 {
	epoch, _ := a.currentWithContext()
	return epoch
}

// currentWithContext is current with the epoch's context (see the
// invariants).
func (a *Acks) currentWithContext() (uint64, context.Context) {
	a.statusMu.Lock()
	defer a.statusMu.Unlock()
	lost := false
	for len(a.status) > 0 {
		if _, ok := <-a.status; !ok {
			break // closed by close
		}
		a.epoch++
		lost = true
	}
	if lost {
		a.endEpochCtx(errConnectionLost)
		a.epochCtx, a.endEpochCtx = context.WithCancelCause(context.Background())
		select {
		case a.now <- struct{}{}:
		default:
		}
	}
	return a.epoch, a.epochCtx
}

// add registers a publisher and returns the head of its reply subjects.
func (a *Acks) add(p *Publisher) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.next++
	a.pubs[a.next] = p
	p.ackID = a.next
	return a.prefix + strconv.FormatUint(a.next, 10) + "."
}

func (a *Acks) remove(id uint64) {
	a.mu.Lock()
	delete(a.pubs, id)
	a.mu.Unlock()
}

// route is the subscription's callback.
func (a *Acks) route(m *nats.Msg) {
	rest, ok := cutPrefix(m.Subject, a.prefix)
	if !ok {
		return
	}
	dot := -1
	for i := 0; i < len(rest); i++ {
		if rest[i] == '.' {
			dot = i
			break
		}
	}
	if dot < 0 {
		return
	}
	id, err1 := strconv.ParseUint(rest[:dot], 10, 64)
	seq, err2 := strconv.ParseUint(rest[dot+1:], 10, 64)
	if err1 != nil || err2 != nil {
		return
	}
	a.mu.Lock()
	p := a.pubs[id]
	a.mu.Unlock()
	if p == nil {
		return
	}
	stream, dup, err := parsePubAck(m)
	if err == nil {
		a.sawStream(stream)
	}
	p.ackArrived(seq, stream, dup, err)
}

// sawStream records the stream sequence of an ack.
func (a *Acks) sawStream(seq uint64) {
	for {
		h := a.highest.Load()
		if seq <= h || a.highest.CompareAndSwap(h, seq) {
			return
		}
	}
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || s[:len(prefix)] != prefix {
		return "", false
	}
	return s[len(prefix):], true
}

// sweep finds events whose acks were lost: to a reconnect, or to time.
func (a *Acks) sweep() {
	defer close(a.done)
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	var pubs []*Publisher
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		case <-a.now:
		}
		epoch := a.current()
		a.mu.Lock()
		for _, p := range a.pubs {
			pubs = append(pubs, p)
		}
		a.mu.Unlock()
		now := time.Now()
		for i, p := range pubs {
			p.check(now, epoch, a.timeout)
			pubs[i] = nil
		}
		pubs = pubs[:0]
	}
}

// parsePubAck reads a JetStream publish ack: the stored message's stream
// sequence and whether it was a duplicate, or the error the stream (or the
// server: no responders) answered. The common form is read by hand; any
// other goes through encoding/json.
func parsePubAck(m *nats.Msg) (uint64, bool, error) {
	data := m.Data
	if len(data) == 0 {
		if m.Header.Get("Status") == "503" {
			return 0, false, nats.ErrNoResponders
		}
		return 0, false, jetstream.ErrInvalidJSAck
	}
	if seq, dup, ok := fastPubAck(data); ok {
		return seq, dup, nil
	}
	var pa struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     uint16 `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Stream    string `json:"stream"`
		Seq       uint64 `json:"seq"`
		Duplicate bool   `json:"duplicate"`
	}
	if err := json.Unmarshal(data, &pa); err != nil {
		return 0, false, jetstream.ErrInvalidJSAck
	}
	if pa.Error != nil {
		return 0, false, &jetstream.APIError{Code: pa.Error.Code, ErrorCode: jetstream.ErrorCode(pa.Error.ErrCode), Description: pa.Error.Description}
	}
	if pa.Stream == "" || pa.Seq == 0 {
		return 0, false, jetstream.ErrInvalidJSAck
	}
	return pa.Seq, pa.Duplicate, nil
}

// fastPubAck reads {"stream":"S","seq":N} with an optional
// "domain":"D" before the seq and "duplicate": true after it, the forms
// the server writes (stream.go, processJetStreamMsg); ok is false for
// anything else.
func fastPubAck(data []byte) (seq uint64, dup, ok bool) {
	rest, found := bytes.CutPrefix(data, []byte(`{"stream":"`))
	if !found {
		return 0, false, false
	}
	i := bytes.IndexByte(rest, '"')
	if i <= 0 || !plainJSON(rest[:i]) {
		return 0, false, false
	}
	rest = rest[i+1:]
	if r, found := bytes.CutPrefix(rest, []byte(`,"domain":"`)); found {
		j := bytes.IndexByte(r, '"')
		if j < 0 || !plainJSON(r[:j]) {
			return 0, false, false
		}
		rest = r[j+1:]
	}
	rest, found = bytes.CutPrefix(rest, []byte(`,"seq":`))
	if !found {
		return 0, false, false
	}
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || n > 19 || (n > 1 && rest[0] == '0') {
		return 0, false, false
	}
	seq, err := strconv.ParseUint(string(rest[:n]), 10, 64)
	if err != nil || seq == 0 {
		return 0, false, false
	}
	switch string(rest[n:]) {
	case "}":
		return seq, false, true
	case `,"duplicate": true}`, `,"duplicate":true}`: // the server writes the first
		return seq, true, true
	}
	return 0, false, false
}

// plainJSON tells a JSON string's content that needs no unescaping.
func plainJSON(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c == '\\' {
			return false
		}
	}
	return true
}
