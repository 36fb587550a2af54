package worker

import (
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
	r := &run{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	const size = 200 << 10
	for i := range 10 {
		r.deliverApproval(bus.ApprovalAnswer{ToolCallID: fmt.Sprintf("x%d", i), Decision: bus.DecisionApprove}, uint64(i+1), time.Now(), size)
	}
	if n, b := len(r.appr.early), r.appr.earlyBytes; n != maxEarlyAnswerBytes/size || b > maxEarlyAnswerBytes {
		t.Fatalf("kept %d answers, %d bytes; want %d within %d", n, b, maxEarlyAnswerBytes/size, maxEarlyAnswerBytes)
	}
	// A call that asks takes its answer: room for another.
	r.appr.add(&gatedCall{id: "x0", wake: make(chan struct{}, 1)})
	r.deliverApproval(bus.ApprovalAnswer{ToolCallID: "late", Decision: bus.DecisionDeny}, 99, time.Now(), size)
	if n := len(r.appr.early); n != maxEarlyAnswerBytes/size {
		t.Fatalf("kept %d answers after one was taken and another came", n)
	}
}

// Waiting places: a new gated call gets one while one is free (a run's
// calls share one), is refused past them, and a call an earlier attempt
// asked for still waits (on its slot). A place is given back once the
// run's last claim ends.
func TestApprovalWaitPlaces(t *testing.T) {
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
	if w.places != 1 {
		t.Fatalf("%d places held while a call still claims one", w.places)
	}
	a.unclaimWaitPlace()
	if w.places != 0 || !b.claimWaitPlace(false) {
		t.Fatalf("%d places held after the last claim, or the place was not free again", w.places)
	}
	b.unclaimWaitPlace()
	keep := &run{w: &Worker{cfg: Config{MaxWaiting: -1}}}
	if !keep.claimWaitPlace(false) || keep.wait.place {
		t.Fatal("with MaxWaiting -1 a call was refused or took a place")
	}
}
