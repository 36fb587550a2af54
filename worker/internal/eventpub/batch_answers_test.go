package eventpub

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/agentfleet/agentfleet/bus"
)

// Batch answers lost: the publishers' ack timeout re-sends what is
// unacknowledged, expecting the subject's last message where it is only
// known as a floor; the stream refuses, the re-send reads what is stored,
// and nothing is stored twice.
func TestLostBatchAnswersStoreNothingTwice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		n    uint64
		drop func(data []byte) bool
	}{
		{"every answer", 20, func([]byte) bool { return true }},
		// 300 events: a flow ack at 256 messages comes.
		{"the commit ack", 300, func(d []byte) bool { return !strings.HasPrefix(string(d), `{"type":`) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, c := startInternal(t, testConfig{PublishAckTimeout: 300 * time.Millisecond}, nil)
			holdBatches(t, w)
			if err := w.batch.sub.Unsubscribe(); err != nil {
				t.Fatal(err)
			}
			sub, err := w.c.Conn().Subscribe(w.batch.prefix+">", func(m *nats.Msg) {
				if !tc.drop(m.Data) {
					w.batch.route(m)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			w.batch.sub = sub
			p := newPublisher(w, bus.NewRunID(), 1, nil)
			publishN(t, p, int(tc.n))
			if err := flushWithin(t, p); err != nil {
				t.Fatal(err)
			}
			if got, want := fmt.Sprint(storedSeqs(t, c, p.run)), fmt.Sprint(seqsTo(tc.n)); got != want {
				t.Fatalf("stored %s, want %s", got, want)
			}
		})
	}
}

// waitNoHolds waits until no ended batch holds a publisher: every hold
// is released once its batch's answers are dispatched.
func waitNoHolds(t *testing.T, w *testWorker) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		w.batch.mu.Lock()
		n, counted := len(w.batch.held), w.batch.nheld.Load()
		w.batch.mu.Unlock()
		if counted != int64(n) {
			t.Fatalf("%d publishers held, %d counted", n, counted)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d publishers still held by ended batches", n)
		}
		time.Sleep(5 * time.Millisecond) // polls the state itself
	}
}

// An event that passed its publisher's checks before the stream's answer
// came, and reaches the batch after the answers were dispatched and the
// ended batch's hold was released, is held all the same: the publisher
// already knows its predecessor was not stored. (It opened a new batch and
// was stored first; a review's scratch test, and one
// TestRefusedEventInABatchIsReSentForTheOthers run in 25.)
func TestEventPastItsChecksWaitsForTheResend(t *testing.T) {
	t.Parallel()
	w, _ := startInternal(t, testConfig{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The stream's answers are kept until the run's 3 is past its checks.
	tap, keeping, big, run := keptRefusalPair(t, ctx, w)
	// One batch: the refused event first, then the run's 2.
	if _, err := big.Event("x", []byte(`{"type":"x","pad":"`+strings.Repeat("p", 3000)+`"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := run.Event("x", []byte(`{"type":"x","i":2}`), Options{}); err != nil {
		t.Fatal(err)
	}
	// The batch's send lock keeps the run's 3, once past its publisher's
	// checks, short of the batch's (tryPublish).
	w.batch.sendMu.Lock()
	letGo := sync.OnceFunc(w.batch.sendMu.Unlock)
	t.Cleanup(letGo)
	sent3 := make(chan error, 1)
	go func() {
		_, err := run.Event("x", []byte(`{"type":"x","i":3}`), Options{})
		sent3 <- err
	}()
	until(t, "the run's 3 past its checks", func() bool {
		run.mu.Lock()
		defer run.mu.Unlock()
		if len(run.queue) == 0 {
			return false
		}
		last := run.queue[len(run.queue)-1]
		return last.seq == 3 && last.sent && last.batched
	})
	// Now the answers: the first (the refusal) ends the batch, 2 is not
	// stored, its re-send starts (and waits for 3's send to end). Later
	// ones are for a batch forgotten by then.
	first := within(t, tap.kept, 20*time.Second, "the refusal")
	keeping.Store(false)
	tap.release(first)
	run.mu.Lock()
	resending := run.resending
	run.mu.Unlock()
	if !resending {
		t.Fatal("the answers did not start the run's re-send")
	}
	letGo()
	if err := within(t, sent3, 20*time.Second, "the run's 3"); err != nil {
		t.Fatal(err)
	}
	refusalPairEnds(t, w, run, big, "[1 2 3]")
}

// A gap or error answer for a batch forgotten meanwhile (the connection
// was lost and a new event pruned it) holds nobody: no later answer would
// release the hold, and the run's events would go singly for good.
func TestEndedAnswerForAForgottenBatchHoldsNobody(t *testing.T) {
	t.Parallel()
	b := &Batch{open: map[string]*openBatch{}, held: map[*Publisher]int{}}
	p := new(Publisher)
	batch := func() *openBatch {
		ob := &openBatch{id: nuid.Next(), cut: math.MaxUint64, timer: time.NewTimer(time.Hour),
			entries: []batchEntry{{p: p, seq: 1}}}
		b.open[ob.id] = ob
		return ob
	}
	open := batch()
	b.streamEnded(open)
	if b.held[p] != 1 || open.committedAt.IsZero() {
		t.Fatalf("held %d, committed at %v: an open batch the stream ended", b.held[p], open.committedAt)
	}
	b.unanswered(open)
	if len(b.held) != 0 {
		t.Fatalf("held %v after the batch's events were handed back", b.held)
	}
	pruned := batch()
	b.mu.Lock()
	b.pruneLocked(1)
	b.mu.Unlock()
	b.streamEnded(pruned)
	if len(b.held) != 0 {
		t.Fatalf("held %v by a forgotten batch", b.held)
	}
}

// batchID is the batch id in a batch message's reply subject.
func batchID(t *testing.T, w *testWorker, reply string) string {
	t.Helper()
	rest, ok := strings.CutPrefix(reply, w.batch.prefix)
	if !ok || !strings.HasSuffix(reply, ".$FI") {
		t.Fatalf("reply %q: not in a batch", reply)
	}
	id, _, _ := strings.Cut(rest, ".")
	return id
}

// A batch the stream ended itself (a message refused in it) takes no more
// events: the next go to a new batch (in the one ended, the stream would
// drop them and they would wait out the ack timeout).
func TestBatchTheStreamEndedTakesNoMore(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{PublishAckTimeout: time.Minute}, nil)
	holdBatches(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	updateEventsStream(t, c, func(cfg *jetstream.StreamConfig) {
		cfg.Discard = jetstream.DiscardNew
		cfg.DiscardNewPerSubject = true
		cfg.MaxMsgsPerSubject = 2
	})
	full := newPublisher(w, bus.NewRunID(), 1, nil)
	other := newPublisher(w, bus.NewRunID(), 1, nil)
	sent := replies(t, c, other.subject)
	publishN(t, full, 1)
	publishN(t, other, 1)
	for _, p := range []*Publisher{full, other} {
		if err := p.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ev := func(p *Publisher, i int) {
		t.Helper()
		if _, err := p.Event("x", fmt.Appendf(nil, `{"type":"x","i":%d}`, i), Options{}); err != nil {
			t.Fatal(err)
		}
	}
	ev(other, 2)
	ev(full, 2)
	ev(full, 3) // refused: its subject holds 2; the stream ends the batch
	// The batch of full's 3 (the stream may have ended it already, so
	// it is no longer the open one).
	w.batch.mu.Lock()
	ended := full.batch
	w.batch.mu.Unlock()
	// The stream's answers settle the batch (other's event 2 stored).
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		w.batch.mu.Lock()
		settled := w.batch.open[ended] == nil
		w.batch.mu.Unlock()
		if settled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the batch the stream ended was not settled")
		}
	}
	updateEventsStream(t, c, func(cfg *jetstream.StreamConfig) { cfg.MaxMsgsPerSubject = 1000 })
	ev(other, 3)
	if err := other.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(storedSeqs(t, c, other.run)); got != "[1 2 3]" {
		t.Fatalf("other stored %s, want [1 2 3]", got)
	}
	r := sent(3)
	if len(r) != 3 || batchID(t, w, r[1]) == batchID(t, w, r[2]) {
		t.Fatalf("other's events 2 and 3 went in one batch, the ended one: %q", r)
	}
	full.Abandon()
	if err := flushWithin(t, other); err != nil {
		t.Fatal(err)
	}
}

// A batch committed and never answered (its commit lost, as in a leader
// change) is re-sent after the batch's answer wait, not after the
// publishers' ack timeout (an hour here): nothing is stored twice.
func TestUnansweredBatchIsReSent(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{PublishAckTimeout: time.Hour}, nil)
	holdBatches(t, w)
	w.batch.mu.Lock()
	w.batch.answerWait, w.batch.stuckWait = 50*time.Millisecond, 50*time.Millisecond
	w.batch.mu.Unlock()
	if err := w.batch.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	storeTen(t, c, p)
}

// relayAnswers puts pass between the stream's batch answers and the
// worker: it gets each answer with its batch id and returns how long to
// hold it, or a negative duration to drop it. Held answers keep their
// order.
func relayAnswers(t *testing.T, w *testWorker, pass func(id string) time.Duration) {
	t.Helper()
	if err := w.batch.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	type held struct {
		m     *nats.Msg
		until time.Time
	}
	q := make(chan held, 1<<16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for h := range q {
			if d := time.Until(h.until); d > 0 {
				t := time.NewTimer(d) // the answer's latency, not a wait
				<-t.C
			}
			w.batch.route(h.m)
		}
	}()
	sub, err := w.batch.nc.Subscribe(w.batch.prefix+">", func(m *nats.Msg) {
		id, _, _ := strings.Cut(strings.TrimPrefix(m.Subject, w.batch.prefix), ".")
		if d := pass(id); d >= 0 {
			q <- held{m, time.Now().Add(d)}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sub.Unsubscribe()
		close(q)
		<-done
	})
}

// loseFirstBatch is a relayAnswers pass that loses every answer of the
// first batch answered, and passes the others at once.
func loseFirstBatch() func(id string) time.Duration {
	var mu sync.Mutex
	lost := ""
	return func(id string) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		if lost == "" {
			lost = id
		}
		if id == lost {
			return -1
		}
		return 0
	}
}

// An overloaded stream answers every batch late, none lost: the batches
// are waited for, not taken for lost at answerWait and re-sent event by
// event (each checked against the store), which was more load than the
// batches and kept an overloaded fleet from recovering.
func TestLateBatchAnswersAreWaitedFor(t *testing.T) {
	t.Parallel()
	var resent atomic.Int32
	w, c := startInternal(t, testConfig{PublishAckTimeout: time.Hour}, func(w *testWorker) {
		w.wire.onResend(func(uint64) { resent.Add(1) })
	})
	w.batch.mu.Lock()
	w.batch.answerWait = 50 * time.Millisecond
	w.batch.mu.Unlock()
	relayAnswers(t, w, func(string) time.Duration { return 500 * time.Millisecond })
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	storeTen(t, c, p)
	if n := resent.Load(); n != 0 {
		t.Fatalf("%d events re-sent", n)
	}
}

// A commit lost while the stream answers later batches (a leader change,
// say) is found by the later answer: its events are re-sent after
// answerWait, not after stuckWait (an hour here), and stored once.
func TestLostCommitIsFoundByALaterAnswer(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{PublishAckTimeout: time.Hour}, nil)
	holdBatches(t, w)
	w.batch.mu.Lock()
	w.batch.answerWait = 50 * time.Millisecond
	w.batch.mu.Unlock()
	relayAnswers(t, w, loseFirstBatch())
	p1 := newPublisher(w, bus.NewRunID(), 1, nil)
	started(t, p1) // its first event goes singly, with its message id
	if _, err := p1.Event("x", []byte(`{"type":"x","i":2}`), Options{}); err != nil {
		t.Fatal(err)
	}
	w.batch.commitNow() // the second run's batch is committed after it
	first := make(chan error, 1)
	go func() { first <- flushWithin(t, p1) }()
	p2 := newPublisher(w, bus.NewRunID(), 1, nil)
	storeTen(t, c, p2)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(storedSeqs(t, c, p1.run)); got != "[1 2]" {
		t.Fatalf("first run stored %s", got)
	}
}

// Once the events a re-send sent are stored, the events held meanwhile go
// out as new ones do (in a batch), not one at a time with a round trip
// each: that could not keep up with a streaming run on a loaded server,
// and every run of a worker fell into it at once when the stream dropped
// a batch (429 "too many requests").
func TestHeldEventsLeaveTheReSendInABatch(t *testing.T) {
	t.Parallel()
	var resent atomic.Int32
	inResend := make(chan struct{})
	goOn := make(chan struct{})
	w, c := startInternal(t, testConfig{PublishAckTimeout: time.Hour}, func(w *testWorker) {
		w.wire.onResend(func(uint64) {
			if resent.Add(1) == 1 {
				close(inResend)
				<-goOn
			}
		})
	})
	holdBatches(t, w)
	w.batch.mu.Lock()
	w.batch.answerWait, w.batch.stuckWait = 50*time.Millisecond, 50*time.Millisecond
	w.batch.mu.Unlock()
	relayAnswers(t, w, loseFirstBatch())
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	sent := replies(t, c, w.names.Events(p.run))
	started(t, p)
	holdDuringResend(t, w, p, inResend)
	close(goOn)
	if err := flushWithin(t, p); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(storedSeqs(t, c, p.run)), fmt.Sprint(seqsTo(10)); got != want {
		t.Fatalf("stored %s, want %s", got, want)
	}
	if n := resent.Load(); n != 1 {
		t.Fatalf("%d events re-sent one at a time, want 1 (event 2)", n)
	}
	r := sent(11) // event 1, 2, its re-send, 3..10
	for i, reply := range r[3:] {
		if !strings.HasSuffix(reply, ".$FI") {
			t.Errorf("held event %d sent singly (reply %q)", i+3, reply)
		}
	}
}

// The publisher fails (its lease lost) while a re-send's held events go
// out, and an answer holds it again mid-way: the release stops there and
// leaves the dropped queue alone (it walked the queue's cleared array and
// took the worker down; a review's test).
func TestReleaseStopsWhenThePublisherFails(t *testing.T) {
	t.Parallel()
	var resent atomic.Int32
	inResend := make(chan struct{})
	goOn := make(chan struct{})
	var injected atomic.Bool
	var pub atomic.Pointer[Publisher]
	w, _ := startInternal(t, testConfig{PublishAckTimeout: time.Hour}, func(w *testWorker) {
		w.wire.onResend(func(uint64) {
			if resent.Add(1) == 1 {
				close(inResend)
				<-goOn
			}
		})
		// 5 goes out first in the release (held till then).
		w.wire.onPublish(func(m *nats.Msg) error {
			if !batched(m) || envelopeSeq(m) != 5 || !injected.CompareAndSwap(false, true) {
				return nil
			}
			// The stream answers 4 as not stored, the lease is lost, and
			// 5's send fails.
			p := pub.Load()
			p.batchAnswer(4, 0, false, errBatchEnded)
			p.Fence()
			return errWire
		})
	})
	holdBatches(t, w)
	w.batch.mu.Lock()
	w.batch.answerWait, w.batch.stuckWait = 50*time.Millisecond, 50*time.Millisecond
	w.batch.mu.Unlock()
	relayAnswers(t, w, loseFirstBatch())
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	pub.Store(p)
	started(t, p)
	holdDuringResend(t, w, p, inResend)
	close(goOn)
	if err := flushWithin(t, p); !errors.Is(err, ErrFenced) {
		t.Fatalf("flush: %v, want the publisher fenced", err)
	}
	if !injected.Load() {
		t.Fatal("the release did not reach event 5")
	}
}

// holdDuringResend publishes event 2 in a batch whose answers are lost
// (loseFirstBatch), waits for its re-send to start (inResend), and
// publishes 3..10, held while the re-send runs.
func holdDuringResend(t *testing.T, w *testWorker, p *Publisher, inResend <-chan struct{}) {
	t.Helper()
	if _, err := p.Event("x", []byte(`{"type":"x","i":2}`), Options{}); err != nil {
		t.Fatal(err)
	}
	w.batch.commitNow() // its answers are lost: event 2 is re-sent
	heldWhileResending(t, p, inResend)
}

// heldWhileResending waits for event 2's re-send to start (inResend) and
// publishes 3..10, held while the re-send runs.
func heldWhileResending(t *testing.T, p *Publisher, inResend <-chan struct{}) {
	t.Helper()
	select {
	case <-inResend:
	case <-time.After(20 * time.Second):
		t.Fatal("event 2 was not re-sent")
	}
	for i := 3; i <= 10; i++ {
		if _, err := p.Event("x", fmt.Appendf(nil, `{"type":"x","i":%d}`, i), Options{}); err != nil {
			t.Fatal(err)
		}
	}
}
