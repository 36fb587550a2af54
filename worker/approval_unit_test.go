package worker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// Early answers (for calls that have not asked) are kept up to
// maxEarlyAnswerBytes of messages; beyond, they are dropped.
func TestApprovalEarlyAnswersCappedByBytes(t *testing.T) {
	t.Parallel()
	r := &run{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	const size = 200 << 10
	for i := range 10 {
		r.deliverApproval(bus.ApprovalAnswer{ToolCallID: fmt.Sprintf("x%d", i), Decision: bus.DecisionApprove}, uint64(i+1), time.Now(), size)
	}
	if n, b := len(r.gate.calls.early), r.gate.calls.earlyBytes; n != maxEarlyAnswerBytes/size || b > maxEarlyAnswerBytes {
		t.Fatalf("kept %d answers, %d bytes; want %d within %d", n, b, maxEarlyAnswerBytes/size, maxEarlyAnswerBytes)
	}
	// A call that asks takes its answer: room for another.
	r.gate.calls.add(&gatedCall{id: "x0", wake: make(chan struct{}, 1)})
	r.deliverApproval(bus.ApprovalAnswer{ToolCallID: "late", Decision: bus.DecisionDeny}, 99, time.Now(), size)
	if n := len(r.gate.calls.early); n != maxEarlyAnswerBytes/size {
		t.Fatalf("kept %d answers after one was taken and another came", n)
	}
}

// Waiting places: a new gated call gets one while one is free (a run's
// calls share one), is refused past them, and a call an earlier attempt
// asked for still waits (on its slot). A place is given back once the
// run's last claim ends.
func TestApprovalWaitPlaces(t *testing.T) {
	t.Parallel()
	w := &Worker{cfg: Config{MaxWaiting: 1}}
	a, b := &run{w: w}, &run{w: w}
	if !a.claimWaitPlace(false) || !a.claimWaitPlace(false) {
		t.Fatal("the first run's calls were refused")
	}
	if b.claimWaitPlace(false) {
		t.Fatal("a second run took a place past MaxWaiting 1")
	}
	if !b.claimWaitPlace(true) || b.wait.place {
		t.Fatalf("a resumed call: refused, or took a place (%v)", b.wait.place)
	}
	b.unclaimWaitPlace()
	a.unclaimWaitPlace()
	if w.places.held != 1 {
		t.Fatalf("%d places held while a call still claims one", w.places.held)
	}
	a.unclaimWaitPlace()
	if w.places.held != 0 || !b.claimWaitPlace(false) {
		t.Fatalf("%d places held after the last claim, or the place was not free again", w.places.held)
	}
	b.unclaimWaitPlace()
	keep := &run{w: &Worker{cfg: Config{MaxWaiting: -1}}}
	if !keep.claimWaitPlace(false) || keep.wait.place {
		t.Fatal("with MaxWaiting -1 a call was refused or took a place")
	}
}

// A resumed gated call past MaxWaiting waits on its slot until a place
// frees, then leaves its slot: freed places go to the runs waiting on
// their slots for one, first come first, ahead of new calls.
func TestApprovalResumedCallLeavesItsSlotWhenAPlaceFrees(t *testing.T) {
	t.Parallel()
	w := &Worker{cfg: Config{MaxWaiting: 1, Concurrency: 3}, slots: make(chan struct{}, 3), obs: NopObserver{}}
	a, b, c := &run{w: w}, &run{w: w}, &run{w: w}
	for _, r := range []*run{a, b, c} {
		r.slot = w.newSlotHold("q")
		w.slots <- struct{}{}
	}
	if !a.claimWaitPlace(false) {
		t.Fatal("a refused")
	}
	a.enterWait(bus.WaitingApproval, time.Now(), false)
	for _, r := range []*run{b, c} {
		if !r.claimWaitPlace(true) {
			t.Fatal("a resumed call was refused")
		}
		r.enterWait(bus.WaitingApproval, time.Now(), false)
	}
	if w.OffSlot() != 1 || len(w.slots) != 2 {
		t.Fatalf("off slot %d, slots taken %d; want a off its slot, b and c on theirs", w.OffSlot(), len(w.slots))
	}
	// a's call is answered and ends: its place goes to b, the first queued.
	a.leaveWait(context.Background(), bus.WaitingApproval, false, false)
	a.unclaimWaitPlace()
	if !b.wait.offSlot || c.wait.offSlot || w.OffSlot() != 1 || len(w.slots) != 2 || w.places.held != 1 {
		t.Fatalf("after a place freed: b off %v, c off %v, off slot %d, slots taken %d, places %d; want b off its slot",
			b.wait.offSlot, c.wait.offSlot, w.OffSlot(), len(w.slots), w.places.held)
	}
	// A new call does not take a place ahead of the queued c.
	if d := (&run{w: w}); d.claimWaitPlace(false) {
		t.Fatal("a new call took a place while a resumed one waits for it")
	}
	// c's wait ends first (answered on its slot): it leaves the queue,
	// and b's place, once free, goes back to the pool.
	c.leaveWait(context.Background(), bus.WaitingApproval, false, false)
	c.unclaimWaitPlace()
	b.leaveWait(context.Background(), bus.WaitingApproval, false, false)
	b.unclaimWaitPlace()
	if w.places.held != 0 || len(w.places.queue) != 0 || w.OffSlot() != 0 || len(w.slots) != 3 {
		t.Fatalf("at the end: places %d, queued %d, off slot %d, slots taken %d", w.places.held, len(w.places.queue), w.OffSlot(), len(w.slots))
	}
}
