package eventpub

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
)

type publishFailures struct {
	nopMetrics
	n atomic.Int64
}

func (o *publishFailures) PublishFailed(error) { o.n.Add(1) }

// A hard stop while an event waits its turn fails its publisher with
// ErrStopped, which the run takes as a hard stop (handed back at
// once, "worker stopping"), not as events the stream would not store, and
// which is not counted as a failed publish.
func TestAHardStopDuringATurnIsNotAPublishFailure(t *testing.T) {
	t.Parallel()
	o := &publishFailures{}
	w, _ := startInternal(t, testConfig{PublishAckTimeout: time.Hour, Observer: o}, nil)
	holdBatches(t, w)
	routeAcks(t, w, func(m *nats.Msg) *nats.Msg {
		if strings.HasSuffix(m.Subject, ".1") {
			return nil // run_started's ack never comes
		}
		return m
	})
	failed := make(chan error, 1)
	p := newPublisher(w, bus.NewRunID(), 1, func(err error) { failed <- err })
	publishN(t, p, 1)
	go func() { _, _ = p.Event("x", []byte(`{"type":"x","i":2}`), Options{}) }()
	waitingForTurn(t, p, "event 2")
	failsAsTheHardStop(t, w, o, p, failed)
}

// failsAsTheHardStop stops w hard and checks that p fails as the hard
// stop's, uncounted as a failed publish.
func failsAsTheHardStop(t *testing.T, w *testWorker, o *publishFailures, p *Publisher, failed <-chan error) {
	t.Helper()
	w.hardCancel()
	if err := within(t, failed, 20*time.Second, "the publisher's failure at the hard stop"); !errors.Is(err, ErrStopped) {
		t.Fatalf("publisher failed with %v, want ErrStopped", err)
	}
	if n := o.n.Load(); n != 0 {
		t.Errorf("%d failed publishes counted at a hard stop", n)
	}
	p.Abandon()
}

// A run fenced (or failed) while its event waits for the answer to its
// earlier batch stops waiting at once: before, it waited for that answer
// (or the batch's stuck wait), holding its send lock. A hard stop does not
// end the wait: the event goes out once the batch is answered (a few ms)
// and the hand-back's flush stores it, where failing the publisher would
// drop it (a tool's result, say, which the next attempt would then lack).
func TestAFencedRunStopsWaitingForItsEarlierBatch(t *testing.T) {
	t.Parallel()
	t.Run("fenced", func(t *testing.T) { stopWaitingForABatch(t, false) })
	t.Run("hard stop", func(t *testing.T) { stopWaitingForABatch(t, true) })
}

func stopWaitingForABatch(t *testing.T, hardStop bool) {
	w, c := startInternal(t, testConfig{PublishAckTimeout: time.Hour}, nil)
	holdBatches(t, w)
	w.batch.mu.Lock()
	w.batch.stuckWait = time.Hour
	w.batch.mu.Unlock()
	var keeping atomic.Bool
	tap := tapAnswers(t, w, func(*nats.Msg) bool { return keeping.Load() })
	failed := make(chan error, 1)
	p := newPublisher(w, bus.NewRunID(), 1, func(err error) { failed <- err })
	started(t, p)
	waiting := batchWaits(t, w, p, 3)
	keeping.Store(true)
	if _, err := p.Event("x", []byte(`{"type":"x","i":2}`), Options{}); err != nil {
		t.Fatal(err)
	}
	w.batch.commitNow()
	answer := within(t, tap.kept, 20*time.Second, "the batch's answer")
	sent := make(chan error, 1)
	go func() {
		_, err := p.Event("x", []byte(`{"type":"x","i":3}`), Options{})
		sent <- err
	}()
	within(t, waiting, 20*time.Second, "the run's 3 waiting")
	want := "[1 2]" // a fenced attempt sends nothing more
	if hardStop {
		w.hardCancel()
		want = "[1 2 3]"
	} else {
		p.Abandon()
		within(t, sent, 10*time.Second, "the run's 3 ending its wait")
	}
	keeping.Store(false)
	answers := []*nats.Msg{answer}
	for len(tap.kept) > 0 { // the commit's ack after a flow ack
		answers = append(answers, <-tap.kept)
	}
	tap.release(answers...)
	if hardStop {
		if err := within(t, sent, 20*time.Second, "the run's 3 sent"); err != nil {
			t.Fatal(err)
		}
		if err := flushWithin(t, p); err != nil {
			t.Fatalf("the hand-back's flush: %v", err)
		}
		select {
		case err := <-failed:
			t.Fatalf("the publisher failed at the hard stop: %v", err)
		default:
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; runtime.Gosched() {
		got := fmt.Sprint(storedSeqs(t, c, p.run))
		if got == want {
			break
		}
		if got != "[1]" && got != "[1 2]" || time.Now().After(deadline) {
			t.Fatalf("stored %s, want %s", got, want)
		}
	}
}

// The same for a hard stop while a re-send's request waits for its
// answer (it ends the request: context canceled). The request is held
// until its own context ends, not the hard stop's: a context's Done
// closes before its children are cancelled, so a hook that went on once
// the hard stop's Done closed could send the request under a context not
// yet cancelled, and under load the stream's answer came first: the event
// stored, the re-send over, and no failure to report (a flake in CI).
func TestAHardStopDuringAReSendIsNotAPublishFailure(t *testing.T) {
	t.Parallel()
	o := &publishFailures{}
	w, _ := startInternal(t, testConfig{PublishAckTimeout: 300 * time.Millisecond, Observer: o}, nil)
	routeAcks(t, w, func(m *nats.Msg) *nats.Msg {
		if strings.HasSuffix(m.Subject, ".1") {
			return nil // run_started's ack never comes: it is re-sent
		}
		return m
	})
	resending := make(chan struct{})
	var once sync.Once
	w.wire.onResendWithin(func(ctx context.Context, _ uint64) {
		once.Do(func() { close(resending) })
		<-w.hardCtx.Done()
		<-ctx.Done() // the request's: its deadline or, now, the hard stop's
	})
	failed := make(chan error, 1)
	p := newPublisher(w, bus.NewRunID(), 1, func(err error) { failed <- err })
	publishN(t, p, 1)
	within(t, resending, 20*time.Second, "the re-send")
	failsAsTheHardStop(t, w, o, p, failed)
}
