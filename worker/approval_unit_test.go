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
