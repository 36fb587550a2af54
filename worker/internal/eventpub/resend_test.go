package eventpub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/netsplit"
)

// Protocol 1.4: the agent's events carry no message id, so a re-send must
// not store what is stored already, and must not take a copy for a
// reorder. These tests lose chosen acks on a real stream.

// dropAcks routes the worker's acks through drop: an ack of an event whose
// seq it returns true for is lost.
func dropAcks(t *testing.T, w *testWorker, drop func(seq uint64) bool) {
	t.Helper()
	routeAcks(t, w, func(m *nats.Msg) *nats.Msg {
		var seq uint64
		if i := strings.LastIndexByte(m.Subject, '.'); i >= 0 {
			_, _ = fmt.Sscan(m.Subject[i+1:], &seq)
		}
		if drop(seq) {
			return nil
		}
		return m
	})
}

// routeAcks routes the worker's acks through pass: what it returns (nil:
// nothing) reaches the worker.
func routeAcks(t *testing.T, w *testWorker, pass func(*nats.Msg) *nats.Msg) {
	t.Helper()
	if err := w.acks.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	sub, err := w.c.Conn().Subscribe(w.acks.prefix+"*.*", func(m *nats.Msg) {
		if m := pass(m); m != nil {
			w.acks.route(m)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	w.acks.sub = sub
	if err := w.c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
}

// publishN publishes run_started and n-1 agent events.
func publishN(t *testing.T, p *Publisher, n int) {
	t.Helper()
	if _, err := p.Event(bus.EventRunStarted, []byte(`{"type":"run_started","attempt":1}`), Options{}); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= n; i++ {
		if _, err := p.Event("x", fmt.Appendf(nil, `{"type":"x","i":%d}`, i), Options{}); err != nil {
			t.Fatal(err)
		}
	}
}

// storedSeqs returns the seqs stored on the run's subject, in stream order.
func storedSeqs(t *testing.T, c *bus.Client, run string) []uint64 {
	t.Helper()
	// Only a guard against a hang: reading 300 events of 100 KiB each took
	// over 20 s on a loaded machine under -race ("events of ...: context
	// deadline exceeded").
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	envs, err := c.ReadEvents(ctx, run, 0)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, e := range envs {
		seqs = append(seqs, e.Seq)
	}
	return seqs
}

// flushWithin flushes p, failing after 3 minutes: the lost-answers tests
// re-send hundreds of events one round trip each, and a loaded machine
// (two busy loops, the suite and a 100,000-run bench beside it) took more
// than 20 s for 300.
func flushWithin(t *testing.T, p *Publisher) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return p.Flush(ctx)
}

// Acks lost after the events were stored: the re-send learns what is
// stored and stores nothing twice, the first event (with its message id)
// included. One ack lost while the later ones came is neither a copy nor a
// reorder (re-sent blindly without a message id, event 2 was stored again
// after 4, and that copy's ack failed the attempt as stored out of order).
func TestLostAcksStoreNothingTwice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		n    int
		lost func(seq uint64) bool
	}{
		{"one ack lost", 4, func(seq uint64) bool { return seq == 2 }},
		{"every ack lost", 5, func(uint64) bool { return true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, c := startInternal(t, testConfig{NoEventBatches: true, PublishAckTimeout: 300 * time.Millisecond}, nil)
			dropAcks(t, w, tc.lost)
			run := bus.NewRunID()
			p := newPublisher(w, run, 1, nil)
			publishN(t, p, tc.n)
			if err := flushWithin(t, p); err != nil {
				t.Fatalf("flush: %v", err)
			}
			want := make([]uint64, tc.n)
			for i := range want {
				want[i] = uint64(i + 1)
			}
			if got := storedSeqs(t, c, run); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("stored %v, want %v", got, want)
			}
		})
	}
}

// A copy of an event on the subject (an original that landed late, after
// an earlier re-send had stored the event) is skipped when the re-send
// reads the subject, the next re-sent event is stored after it (the last
// sequence read), and readers take each seq once. (Here the copy lands
// before the read; one landing after it is what readers' seq rule is for.)
func TestLateOriginalIsSkippedAsACopy(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{NoEventBatches: true, PublishAckTimeout: 300 * time.Millisecond}, nil)
	run := bus.NewRunID()
	p := newPublisher(w, run, 1, nil)
	dropAcks(t, w, func(seq uint64) bool { return seq == 2 })
	publishN(t, p, 2)
	storedOn(t, c, w.names.Events(run), 2)
	// When event 2's re-send comes, a copy of it lands first, and event 3
	// comes: it is held behind the re-send.
	var copied atomic.Bool
	w.wire.onResend(func(seq uint64) {
		if seq != 2 || copied.Swap(true) {
			return
		}
		p.mu.Lock()
		data := p.queue[0].m.Data
		p.mu.Unlock()
		if _, err := c.JetStream().Publish(context.Background(), p.subject, data); err != nil {
			t.Error(err)
		}
		if _, err := p.Event("x", []byte(`{"type":"x","i":3}`), Options{}); err != nil {
			t.Error(err)
		}
	})
	// The ack timeout starts the re-send; sync, unlike flush, lets event 3
	// come meanwhile.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sent := func() uint64 {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.seq
	}
	for !copied.Load() || sent() < 3 {
		if err := p.Sync(ctx); err != nil {
			t.Fatalf("sync: %v", err)
		}
	}
	if err := flushWithin(t, p); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if got := fmt.Sprint(storedSeqs(t, c, run)); got != "[1 2 2 3]" {
		t.Fatalf("stored %s, want [1 2 2 3] (event 3 after the copy)", got)
	}
	envs, err := c.ReadEvents(ctx, run, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr := &bus.Transcript{}
	var taken []uint64
	for _, e := range envs {
		before := tr.LastSeq
		if err := tr.Apply(e); err != nil {
			t.Fatal(err)
		}
		if tr.LastSeq != before {
			taken = append(taken, e.Seq)
		}
	}
	if fmt.Sprint(taken) != "[1 2 3]" {
		t.Fatalf("a reader took %v, want [1 2 3]", taken)
	}
}

// An event lost while a later one was stored is a real reorder: the
// attempt fails (the next resumes from what is stored).
func TestLostEventBeforeAStoredOneFails(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{NoEventBatches: true, PublishAckTimeout: 300 * time.Millisecond}, nil)
	dropAcks(t, w, func(seq uint64) bool { return seq >= 2 })
	run := bus.NewRunID()
	failed := make(chan error, 1)
	p := newPublisher(w, run, 1, func(err error) { failed <- err })
	var deleted bool
	w.wire.onResend(func(seq uint64) {
		if seq != 2 || deleted {
			return
		}
		deleted = true
		// Event 2 never made it; 3 did.
		s, err := c.Stream(context.Background(), w.names.EventsStream())
		if err == nil {
			err = s.DeleteMsg(context.Background(), 2)
		}
		if err != nil {
			t.Error(err)
		}
	})
	publishN(t, p, 3)
	err := flushWithin(t, p)
	if !errors.Is(err, errOutOfOrder) {
		t.Fatalf("flush: %v, want errOutOfOrder", err)
	}
	if got := <-failed; !errors.Is(got, errOutOfOrder) {
		t.Fatalf("onFail: %v", got)
	}
}

// A newer attempt's event on the subject fails a re-sending attempt (it
// was fenced): its re-send stores nothing after the newer one's.
func TestResendFindsANewerAttempt(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{NoEventBatches: true, PublishAckTimeout: 300 * time.Millisecond}, nil)
	dropAcks(t, w, func(seq uint64) bool { return seq >= 2 })
	run := bus.NewRunID()
	failed := make(chan error, 1)
	p := newPublisher(w, run, 1, func(err error) { failed <- err })
	publishN(t, p, 2)
	storedOn(t, c, w.names.Events(run), 2)
	newer := (&bus.Envelope{Run: run, Seq: 1, Attempt: 2, Worker: "other", TS: 1, Event: []byte(`{"type":"run_started","attempt":2}`)}).AppendJSON(nil)
	if _, err := c.JetStream().Publish(context.Background(), p.subject, newer); err != nil {
		t.Fatal(err)
	}
	// The ack timeout starts the re-send of event 2.
	if err := flushWithin(t, p); !errors.Is(err, errSuperseded) {
		t.Fatalf("flush: %v, want errSuperseded", err)
	}
	<-failed
	if got := fmt.Sprint(storedSeqs(t, c, run)); got != "[1 2 1]" {
		t.Fatalf("stored %s, want [1 2 1] (nothing after the newer attempt's run_started)", got)
	}
}

// A re-send waiting for its answer ends when the attempt is fenced: the
// lost lease does not wait out the ack timeout (a minute here).
func TestFenceEndsAResendWaitingForItsAck(t *testing.T) {
	t.Parallel()
	w, srv := startOwnServer(t, testConfig{NoEventBatches: true, PublishAckTimeout: time.Minute})
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	p.subject = "plain." + p.run // a subscriber that never answers
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync(p.subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Event("x", []byte(`{"type":"x"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.startResendLocked(nats.ErrDisconnected)
	p.mu.Unlock()
	for {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no re-send: %v", err)
		}
		if !strings.HasPrefix(m.Reply, w.acks.prefix) {
			break // the re-send's request
		}
	}
	done := make(chan struct{})
	go func() {
		p.Abandon()
		close(done)
	}()
	within(t, done, 10*time.Second, "abandon with a re-send waiting for its ack")
}

// A re-send whose answer never comes (a leader election, a server that
// died mid-request) is tried again within the retry budget (AckWait), not
// failed at once.
func TestResendWithoutAnAnswerIsTriedAgain(t *testing.T) {
	t.Parallel()
	w, srv := startOwnServer(t, testConfig{NoEventBatches: true, PublishAckTimeout: 300 * time.Millisecond, AckWait: 20 * time.Second})
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	p.subject = "plain." + p.run
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var n atomic.Int32
	if _, err := nc.Subscribe(p.subject, func(m *nats.Msg) {
		if m.Reply == "" || strings.HasPrefix(m.Reply, w.acks.prefix) {
			return
		}
		if n.Add(1) == 1 {
			return // the first re-send's answer is lost
		}
		_ = m.Respond([]byte(`{"stream":"PLAIN","seq":7}`))
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Event("x", []byte(`{"type":"x"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	if err := flushWithin(t, p); err != nil {
		t.Fatalf("flush after one unanswered re-send (of %d): %v", n.Load(), err)
	}
}

// Event 2 lost, event 3 stored and acknowledged: the re-send finds 3
// stored without 2 and fails the attempt before it stores 2 after 3.
func TestLostEventBeforeAnAcknowledgedOneIsNotStoredAfterIt(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{NoEventBatches: true, PublishAckTimeout: 300 * time.Millisecond}, nil)
	dropAcks(t, w, func(seq uint64) bool { return seq == 2 })
	run := bus.NewRunID()
	p := newPublisher(w, run, 1, nil)
	var deleted atomic.Bool
	w.wire.onResend(func(seq uint64) {
		if seq != 2 || deleted.Swap(true) {
			return
		}
		s, err := c.Stream(context.Background(), w.names.EventsStream())
		if err == nil {
			err = s.DeleteMsg(context.Background(), 2)
		}
		if err != nil {
			t.Error(err)
		}
	})
	publishN(t, p, 3)
	if err := flushWithin(t, p); !errors.Is(err, errOutOfOrder) {
		t.Fatalf("flush: %v, want errOutOfOrder", err)
	}
	if got := fmt.Sprint(storedSeqs(t, c, run)); got != "[1 3]" {
		t.Fatalf("stored %s, want [1 3] (event 2 not stored after 3)", got)
	}
}

// The subject lost its last acknowledged message (limits, an operator's
// delete): the re-send takes the last it read, and neither spins nor
// fails.
func TestResendAfterTheLastStoredWasRemoved(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{NoEventBatches: true, PublishAckTimeout: 300 * time.Millisecond, AckWait: 5 * time.Second}, nil)
	run := bus.NewRunID()
	p := newPublisher(w, run, 1, nil)
	publishN(t, p, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := c.Stream(ctx, w.names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, 3); err != nil {
		t.Fatal(err)
	}
	dropAcks(t, w, func(seq uint64) bool { return seq == 4 })
	var tries atomic.Int64
	w.wire.onResend(func(uint64) {
		if tries.Add(1) == 1 {
			if err := s.DeleteMsg(context.Background(), 4); err != nil {
				t.Error(err)
			}
		}
	})
	if _, err := p.Event("x", []byte(`{"type":"x","i":4}`), Options{}); err != nil {
		t.Fatal(err)
	}
	if err := flushWithin(t, p); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if n := tries.Load(); n > 5 {
		t.Errorf("%d re-sends of one event: the re-send spun", n)
	}
	if got := fmt.Sprint(storedSeqs(t, c, run)); got != "[1 2 4]" {
		t.Fatalf("stored %s, want [1 2 4]", got)
	}
}

type publishedHook struct {
	nopMetrics
	on func()
}

func (h *publishedHook) EventPublished() { h.on() }

// The queue empties under a re-send (which clears its budget) and a new
// event comes before the re-send looks again, then NATS goes away: the
// new event's re-send still fails once its budget (AckWait) is spent.
func TestResendBudgetHoldsAfterTheQueueEmptied(t *testing.T) {
	t.Parallel()
	c, srv := startTestServer(t)
	var pub atomic.Pointer[Publisher]
	var once atomic.Bool
	hook := &publishedHook{on: func() {
		p := pub.Load()
		if p == nil || once.Swap(true) {
			return
		}
		if _, err := p.Event("x", []byte(`{"type":"x"}`), Options{}); err != nil {
			t.Error(err)
		}
		srv.Shutdown()
	}}
	w, _ := startInternalOn(t, c, testConfig{AckWait: 2 * time.Second, PublishAckTimeout: time.Minute},
		func(w *testWorker) { w.obs = hook })
	failed := make(chan error, 1)
	p := newPublisher(w, bus.NewRunID(), 1, func(err error) { failed <- err })
	p.subject = "plain." + p.run
	got := sentSeqs(t, w, srv.URL(), p.subject)
	// The first send's ack never comes: the re-send's own answer pops the
	// event, in the re-send goroutine, so the hook's new event comes before
	// it looks again (an ack callback's pop raced it, and the re-send could
	// end first: the new event then went out plainly, without a budget).
	dropAcks(t, w, func(seq uint64) bool { return seq == 1 })
	if _, err := p.Event("x", []byte(`{"type":"x"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	got(1)
	pub.Store(p)
	p.mu.Lock()
	p.startResendLocked(nats.ErrDisconnected)
	p.mu.Unlock()
	select {
	case err := <-failed:
		if !strings.Contains(err.Error(), "not stored within 2s") {
			t.Fatalf("failed with %v", err)
		}
	case <-time.After(15 * time.Second):
		p.mu.Lock()
		t.Errorf("not failed 15s after NATS went away with a 2s budget: hook ran %v, queue %d, resending %v, retryStart zero %v",
			once.Load(), len(p.queue), p.resending, p.retryStart.IsZero())
		p.mu.Unlock()
	}
	p.Abandon()
}

// An overloaded server drops what its stream's ingest queue cannot take
// and answers 429 "too many requests": the event is re-sent after a pause,
// not the run handed back (every run of a loaded worker was, at once, and
// their resumes kept the server overloaded).
func TestTooManyRequestsIsReSent(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{}, nil)
	var answered atomic.Int32
	routeAcks(t, w, func(m *nats.Msg) *nats.Msg {
		if answered.Add(1) == 1 { // the stored first event's ack, as the overloaded server's answer
			return &nats.Msg{Subject: m.Subject, Data: []byte(`{"error":{"code":429,"err_code":10167,"description":"too many requests"},"stream":"x"}`)}
		}
		return m
	})
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	storeTen(t, c, p)
}

// A worker's re-sends read what the stream holds a few at a time
// (MaxStoredReads): with every slot taken, a re-send refused for what is
// stored reads nothing and waits, then goes on once a slot is free.
func TestStoredReadsWaitForASlot(t *testing.T) {
	t.Parallel()
	waits := make(chan uint64, 16)
	var pub atomic.Pointer[Publisher] // the only one: its re-sends read
	w, c := startInternal(t, testConfig{NoEventBatches: true, PublishAckTimeout: 300 * time.Millisecond}, func(w *testWorker) {
		w.slots.acquire = func() {
			p := pub.Load()
			p.mu.Lock()
			o, _ := p.firstUnackedLocked()
			p.mu.Unlock()
			waits <- o.seq
		}
	})
	for range cap(w.storedReads) {
		w.storedReads <- struct{}{}
	}
	dropAcks(t, w, func(uint64) bool { return true })
	run := bus.NewRunID()
	p := newPublisher(w, run, 1, nil)
	pub.Store(p)
	publishN(t, p, 3)
	flushed := make(chan error, 1)
	go func() { flushed <- flushWithin(t, p) }()
	// The same event twice: the first read waited out its wait unread.
	first := within(t, waits, 20*time.Second, "a re-send reading the stored events")
	if again := within(t, waits, 20*time.Second, "a second read"); again != first {
		t.Fatalf("event %d read for, then event %d: a read was made with every slot taken", first, again)
	}
	for range cap(w.storedReads) {
		<-w.storedReads
	}
	go func() {
		for range waits { // later reads, now with slots
		}
	}()
	if err := <-flushed; err != nil {
		t.Fatalf("flush: %v", err)
	}
	close(waits)
	if got := fmt.Sprint(storedSeqs(t, c, run)); got != "[1 2 3]" {
		t.Fatalf("stored %s, want [1 2 3]", got)
	}
}

// A re-send's read of what the stream holds (reconcile) goes on the
// connection of the re-send's epoch: lost, the read ends at once and the
// re-send goes on; it used to wait out its whole time (PublishAckTimeout,
// longer than a short AckWait's budget).
func TestReconcileEndsWithItsConnection(t *testing.T) {
	t.Parallel()
	_, srv := startTestServer(t)
	part := netsplit.Start(t, srv.NATS().Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wc := part.Connect(ctx, t)
	w, _ := startInternalOn(t, wc, testConfig{}, nil)
	p := newPublisher(w, "r1", 1, nil)
	defer p.Abandon()
	_, sentIn := w.acks.currentWithContext()
	part.Stall()
	go func() {
		<-part.Swallowed() // the read went nowhere
		part.Cut()
	}()
	_, err := p.reconcile(ctx, sentIn, 0, time.Minute)
	if !errors.Is(err, nats.ErrDisconnected) {
		t.Fatalf("reconcile: %v, want it ended by the lost connection", err)
	}
	part.Unstall()
	part.Heal()
	netsplit.WaitStatus(t, wc.Conn(), nats.CONNECTED)
}
