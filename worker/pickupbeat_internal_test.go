package worker

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/lease"
)

// heldProgress is a request's acknowledgements whose InProgress can be
// held (a beat descheduled before its write).
type heldProgress struct {
	mu       sync.Mutex
	started  int // InProgress calls
	finished int
	hold     chan struct{} // non-nil: InProgress waits for it
	in       chan struct{} // closed by the first held InProgress
}

func (a *heldProgress) InProgress() error {
	a.mu.Lock()
	a.started++
	hold, in := a.hold, a.in
	a.in = nil
	a.mu.Unlock()
	if in != nil {
		close(in)
	}
	if hold != nil {
		<-hold
	}
	a.mu.Lock()
	a.finished++
	a.mu.Unlock()
	return nil
}

func (a *heldProgress) counts() (started, finished int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.started, a.finished
}

func (*heldProgress) Ack() error                       { return nil }
func (*heldProgress) DoubleAck(context.Context) error  { return nil }
func (*heldProgress) Nak() error                       { return nil }
func (*heldProgress) NakWithDelay(time.Duration) error { return nil }
func (*heldProgress) TermWithReason(string) error      { return nil }

// stopWaits reports whether a stop waits for a beat under way.
func (p *pickupBeat) stopWaits() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waited && p.beating
}

// stop returns only once a beat under way has sent its InProgress: a
// settle after it, or a stale copy's refusal, is followed by none.
func TestPickupBeatStopWaitsForABeatUnderWay(t *testing.T) {
	in := make(chan struct{})
	acks := &heldProgress{hold: make(chan struct{}), in: in}
	p := startPickupBeat(acks, time.Millisecond)
	<-in
	stopped := make(chan struct{})
	go func() { p.stop(); close(stopped) }()
	for !p.stopWaits() {
		select {
		case <-stopped:
			close(acks.hold)
			t.Fatal("stop returned while a beat's InProgress was under way")
		default:
			runtime.Gosched()
		}
	}
	close(acks.hold)
	<-stopped
	started, finished := acks.counts()
	p.beat() // a timer that fired before the stop
	if s, f := acks.counts(); s != started || f != finished || started != finished {
		t.Fatalf("InProgress: %d started, %d finished at the stop; %d, %d after", started, finished, s, f)
	}
}

// A pickup that finds its copy stale (a newer attempt owns the run) ends
// its keep-alive before it returns: neither acked nor naked, the copy's
// InProgress would go on extending the newer delivery's AckWait.
func TestRefusingAStaleCopyEndsItsPickupBeat(t *testing.T) {
	for _, o := range []lease.Outcome{lease.Newer, lease.Reused, lease.Unread} {
		acks := &heldProgress{}
		w := &Worker{}
		r := &run{w: w, id: "stale", attempt: 1, reqSeq: 7, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		r.msg = acks
		r.pickupBeat = startPickupBeat(acks, time.Hour)
		r.refuse(o, &bus.RunRecord{ID: "stale", Attempt: 2, RequestSeq: 7})
		r.pickupBeat.beat() // its timer fires now
		if s, _ := acks.counts(); s != 0 {
			t.Fatalf("outcome %v: %d InProgress after the refusal", o, s)
		}
	}
}

// At the hand-over from the pickup's keep-alive to the run's heartbeat the
// request goes no longer than an interval without an InProgress: the
// heartbeat's first beat comes at most an interval after the pickup's
// last. It came a whole firstBeat (up to an interval) after the
// hand-over, up to two intervals after the last InProgress.
func TestPickupHandOverKeepsTheInterval(t *testing.T) {
	t.Parallel()
	const every = time.Second
	var (
		mu    sync.Mutex
		reads int
		wpi   []time.Time
	)
	hold := make(chan struct{})
	finishing := make(chan struct{}) // run_finished is held until closed
	w, c := startInternal(t, Config{MaxDeliver: 2, AckWait: 4 * every}, func(w *Worker) {
		beforeRecordRead(w, func(string) {
			mu.Lock()
			reads++
			first := reads == 1
			mu.Unlock()
			if first {
				<-hold
			}
		})
		wrapSends(w, sends{beforeEvent: func(e *bus.Envelope) {
			if e.Type == bus.EventRunFinished {
				<-finishing
			}
		}})
	})
	<-w.ready
	seen := make(chan int, 64)
	onInProgress(t, c, func() {
		mu.Lock()
		wpi = append(wpi, time.Now())
		n := len(wpi)
		mu.Unlock()
		select { // a NATS callback does not block
		case seen <- n:
		default:
		}
	})
	released := false
	release := func() {
		if !released {
			released = true
			close(hold)
		}
	}
	defer release()
	defer close(finishing)
	submitRun(t, c, &bus.RunRequest{Prompt: "hi", Model: fauxModel, Faux: fauxTexts("hello")})
	timeout := time.NewTimer(10 * every)
	defer timeout.Stop()
	// The pickup's first InProgress; the hand-over late in its interval;
	// then the heartbeat's first.
	var handOver <-chan time.Time
	for n := 0; n < 2; {
		select {
		case n = <-seen:
			if n == 1 {
				handOver = time.After(every * 85 / 100)
			}
		case <-handOver:
			release()
		case <-timeout.C:
			t.Fatalf("%d InProgress", n)
		}
	}
	mu.Lock()
	gap := wpi[1].Sub(wpi[0])
	mu.Unlock()
	if gap > every*5/4 {
		t.Fatalf("%v between the pickup's last InProgress and the heartbeat's first (interval %v)", gap, every)
	}
}
