package eventpub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/natserr"
	"github.com/agentfleet/agentfleet/natsembed"
)

// The acks the server writes (nats-server stream.go: its pre-built
// {"stream":..,"seq": prefix, the duplicate's `, "duplicate": true}`, and
// JSPubAckResponse through encoding/json for errors and batches).
func TestParsePubAck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		data    string
		seq     uint64
		dup     bool
		errText string
		fast    bool
	}{
		{data: `{"stream":"AGENTS_EVENTS","seq":12}`, seq: 12, fast: true},
		{data: `{"stream":"AGENTS_EVENTS","seq":7,"duplicate": true}`, seq: 7, dup: true, fast: true},
		{data: `{"stream":"AGENTS_EVENTS","seq":7,"duplicate":true}`, seq: 7, dup: true, fast: true},
		{data: `{"stream":"S","domain":"hub","seq":3}`, seq: 3, fast: true},
		{data: `{"stream":"S","seq":3,"batch":"b1","count":2}`, seq: 3},
		{data: `{"stream":"S","seq":3,"val":"1"}`, seq: 3},
		{data: `{"stream":"S\"x","seq":3}`, seq: 3},
		{data: `{"error":{"code":503,"err_code":10077,"description":"stream is busy"},"stream":"S","seq":0}`, errText: "stream is busy"},
		{data: `{"stream":"S","seq":0}`, errText: "invalid jetstream publish response"},
		{data: `{"stream":"S","seq":01}`, errText: "invalid jetstream publish response"},
		{data: `not json`, errText: "invalid jetstream publish response"},
	} {
		t.Run(tc.data, func(t *testing.T) {
			_, _, fast := fastPubAck([]byte(tc.data))
			if fast != tc.fast {
				t.Errorf("fast path %v, want %v", fast, tc.fast)
			}
			seq, dup, err := parsePubAck(&nats.Msg{Data: []byte(tc.data)})
			if tc.errText != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("err %v, want %q", err, tc.errText)
				}
				return
			}
			if err != nil || seq != tc.seq || dup != tc.dup {
				t.Fatalf("got %d %v %v, want %d %v", seq, dup, err, tc.seq, tc.dup)
			}
		})
	}
	var api *jetstream.APIError
	_, _, err := parsePubAck(&nats.Msg{Data: []byte(`{"error":{"code":503,"description":"x"}}`)})
	if !errors.As(err, &api) || api.Code != 503 || !natserr.Transient(err) {
		t.Errorf("a 503 answer: %v, want a retryable APIError", err)
	}
	_, _, err = parsePubAck(&nats.Msg{Header: nats.Header{"Status": []string{"503"}}})
	if !errors.Is(err, nats.ErrNoResponders) || !natserr.Transient(err) {
		t.Errorf("no responders: %v", err)
	}
}

// Whatever the fast path accepts, encoding/json reads the same way.
func FuzzFastPubAck(f *testing.F) {
	f.Add([]byte(`{"stream":"AGENTS_EVENTS","seq":12}`))
	f.Add([]byte(`{"stream":"S","domain":"d","seq":7,"duplicate": true}`))
	f.Add([]byte(`{"stream":"S","seq":18446744073709551615}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		seq, dup, ok := fastPubAck(data)
		if !ok {
			return
		}
		var pa struct {
			Error     json.RawMessage `json:"error"`
			Stream    string          `json:"stream"`
			Seq       uint64          `json:"seq"`
			Duplicate bool            `json:"duplicate"`
		}
		if err := json.Unmarshal(data, &pa); err != nil {
			t.Fatalf("fast path took %q, encoding/json: %v", data, err)
		}
		if pa.Error != nil || pa.Stream == "" || pa.Seq != seq || pa.Duplicate != dup {
			t.Fatalf("fast path read %q as %d %v, encoding/json as %+v", data, seq, dup, pa)
		}
	})
}

// loseAcks makes the worker's acks go nowhere until the returned func
// subscribes again.
func loseAcks(t *testing.T, w *testWorker) (restore func()) {
	t.Helper()
	if err := w.acks.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := w.c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	return func() {
		sub, err := w.c.Conn().Subscribe(w.acks.prefix+"*.*", w.acks.route)
		if err != nil {
			t.Fatal(err)
		}
		w.acks.sub = sub
		if err := w.c.Conn().Flush(); err != nil {
			t.Fatal(err)
		}
	}
}

// storedOn waits until n messages are stored on subject, and fails the
// test if more are.
func storedOn(t *testing.T, c *bus.Client, subject string, n uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := c.JetStream().Stream(ctx, c.Names().EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatalf("%d stored on %s, want %d: %v", 0, subject, n, err)
		}
		got := info.State.Subjects[subject]
		if got > n {
			t.Fatalf("%d stored on %s, want %d", got, subject, n)
		}
		if got == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d stored on %s, want %d", got, subject, n)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Acks lost after the events were stored: past PublishAckTimeout the
// publisher re-sends them, the stream drops the copies, and their
// duplicate acks complete the flush. Without the re-send the flush never
// ends.
func TestLostAcksAreRecoveredByResend(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{NoEventBatches: true, PublishAckTimeout: 300 * time.Millisecond}, nil)
	restore := loseAcks(t, w)
	run := bus.NewRunID()
	failed := make(chan error, 1)
	p := newPublisher(w, run, 1, func(err error) { failed <- err })
	for i := range 5 {
		if _, err := p.Event("x", fmt.Appendf(nil, `{"type":"x","i":%d}`, i), Options{}); err != nil {
			t.Fatal(err)
		}
	}
	storedOn(t, c, w.names.Events(run), 5)
	restore()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	storedOn(t, c, w.names.Events(run), 5)
	envs, err := c.ReadEvents(ctx, run, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range envs {
		if e.Seq != uint64(i+1) {
			t.Fatalf("stored seqs out of order: %d at %d", e.Seq, i)
		}
	}
}

// An event no stream takes (answered 503) is re-sent, a pause between
// sends, until the retry budget (AckWait) is spent; then the publisher
// fails and says why.
func TestUnstoredEventFailsPastTheBudget(t *testing.T) {
	t.Parallel()
	w, _ := startInternal(t, testConfig{NoEventBatches: true, AckWait: 2 * time.Second}, nil)
	failed := make(chan error, 1)
	p := newPublisher(w, bus.NewRunID(), 1, func(err error) { failed <- err })
	p.subject = "nostream." + p.run
	// It answers each send as the server does when nothing takes it.
	var sends atomic.Int64
	sub, err := w.c.Conn().Subscribe(p.subject, func(m *nats.Msg) {
		sends.Add(1)
		_ = m.RespondMsg(&nats.Msg{Header: nats.Header{"Status": []string{"503"}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := w.c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Event("x", []byte(`{"type":"x"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = p.Flush(ctx)
	if err == nil || !strings.Contains(err.Error(), "not stored within 2s") {
		t.Fatalf("flush: %v, want not stored within 2s", err)
	}
	select {
	case got := <-failed:
		if got != err {
			t.Errorf("onFail got %v, flush %v", got, err)
		}
	case <-ctx.Done():
		t.Fatal("onFail not called")
	}
	// One send, then one re-send per resendPause at most: no loop.
	if n, limit := int(sends.Load()), int(2*time.Second/resendPause)+2; n < 2 || n > limit {
		t.Errorf("the event was sent %d times in 2s, want 2 to %d", n, limit)
	}
}

// Acks applied out of their stream order (an event lost and stored after
// a later one) fail the attempt.
func TestAcksOutOfStreamOrderFail(t *testing.T) {
	t.Parallel()
	w, _ := startInternal(t, testConfig{NoEventBatches: true}, nil)
	restore := loseAcks(t, w)
	defer restore()
	failed := make(chan error, 1)
	p := newPublisher(w, bus.NewRunID(), 1, func(err error) { failed <- err })
	for range 2 {
		if _, err := p.Event("x", []byte(`{"type":"x"}`), Options{}); err != nil {
			t.Fatal(err)
		}
	}
	p.ackArrived(2, 10, false, nil)
	p.ackArrived(1, 11, false, nil)
	select {
	case err := <-failed:
		if !errors.Is(err, errOutOfOrder) {
			t.Fatalf("got %v, want errOutOfOrder", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no failure")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Flush(ctx); !errors.Is(err, errOutOfOrder) {
		t.Fatalf("flush: %v", err)
	}
	if n := len(p.window); n != 0 {
		t.Errorf("%d window slots still held", n)
	}
}

// startOwnServer runs a worker on its own embedded server, which the test
// may shut down.
func startOwnServer(t *testing.T, cfg testConfig) (*testWorker, *natsembed.Server) {
	t.Helper()
	return startOwnServerHooked(t, cfg, nil)
}

func startOwnServerHooked(t *testing.T, cfg testConfig, hooks func(w *testWorker)) (*testWorker, *natsembed.Server) {
	t.Helper()
	c, srv := startTestServer(t)
	w, _ := startInternalOn(t, c, cfg, hooks)
	return w, srv
}

// sentSeqs subscribes to subject on a connection of its own and returns
// the seqs of the envelopes published there, in wire order. It answers a
// re-send (a request, not answered to the worker's acks subjects: one at a
// time, each waiting for its answer) as a stream would that stored it.
func sentSeqs(t *testing.T, w *testWorker, url, subject string) func(n int) []uint64 {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var mu sync.Mutex
	var seqs []uint64
	more := make(chan struct{}, 1)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		var e struct{ Seq uint64 }
		if err := json.Unmarshal(m.Data, &e); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		seqs = append(seqs, e.Seq)
		n := len(seqs)
		mu.Unlock()
		if m.Reply != "" && !strings.HasPrefix(m.Reply, w.acks.prefix) {
			_ = m.Respond(fmt.Appendf(nil, `{"stream":"PLAIN","seq":%d}`, 100+n))
		}
		select {
		case more <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	_ = sub
	return func(n int) []uint64 {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			mu.Lock()
			got := slices.Clone(seqs)
			mu.Unlock()
			if len(got) >= n {
				return got
			}
			select {
			case <-more:
			case <-deadline:
				t.Fatalf("after %v: nothing more within 10s", got)
			}
		}
	}
}

// An event published right after a reconnect does not overtake an
// earlier one whose ack the lost connection took with it: it waits, and
// goes out once the earlier one's re-send is stored.
func TestNewEventDoesNotOvertakeAfterReconnect(t *testing.T) {
	t.Parallel()
	w, srv := startOwnServer(t, testConfig{NoEventBatches: true, PublishAckTimeout: time.Minute})
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	p.subject = "plain." + p.run // a subscriber, no stream: no ack ever
	got := sentSeqs(t, w, srv.URL(), p.subject)
	if _, err := p.Event("x", []byte(`{"type":"x"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	got(1)
	nc := w.c.Conn()
	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !nc.IsConnected(); {
		if time.Now().After(deadline) {
			t.Fatal("not reconnected")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := p.Event("x", []byte(`{"type":"x"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	if seqs := got(3); fmt.Sprint(seqs) != "[1 1 2]" {
		t.Fatalf("on the wire: %v, want [1 1 2] (event 1 again before event 2)", seqs)
	}
	p.Abandon()
}

// While a re-send waits for NATS, an ack that comes meanwhile starts the
// retry budget again but does not turn it off.
func TestResendBudgetHoldsAfterAnAckMeanwhile(t *testing.T) {
	t.Parallel()
	failed := make(chan error, 1)
	p := resendingWithoutNATS(t, func(err error) { failed <- err })
	p.ackArrived(1, 10, false, nil)
	select {
	case err := <-failed:
		if !strings.Contains(err.Error(), "not stored within 2s") {
			t.Fatalf("failed with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the publisher waits for NATS past its budget")
	}
	p.Abandon()
}

// A re-send waiting for NATS ends when the acks of everything it held
// came meanwhile: the publisher flushes without error.
func TestResendEndsWhenEverythingIsAcked(t *testing.T) {
	t.Parallel()
	p := resendingWithoutNATS(t, nil)
	p.ackArrived(1, 10, false, nil)
	p.ackArrived(2, 11, false, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	// Nothing waits: a later failure gets a whole budget of its own.
	p.mu.Lock()
	rs := p.retryStart
	p.mu.Unlock()
	if !rs.IsZero() {
		t.Errorf("the retry budget still runs from %s", rs)
	}
}

// A fenced attempt sends nothing more, also from a re-send in progress.
func TestFenceStopsAResendInProgress(t *testing.T) {
	t.Parallel()
	var p *Publisher
	w, srv := startOwnServer(t, testConfig{NoEventBatches: true, PublishAckTimeout: time.Minute})
	p = newPublisher(w, bus.NewRunID(), 1, nil)
	p.subject = "plain." + p.run
	got := sentSeqs(t, w, srv.URL(), p.subject)
	for range 3 {
		if _, err := p.Event("x", []byte(`{"type":"x"}`), Options{}); err != nil {
			t.Fatal(err)
		}
	}
	got(3)
	fenced := make(chan struct{})
	w.wire.onResend(func(seq uint64) {
		if seq == 2 {
			// The lease is lost while the re-send publishes: its request
			// ends, unsent.
			p.Fence()
			close(fenced)
		}
	})
	p.mu.Lock()
	p.startResendLocked(nats.ErrDisconnected)
	p.mu.Unlock()
	within(t, fenced, 10*time.Second, "the re-send")
	p.Abandon()
	// A marker after the re-send has ended: on one connection, the order
	// of the wire.
	if err := w.c.Conn().Publish(p.subject, []byte(`{"seq":99}`)); err != nil {
		t.Fatal(err)
	}
	if seqs := got(5); fmt.Sprint(seqs) != "[1 2 3 1 99]" {
		t.Fatalf("on the wire: %v, want [1 2 3 1 99] (nothing after the fence)", seqs)
	}
}

// resendingWithoutNATS returns a publisher (AckWait 2s) whose two events
// went out unacknowledged and whose re-send waits for a server that is
// gone.
func resendingWithoutNATS(t *testing.T, onFail func(error)) *Publisher {
	t.Helper()
	w, srv := startOwnServer(t, testConfig{NoEventBatches: true, AckWait: 2 * time.Second})
	p := newPublisher(w, bus.NewRunID(), 1, onFail)
	p.subject = "plain." + p.run
	got := sentSeqs(t, w, srv.URL(), p.subject)
	for range 2 {
		if _, err := p.Event("x", []byte(`{"type":"x"}`), Options{}); err != nil {
			t.Fatal(err)
		}
	}
	got(2)
	srv.Shutdown()
	waitResending(t, p)
	return p
}

func waitResending(t *testing.T, p *Publisher) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		p.mu.Lock()
		r := p.resending
		p.mu.Unlock()
		if r {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no re-send started")
		}
		time.Sleep(time.Millisecond)
	}
}

// In a cluster the stream answers a copy of an event it is still storing
// with 409 "duplicate message id is in process": the original's ack comes
// to the same reply subject, so the answer neither fails the attempt nor
// pops the event.
func TestDuplicateInProcessIsNotAFailure(t *testing.T) {
	t.Parallel()
	w, _ := startInternal(t, testConfig{NoEventBatches: true}, nil)
	restore := loseAcks(t, w)
	defer restore()
	failed := make(chan error, 1)
	p := newPublisher(w, bus.NewRunID(), 1, func(err error) { failed <- err })
	if _, err := p.Event("x", []byte(`{"type":"x"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	_, _, inProcess := parsePubAck(&nats.Msg{Data: []byte(`{"error":{"code":409,"err_code":10158,"description":"duplicate message id is in process"},"stream":"AGENTS_EVENTS","seq":0}`)})
	p.ackArrived(1, 0, false, inProcess)
	p.mu.Lock()
	n, err := len(p.queue), p.err
	p.mu.Unlock()
	if n != 1 || err != nil {
		t.Fatalf("after the 409: %d queued, err %v", n, err)
	}
	p.ackArrived(1, 5, false, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	select {
	case err := <-failed:
		t.Fatalf("failed: %v", err)
	default:
	}
}

// The ack callback never waits for a publish in progress (one blocked on
// a full socket, or on a reconnect's handshake): it takes only the
// publisher's state lock.
func TestAckDoesNotWaitForAPublish(t *testing.T) {
	t.Parallel()
	w, _ := startInternal(t, testConfig{NoEventBatches: true}, nil)
	restore := loseAcks(t, w)
	defer restore()
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	if _, err := p.Event("x", []byte(`{"type":"x"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	p.sendMu.Lock() // a publish in progress
	applied := make(chan struct{})
	go func() {
		p.ackArrived(1, 5, false, nil)
		close(applied)
	}()
	select {
	case <-applied:
	case <-time.After(10 * time.Second):
		t.Fatal("the ack waited for the publish")
	}
	p.sendMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// Closing the acks ends the epoch's context as no loss: a re-send bound
// to it is not told its connection was lost (it would send again and
// again until its budget ran out).
func TestClosedAcksAreNoLostConnection(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	a, err := StartAcks(c.Conn(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, sentIn := a.currentWithContext()
	a.Close()
	if sentIn.Err() == nil || lostSince(sentIn) {
		t.Fatalf("after close: ended %v, lost %v; want ended, not lost", sentIn.Err(), lostSince(sentIn))
	}
}
