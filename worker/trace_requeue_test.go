package worker

import (
	"context"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/runtrace"
)

// A run requeued after drains while it waits stays in its submitter's
// trace (the copy carries the request's traceparent), and so does a
// give-up: every attempt's invoke_agent is in the submit's trace.
func TestTraceRequeueKeepsTheTrace(t *testing.T) {
	t.Parallel()
	rec, tp := spanRecorder(t)
	c := connectTestServer(t)
	d := &deployTool{}
	cfg := Config{Tools: []*agent.Tool{d.tool()}, MaxDeliver: 2, HeartbeatInterval: time.Second, TracerProvider: tp}
	_, stop := startOn(t, c, cfg)
	sctx, span := tp.Tracer("test").Start(context.Background(), "submit")
	res, err := c.Submit(sctx, "", gatedRequest(&bus.Approval{Tools: []string{"deploy"}}, "prod"))
	span.End()
	if err != nil {
		t.Fatal(err)
	}
	run := res.ID
	handBackTwice(t, c, cfg, run, stop)
	startOn(t, c, cfg)
	waitRecord(t, c, run, "waiting after the requeue", func(r *bus.RunRecord) bool { return r.Attempt > 2 && waitingFor(r, "c1") || r.Finished() })
	sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve"})
	fin := waitRecord(t, c, run, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
	if fin.Attempt < 3 {
		t.Fatalf("finished on attempt %d: the run was not requeued", fin.Attempt)
	}
	for _, sp := range endedSpans(t, rec, fin.Attempt, spanNamed(runtrace.SpanInvoke)) {
		if sp.SpanContext().TraceID() != span.SpanContext().TraceID() {
			t.Fatalf("an invoke_agent span is outside the submit's trace:\n%s", dumpSpans(rec))
		}
	}
}
