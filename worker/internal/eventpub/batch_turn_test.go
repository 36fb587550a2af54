package eventpub

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
)

// Between the stream's answer that a batch ended and the answers of the
// events it did not store, a run's next event must not open a new batch
// and be stored before its lost predecessor (the attempt then failed as
// stored out of order; TestRefusedEventInABatchIsReSentForTheOthers hit
// it about one run in thirty). The commit ack is kept back to hold the
// window open.
func TestNextEventWaitsForItsPredecessorInAnEndedBatch(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{}, nil)
	holdBatches(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The stream's answers are kept back, all but the gap answer for the
	// run's 3: the worker learns that the batch ended and not yet what it
	// stored (as when the error answer is lost and the commit ack late).
	ended := make(chan struct{})
	var endedOnce sync.Once
	tap := tapAnswers(t, w, func(m *nats.Msg) bool {
		switch d := string(m.Data); {
		case strings.HasPrefix(d, `{"type":"gap"`):
			endedOnce.Do(func() { close(ended) })
			return false
		case strings.HasPrefix(d, `{"type":"ack"`):
			return false
		}
		return true
	})
	big, run := refusalPair(t, ctx, w)
	// One batch: the run's 2, the refused event, the run's 3. The stream
	// stores 2, refuses the next and ends the batch, so 3 is not stored.
	if _, err := run.Event("x", []byte(`{"type":"x","i":2}`), Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := big.Event("x", []byte(`{"type":"x","pad":"`+strings.Repeat("p", 3000)+`"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := run.Event("x", []byte(`{"type":"x","i":3}`), Options{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	case <-ctx.Done():
		t.Fatal("no gap answer for the batch")
	}
	// The error answer for the refused event, the commit ack.
	answers := []*nats.Msg{within(t, tap.kept, 20*time.Second, "the error answer"),
		within(t, tap.kept, 20*time.Second, "the commit ack")}
	if _, err := run.Event("x", []byte(`{"type":"x","i":4}`), Options{}); err != nil {
		t.Fatal(err)
	}
	run.commitBatch()
	if err := flushWithin(t, run); err != nil {
		t.Fatalf("flush: %v", err)
	}
	// The kept answers come late: nothing changes for the run.
	tap.release(answers...)
	if err := run.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(storedSeqs(t, c, run.run)); got != "[1 2 3 4]" {
		t.Fatalf("stored %s, want [1 2 3 4]", got)
	}
	if err := flushWithin(t, big); err == nil || !strings.Contains(err.Error(), "maximum") {
		t.Fatalf("the run with the refused event: flush %v, want the size refusal", err)
	}
	waitNoHolds(t, w)
}

// A run's next event does not go in a new batch while its earlier one
// waits for an answer in another: the stream may not store the earlier
// one (an overloaded server drops messages, 429) and store the later
// batch, the run's events then out of order. Here the first batch ends at
// a refused event (the run's 3 after it is not stored) and its answers
// are kept back; without the wait the run's 4 was stored in the next
// batch and the attempt failed as stored out of order.
func TestNextEventWaitsForItsRunsEarlierBatch(t *testing.T) {
	t.Parallel()
	w, _ := startInternal(t, testConfig{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tap, keeping, big, run := keptRefusalPair(t, ctx, w)
	waiting := batchWaits(t, w, run, 4)
	// One batch: the run's 2, the refused event, the run's 3.
	if _, err := run.Event("x", []byte(`{"type":"x","i":2}`), Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := big.Event("x", []byte(`{"type":"x","pad":"`+strings.Repeat("p", 3000)+`"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := run.Event("x", []byte(`{"type":"x","i":3}`), Options{}); err != nil {
		t.Fatal(err)
	}
	w.batch.commitNow()
	// Its answers: the error for the refused event and the commit ack at
	// least (a flow ack may come before).
	answers := []*nats.Msg{within(t, tap.kept, 20*time.Second, "an answer"), within(t, tap.kept, 20*time.Second, "an answer")}
	sent := make(chan error, 1)
	go func() {
		_, err := run.Event("x", []byte(`{"type":"x","i":4}`), Options{})
		sent <- err
	}()
	select {
	case <-waiting:
	case err := <-sent: // sent while the run's 3 had no answer
		sent <- err
		w.batch.commitNow()
		if err := run.Sync(ctx); err != nil {
			t.Logf("sync: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the run's 4 neither sent nor waiting")
	}
	keeping.Store(false)
	for len(tap.kept) > 0 {
		answers = append(answers, <-tap.kept)
	}
	tap.release(answers...)
	if err := within(t, sent, 20*time.Second, "the run's 4 sent"); err != nil {
		t.Fatal(err)
	}
	refusalPairEnds(t, w, run, big, "[1 2 3 4]")
}

// An event waiting for its run's earlier batch through a loss of the
// connection does not go out after it in a new batch: that batch may have
// been lost with the connection, its event not stored, and the acks'
// sweep, which has the run re-send, may look at the run only later (here
// it is kept from looking until the event went its way). Without the
// check the run's 3 was stored in the new batch before its 2. The old batch
// is forgotten when another run's event opens a new one, or by the batch's
// sweep when none comes (it waited for stuckWait, an hour here).
func TestAWaitingEventIsHeldAfterAReconnect(t *testing.T) {
	t.Parallel()
	for _, another := range []bool{true, false} {
		t.Run(fmt.Sprintf("another run sends: %v", another), func(t *testing.T) { waitThroughAReconnect(t, another) })
	}
}

func waitThroughAReconnect(t *testing.T, another bool) {
	w, _ := startOwnServer(t, testConfig{PublishAckTimeout: time.Minute})
	holdBatches(t, w)
	w.batch.mu.Lock()
	w.batch.stuckWait = time.Hour
	w.batch.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var keeping atomic.Bool
	tap := tapAnswers(t, w, func(*nats.Msg) bool { return keeping.Load() })
	big, run := refusalPair(t, ctx, w)
	other := newPublisher(w, bus.NewRunID(), 1, nil)
	started(t, other)
	waiting := batchWaits(t, w, run, 3)
	keeping.Store(true)
	// The refused event, then the run's 2, which the stream does not
	// store (gap fail); the answers are kept back.
	if _, err := big.Event("x", []byte(`{"type":"x","pad":"`+strings.Repeat("p", 3000)+`"}`), Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := run.Event("x", []byte(`{"type":"x","i":2}`), Options{}); err != nil {
		t.Fatal(err)
	}
	w.batch.commitNow()
	within(t, tap.kept, 20*time.Second, "an answer")
	within(t, tap.kept, 20*time.Second, "an answer")
	sent := make(chan error, 1)
	go func() {
		_, err := run.Event("x", []byte(`{"type":"x","i":3}`), Options{})
		sent <- err
	}()
	within(t, waiting, 20*time.Second, "the run's 3 waiting")
	show := hideFromSweep(t, w)
	nc := w.c.Conn()
	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	for !nc.IsConnected() {
		if ctx.Err() != nil {
			t.Fatal("not reconnected")
		}
		time.Sleep(time.Millisecond) // polls the state waited for
	}
	keeping.Store(false)
	if another {
		// Another run's event opens a batch on the new connection: the old
		// one is forgotten, and the run's 3 stops waiting.
		if _, err := other.Event("x", []byte(`{"type":"x","i":2}`), Options{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := within(t, sent, 20*time.Second, "the run's 3 gone its way"); err != nil {
		t.Fatal(err)
	}
	show()
	w.batch.commitNow()
	if err := flushWithin(t, other); err != nil {
		t.Fatal(err)
	}
	refusalPairEnds(t, w, run, big, "[1 2 3]")
}

// hideFromSweep keeps the acks' sweep from looking at any publisher until
// show: it may look at a run only later. Acks of single sends that come
// meanwhile find no publisher, as a late ack.
func hideFromSweep(t *testing.T, w *testWorker) (show func()) {
	w.acks.mu.Lock()
	hidden := w.acks.pubs
	w.acks.pubs = map[uint64]*Publisher{}
	w.acks.mu.Unlock()
	show = sync.OnceFunc(func() {
		w.acks.mu.Lock()
		maps.Copy(w.acks.pubs, hidden)
		w.acks.mu.Unlock()
	})
	t.Cleanup(show)
	return show
}

// earlySingles records, as they go on the wire, the events sent singly
// while an earlier event of their run waited for its answer.
type earlySingles struct{ seqs sync.Map }

// watch has e see w's single sends.
func (e *earlySingles) watch(w *testWorker) {
	w.wire.onPublish(func(m *nats.Msg) error {
		if !batched(m) {
			e.sent(w, m)
		}
		return nil
	})
}

// sent looks at a single send: its reply is <acks prefix><publisher>.<seq>.
func (e *earlySingles) sent(w *testWorker, m *nats.Msg) {
	rest, _ := cutPrefix(m.Reply, w.acks.prefix)
	id, seq, _ := strings.Cut(rest, ".")
	n, err := strconv.ParseUint(id, 10, 64)
	s, err2 := strconv.ParseUint(seq, 10, 64)
	if err != nil || err2 != nil {
		panic("a single send's reply " + m.Reply)
	}
	w.acks.mu.Lock()
	p := w.acks.pubs[n]
	w.acks.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unackedBeforeLocked(s, false) {
		e.seqs.Store(s, true)
	}
}

// flushed flushes p and checks that its run stored 1..n in order and
// that no event went singly before its turn.
func (e *earlySingles) flushed(t *testing.T, c *bus.Client, p *Publisher, n uint64) {
	t.Helper()
	if err := flushWithin(t, p); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(storedSeqs(t, c, p.run)), fmt.Sprint(seqsTo(n)); got != want {
		t.Fatalf("stored %s, want %s", got, want)
	}
	e.seqs.Range(func(seq, _ any) bool {
		t.Errorf("event %d sent singly while an earlier one waited for its answer", seq)
		return true
	})
}

// waitingForTurn waits until an event of p waits for its turn.
func waitingForTurn(t *testing.T, p *Publisher, what string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; runtime.Gosched() {
		p.mu.Lock()
		waiting := p.turn != nil
		p.mu.Unlock()
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(what + " did not wait for its turn")
		}
	}
}

// batchWaits is closed once p's event seq waits for its run's earlier
// batch: its seq is taken and p's last batch has a waiter's channel
// (tryPublish), which it keeps until its answers come.
func batchWaits(t *testing.T, w *testWorker, p *Publisher, seq uint64) <-chan struct{} {
	waiting, stop, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	waits := func() bool {
		p.mu.Lock()
		taken := p.seq >= seq
		p.mu.Unlock()
		w.batch.mu.Lock()
		defer w.batch.mu.Unlock()
		prev := w.batch.open[p.batch]
		return taken && prev != nil && prev.changed != nil
	}
	go func() {
		defer close(done)
		for !waits() {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond): // polls the state waited for
			}
		}
		close(waiting)
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	return waiting
}

// While batches are paused, every event goes singly, and one at a time:
// a new event waits for the previous one's answer, and so do the events a
// re-send held when it lets them go (they went one behind the other, and
// a dropped one was stored after the next).
func TestSingleSendsGoOneAtATime(t *testing.T) {
	t.Parallel()
	var resent atomic.Int32
	var early earlySingles
	inResend := make(chan struct{})
	goOn := make(chan struct{})
	w, c := startInternal(t, testConfig{PublishAckTimeout: 300 * time.Millisecond}, func(w *testWorker) {
		w.wire.onResend(func(uint64) {
			if resent.Add(1) == 1 {
				close(inResend)
				<-goOn
			}
		})
		early.watch(w)
	})
	w.batch.pauseUntil.Store(time.Now().Add(time.Hour).UnixNano())
	dropAcks(t, w, func(seq uint64) bool { return seq == 2 }) // its re-send's answer comes
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	publishN(t, p, 2)
	heldWhileResending(t, p, inResend)
	close(goOn)
	early.flushed(t, c, p, 10)
}

// Batches pause, or are turned off, after the publisher chose to batch a
// run's event 3 (another run's batch refused), or are off before it, while
// its event 2 waits in an open batch: event 3 goes singly, and only once
// event 2 is answered (it went out beside it, and the run's next event
// went in a batch while it waited: a review's find).
func TestASingleFallbackWaitsItsTurn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		early bool // before event 3 is published, not after its check
		off   bool // off, not paused
	}{{"paused after the check", false, false}, {"off after the check", false, true}, {"off before", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			var early earlySingles
			stop := func(b *Batch) {
				if tc.off {
					b.off.Store(true)
				} else {
					b.pauseUntil.Store(time.Now().Add(time.Hour).UnixNano())
				}
			}
			w, c := startInternal(t, testConfig{}, early.watch)
			holdBatches(t, w) // event 2 waits in the open batch
			p := newPublisher(w, bus.NewRunID(), 1, nil)
			publishN(t, p, 2)
			if tc.early {
				stop(w.batch)
				if _, err := p.Event("x", []byte(`{"type":"x","i":3}`), Options{}); err != nil {
					t.Fatal(err)
				}
			} else {
				// The batch's send lock keeps event 3 short of the batch's
				// checks once its publisher chose to batch it.
				w.batch.sendMu.Lock()
				letGo := sync.OnceFunc(w.batch.sendMu.Unlock)
				t.Cleanup(letGo)
				sent := make(chan error, 1)
				go func() {
					_, err := p.Event("x", []byte(`{"type":"x","i":3}`), Options{})
					sent <- err
				}()
				until(t, "event 3 chosen for a batch", func() bool {
					p.mu.Lock()
					defer p.mu.Unlock()
					if len(p.queue) == 0 {
						return false
					}
					last := p.queue[len(p.queue)-1]
					return last.seq == 3 && last.sent && last.batched
				})
				stop(w.batch)
				letGo()
				if err := within(t, sent, 20*time.Second, "event 3"); err != nil {
					t.Fatal(err)
				}
			}
			w.batch.pauseUntil.Store(0)
			w.batch.off.Store(false)
			if _, err := p.Event("x", []byte(`{"type":"x","i":4}`), Options{}); err != nil {
				t.Fatal(err)
			}
			early.flushed(t, c, p, 4)
		})
	}
}

// Batches pause and resume every few microseconds while a run publishes
// large events (so that a pause can begin between the publisher's turn
// check and its choice of batch or single): no event goes singly beside
// an unanswered batched event of its run (a second review's find: one
// did, when the pause began between the two).
func TestPausesFlappingSendNoSingleBesideABatch(t *testing.T) {
	// Not parallel: its flapping takes a core, and a test beside it
	// starved it past its reads' time limit.
	var early earlySingles
	w, c := startInternal(t, testConfig{PublishAckTimeout: time.Minute}, early.watch)
	holdBatches(t, w)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				w.batch.pauseUntil.Store(0)
				return
			default:
			}
			if i%2 == 0 {
				w.batch.pauseUntil.Store(time.Now().Add(time.Hour).UnixNano())
			} else {
				w.batch.pauseUntil.Store(0)
			}
			time.Sleep(20 * time.Microsecond) // the flapping's pace, not a wait
		}
	})
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	publishN(t, p, 1)
	pad := strings.Repeat("a", 100<<10)
	const n = 300
	for i := 2; i <= n; i++ {
		if _, err := p.Event("x", fmt.Appendf(nil, `{"type":"x","i":%d,"pad":"%s"}`, i, pad), Options{}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	early.flushed(t, c, p, n)
}

// An event waiting for its turn ends when its publisher does (its lease
// lost): it does not wait for an answer that no longer matters.
func TestAWaitingEventEndsWithItsPublisher(t *testing.T) {
	t.Parallel()
	w, _ := startInternal(t, testConfig{PublishAckTimeout: time.Hour}, nil)
	holdBatches(t, w)
	routeAcks(t, w, func(m *nats.Msg) *nats.Msg {
		if strings.HasSuffix(m.Subject, ".1") {
			return nil // run_started's ack never comes
		}
		return m
	})
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	publishN(t, p, 1)
	published := make(chan error, 1)
	go func() {
		_, err := p.Event("x", []byte(`{"type":"x","i":2}`), Options{})
		published <- err
	}()
	waitingForTurn(t, p, "event 2")
	p.Abandon()
	select {
	case err := <-published:
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("event 2: %v, want the lost lease", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("event 2 still waits after its publisher was abandoned")
	}
}

// While an event sent singly (with a message id) waits for its ack, the
// run's next event waits for it, then goes in a batch: were the single one
// lost to a reconnect, or dropped by an overloaded stream, its re-send,
// stored without an expectation, would land after the next.
func TestNoBatchBehindAnUnacknowledgedSingleEvent(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{PublishAckTimeout: time.Hour}, nil)
	holdBatches(t, w)
	held := make(chan *nats.Msg, 1)
	routeAcks(t, w, func(m *nats.Msg) *nats.Msg {
		if strings.HasSuffix(m.Subject, ".1") && len(held) == 0 {
			held <- m // run_started's ack: given back by the test
			return nil
		}
		return m
	})
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	sent := replies(t, c, p.subject)
	publishN(t, p, 1)
	published := make(chan error, 1)
	go func() {
		for i := 2; i <= 4; i++ {
			if _, err := p.Event("x", fmt.Appendf(nil, `{"type":"x","i":%d}`, i), Options{}); err != nil {
				published <- err
				return
			}
		}
		published <- nil
	}()
	// Event 2 waits for its turn before run_started's ack is given back.
	waitingForTurn(t, p, "event 2")
	w.acks.route(<-held)
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	if err := flushWithin(t, p); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(storedSeqs(t, c, p.run)), fmt.Sprint(seqsTo(4)); got != want {
		t.Fatalf("stored %s, want %s", got, want)
	}
	for i, reply := range sent(4) {
		if inBatch := strings.HasSuffix(reply, ".$FI"); inBatch != (i >= 1) {
			t.Errorf("event %d: in a batch %v, want %v (reply %q)", i+1, inBatch, i >= 1, reply)
		}
	}
}

// A run waiting for its acks commits the open batch only when its latest
// event is in it: one whose events went in a batch committed already
// would only cut the other runs' batch short (a tool call waits for its
// run's events, docs/protocol.md §4).
func TestAWaitCommitsTheOpenBatchOnlyForItsOwnEvents(t *testing.T) {
	t.Parallel()
	w, _ := startInternal(t, testConfig{}, nil)
	holdBatches(t, w)
	p1, p2 := newPublisher(w, bus.NewRunID(), 1, nil), newPublisher(w, bus.NewRunID(), 1, nil)
	started(t, p1)
	started(t, p2)
	keeping := new(atomic.Bool)
	keeping.Store(true)
	tap := tapAnswers(t, w, func(*nats.Msg) bool { return keeping.Load() })
	if _, err := p1.Event("x", []byte(`{"type":"x","i":2}`), Options{}); err != nil {
		t.Fatal(err)
	}
	w.batch.commitNow() // p1's 2 waits in a committed batch
	if _, err := p2.Event("x", []byte(`{"type":"x","i":2}`), Options{}); err != nil {
		t.Fatal(err)
	}
	open := func() bool {
		w.batch.mu.Lock()
		defer w.batch.mu.Unlock()
		return w.batch.cur != nil && w.batch.cur.committedAt.IsZero()
	}
	p1.commitBatch()
	if !open() {
		t.Fatal("p1's wait committed the batch holding p2's event alone")
	}
	p2.commitBatch()
	if open() {
		t.Fatal("p2's wait left its batch open")
	}
	keeping.Store(false)
	flushed := make(chan error, 1)
	go func() { flushed <- errors.Join(flushWithin(t, p1), flushWithin(t, p2)) }()
	for { // an answer kept as keeping ended comes later
		select {
		case m := <-tap.kept:
			tap.release(m)
		case err := <-flushed:
			if err != nil {
				t.Fatal(err)
			}
			return
		}
	}
}
