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
