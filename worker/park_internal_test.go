package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// A park that fires as the wait takes its answer does not end the wait:
// the answer taken is applied (an answer taken and then parked would be
// lost: the wake looks only for answers after those the attempt took).
// A wait the park ends is handed back to be parked; a wait for anything
// but approvals never is.
func TestParkEndsOnlyAnApprovalWaitWithoutItsAnswer(t *testing.T) {
	t.Parallel()
	w := &Worker{cfg: Config{MaxWaiting: 10, Concurrency: 1}, slots: make(chan struct{}, 1), obs: NopObserver{},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	newRun := func() *run {
		r := &run{w: w, log: w.log}
		r.parkSignal, r.parkNow = context.WithCancel(context.Background())
		r.slot = w.newSlotHold("q")
		w.slots <- struct{}{}
		return r
	}
	ctx := context.Background()
	r := newRun()
	err := r.waitOffSlot(ctx, bus.WaitingApproval, time.Now(), func(wctx context.Context) error {
		r.parkNow()
		<-wctx.Done() // the park fired
		return nil    // and the wait had its answer
	})
	if err != nil {
		t.Fatalf("an answered wait the park fired on: %v, want nil", err)
	}
	r.slot.release()
	r = newRun()
	err = r.waitOffSlot(ctx, bus.WaitingApproval, time.Now(), func(wctx context.Context) error {
		r.parkNow()
		<-wctx.Done()
		return wctx.Err()
	})
	if !errors.Is(err, errWaitHandedBack) {
		t.Fatalf("a wait the park ended: %v, want errWaitHandedBack", err)
	}
	r = newRun()
	r.parkNow()
	err = r.waitOffSlot(ctx, "budget", time.Now(), func(wctx context.Context) error {
		select {
		case <-wctx.Done():
			return wctx.Err()
		case <-time.After(50 * time.Millisecond): // the park would end it before
			return nil
		}
	})
	if err != nil {
		t.Fatalf("a budget wait of a run parking: %v, want nil", err)
	}
}
