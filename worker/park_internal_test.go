package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
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

// Two gated calls of a parallel batch wait; the park fires as c1 takes
// its answer. c2's hand-back does not find the run idle until c1's call,
// which runs on, has ended: not while c1's wait is still in progress
// (it may yet return with its answer), nor between its end and the call
// running (waitInCall counts the call running as its wait ends).
func TestParkHandBackWaitsForACallWhoseWaitTookItsAnswer(t *testing.T) {
	t.Parallel()
	w := &Worker{cfg: Config{MaxWaiting: 10, Concurrency: 1}, slots: make(chan struct{}, 1), obs: NopObserver{},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r := &run{w: w, log: w.log}
	r.parkSignal, r.parkNow = context.WithCancel(context.Background())
	r.slot = w.newSlotHold("q")
	w.slots <- struct{}{}
	ctx := context.Background()
	waiting := make(chan struct{}, 2)
	answer := make(chan struct{}) // c1's wait returns with its answer
	var c1Ended atomic.Bool
	c1Done, c2Done := make(chan struct{}), make(chan struct{})
	go func() { // c1
		defer close(c1Done)
		r.toolBusy(1) // tool_execution_start
		err := r.waitInCall(ctx, bus.WaitingApproval, time.Now(), func(wctx context.Context) error {
			waiting <- struct{}{}
			<-wctx.Done() // the park fired
			<-answer      // and the wait took its answer
			return nil
		})
		if err != nil {
			t.Errorf("c1's answered wait: %v", err)
		}
		r.wait.mu.Lock()
		busy := r.wait.busy
		r.wait.mu.Unlock()
		if busy != 1 {
			t.Errorf("c1's call runs on with busy %d, want 1", busy)
		}
		c1Ended.Store(true) // the call ran
		r.toolBusy(-1)      // tool_execution_end
	}()
	go func() { // c2, as awaitApproval and handBackWhileWaiting
		defer close(c2Done)
		r.toolBusy(1)
		err := r.waitInCall(ctx, bus.WaitingApproval, time.Now(), func(wctx context.Context) error {
			waiting <- struct{}{}
			<-wctx.Done()
			return wctx.Err()
		})
		if !errors.Is(err, errWaitHandedBack) {
			t.Errorf("c2's wait: %v, want errWaitHandedBack", err)
		}
		r.awaitToolsIdle(ctx)
		if !c1Ended.Load() {
			t.Error("the hand-back found the run idle before c1's call, answered, ended")
		}
		r.toolBusy(1)
		r.toolBusy(-1)
	}()
	<-waiting
	<-waiting
	r.parkNow()
	// c2 left its wait and awaits the run idle (or, wrongly, went on).
	for {
		r.wait.mu.Lock()
		blocked := r.wait.idle != nil
		r.wait.mu.Unlock()
		if blocked {
			break
		}
		select {
		case <-c2Done:
			t.Fatal("the hand-back went on while c1's wait was in progress")
		default:
		}
		time.Sleep(time.Millisecond) // polls the run's own state; nothing to wait on
	}
	close(answer)
	<-c1Done
	<-c2Done
}
