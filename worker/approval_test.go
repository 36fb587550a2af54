package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// deployTool records the arguments it ran with; target is required.
type deployTool struct {
	mu  sync.Mutex
	ran []string
}

func (d *deployTool) tool() *agent.Tool {
	return agent.NewTool("deploy", "deploys", func(_ context.Context, a struct {
		Target string `json:"target"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		d.mu.Lock()
		d.ran = append(d.ran, a.Target)
		d.mu.Unlock()
		return agent.TextResult("deployed " + a.Target), nil
	})
}

func (d *deployTool) targets() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return strings.Join(d.ran, ",")
}

var fauxModel = &bus.ModelRef{Provider: "faux", ID: "s"}

// deployScript: one turn calling deploy once per target (ids c1, c2, ...),
// then a final text.
func deployScript(targets ...string) *bus.FauxScript {
	var calls []agent.Content
	for i, t := range targets {
		calls = append(calls, agent.ToolCall(fmt.Sprintf("c%d", i+1), "deploy", map[string]any{"target": t}))
	}
	return &bus.FauxScript{Responses: []agent.ScriptedResponse{
		{Content: calls, StopReason: agent.StopReasonToolUse},
		{Content: []agent.Content{agent.Text("done")}}}}
}

func gatedRequest(approval *bus.Approval, targets ...string) *bus.RunRequest {
	return &bus.RunRequest{Prompt: "deploy", Tools: []string{"deploy"}, Model: fauxModel,
		Faux: deployScript(targets...), Approval: approval}
}

// answer publishes an answer as any NATS client would.
func sendAnswer(t *testing.T, c *bus.Client, run string, a map[string]any) uint64 {
	t.Helper()
	data, _ := json.Marshal(a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := c.JetStream().Publish(ctx, c.Names().Control(run, bus.KindApprove), data)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// runEvents collects a run's decoded events as they come.
type runEvents struct {
	mu   sync.Mutex
	evs  []*bus.Event
	wake chan struct{}
	done chan struct{}
}

func followRun(t *testing.T, c *bus.Client, run string) *runEvents {
	ctx, cancel := context.WithCancel(context.Background())
	re := &runEvents{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(re.done)
		for env, err := range c.Follow(ctx, run) {
			if err != nil {
				if bus.IsFatalFollowError(err) {
					return
				}
				continue
			}
			ev, err := env.Decode()
			if err != nil {
				continue
			}
			re.mu.Lock()
			re.evs = append(re.evs, ev)
			re.mu.Unlock()
			select {
			case re.wake <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-re.done })
	return re
}

// waitFor returns the n-th (1-based) event of type typ, waiting for it.
func (re *runEvents) waitFor(t *testing.T, typ string, n int) *bus.Event {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		re.mu.Lock()
		seen := 0
		for _, ev := range re.evs {
			if ev.Type == typ {
				if seen++; seen == n {
					re.mu.Unlock()
					return ev
				}
			}
		}
		re.mu.Unlock()
		select {
		case <-re.wake:
		case <-re.done:
			t.Fatalf("the run ended without %s #%d; events: %s", typ, n, re.types())
		case <-deadline:
			t.Fatalf("no %s #%d within 30s; events: %s", typ, n, re.types())
		}
	}
}

func (re *runEvents) finished(t *testing.T) *bus.RunFinished {
	t.Helper()
	return re.waitFor(t, bus.EventRunFinished, 1).RunFinished
}

// types lists the events so far, tool calls and approvals with their ids.
func (re *runEvents) types() string {
	re.mu.Lock()
	defer re.mu.Unlock()
	var out []string
	for _, ev := range re.evs {
		s := ev.Type
		switch {
		case ev.Approval != nil:
			s += ":" + ev.Approval.ToolCallID
			if ev.Approval.Decision != "" {
				s += ":" + ev.Approval.Decision
			}
		case ev.Agent != nil && ev.Agent.ToolCallID != "":
			s += ":" + ev.Agent.ToolCallID
		case ev.Type == string(agent.EventMessageUpdate) || ev.Type == string(agent.EventMessageStart) || ev.Type == string(agent.EventMessageEnd):
			continue
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// count returns how many events of a type came.
func (re *runEvents) count(typ string) int {
	re.mu.Lock()
	defer re.mu.Unlock()
	n := 0
	for _, ev := range re.evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// toolResults returns the run's tool results by call id.
func toolResults(t *testing.T, c *bus.Client, run string) map[string]agent.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := c.LoadTranscript(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]agent.Message{}
	for _, m := range tr.Messages {
		if m.Role == agent.RoleToolResult {
			out[m.ToolCallID] = m
		}
	}
	return out
}

func submitRun(t *testing.T, c *bus.Client, req *bus.RunRequest) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.Submit(ctx, "", req)
	if err != nil {
		t.Fatal(err)
	}
	return res.ID
}

// waitRecord waits until the run's record satisfies ok.
func waitRecord(t *testing.T, c *bus.Client, run string, what string, ok func(*bus.RunRecord) bool) *bus.RunRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	var last *bus.RunRecord
	for {
		select {
		case e := <-w.Updates():
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			rec, err := bus.DecodeRecord(e)
			if err != nil {
				continue
			}
			if last = rec; ok(rec) {
				return rec
			}
		case <-ctx.Done():
			t.Fatalf("record of %s never %s; last %+v", run, what, last)
		}
	}
}

func waitingFor(rec *bus.RunRecord, ids ...string) bool {
	if rec.State != bus.StateRunning || rec.Waiting == nil || rec.Waiting.For != bus.WaitingApproval || len(rec.Waiting.Approvals) != len(ids) {
		return false
	}
	for i, a := range rec.Waiting.Approvals {
		if a.ToolCallID != ids[i] {
			return false
		}
	}
	return true
}

func approvalWorker(t *testing.T, cfg Config) (*Worker, *bus.Client, *deployTool) {
	d := &deployTool{}
	cfg.Tools = append(cfg.Tools, d.tool())
	w, c := startInternal(t, cfg, nil)
	return w, c, d
}

func TestApprovalApproveRunsTheCall(t *testing.T) {
	w, c, d := approvalWorker(t, Config{Concurrency: 2})
	run := submitRun(t, c, gatedRequest(&bus.Approval{Tools: []string{"dep*"}}, "prod"))
	re := followRun(t, c, run)
	req := re.waitFor(t, bus.EventToolApprovalRequested, 1).Approval
	if req.ToolCallID != "c1" || req.ToolName != "deploy" || req.Args["target"] != "prod" || req.ExpiresAt <= time.Now().UnixMilli() {
		t.Fatalf("request %+v", req)
	}
	rec := waitRecord(t, c, run, "waiting for c1", func(r *bus.RunRecord) bool { return waitingFor(r, "c1") })
	if a := rec.Waiting.Approvals[0]; a.ExpiresAt != req.ExpiresAt || a.ToolName != "deploy" || rec.Waiting.Since.IsZero() {
		t.Fatalf("record waiting %+v, request %+v", rec.Waiting, req)
	}
	if d.targets() != "" {
		t.Fatal("the gated call ran before its answer")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	listed, err := c.List(ctx, bus.ListOptions{State: bus.StateWaiting})
	if err != nil || len(listed) != 1 || listed[0].ID != run {
		t.Fatalf("list waiting: %v %+v", err, listed)
	}
	if w.OffSlot() != 1 {
		t.Fatalf("%d runs off their slot, want 1", w.OffSlot())
	}
	seq := sendAnswer(t, c, run, map[string]any{"toolCallId": "c1", "decision": "approve", "by": "alice"})
	res := re.waitFor(t, bus.EventToolApprovalResolved, 1).Approval
	if res.Decision != bus.DecisionApprove || res.By != "alice" || res.ControlSeq != seq {
		t.Fatalf("resolved %+v, want approve by alice at %d", res, seq)
	}
	if fin := re.finished(t); fin.Status != bus.StatusSucceeded {
		t.Fatalf("finished %+v", fin)
	}
	if d.targets() != "prod" {
		t.Fatalf("deploy ran with %q", d.targets())
	}
	// The approval events sit between the call's start and end.
	if got, want := re.types(), "tool_execution_start:c1 tool_approval_requested:c1 tool_approval_resolved:c1:approve tool_execution_end:c1"; !strings.Contains(got, want) {
		t.Fatalf("events %s, want %s in them", got, want)
	}
	final := waitRecord(t, c, run, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
	if final.Waiting != nil || w.OffSlot() != 0 {
		t.Fatalf("after the run: record waiting %+v, %d off slot", final.Waiting, w.OffSlot())
	}
}
