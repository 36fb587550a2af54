package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/natserr"
	"github.com/agentfleet/agentfleet/internal/workerproto"
	"github.com/agentfleet/agentfleet/worker/internal/eventpub"
)

// Approval of tool calls. A gated tool (the request's approval.tools, or
// the worker's ApproveTools) is wrapped so that its execution, after the
// agent's tool_execution_start, first asks for an answer and waits for it
// without a slot (waiting.go). The agent core knows nothing of it: in a
// parallel batch each call's Execute runs on its own goroutine, so gated
// calls of a batch ask together while ungated ones run; in sequential mode
// each asks when reached.
//
// Answers come from the control owner (control.go) and name a call by its
// key (internal/callkey: unique within the run). Invariants:
//
//  1. An answer applies to a call only if it names the call's key, and
//     AGENTS_CONTROL stored it after the call began to ask: its stream
//     sequence is above the call's fence, answersAfter, the stream's last
//     sequence read after the call was registered and before its
//     tool_approval_requested was published. Whoever saw the request
//     answered after it was published, so after the read: honest answers
//     pass, also those of a subscriber that sees the event before its
//     store acks it. An answer stored before the read (a late or duplicate
//     one for an earlier call, or one sent before anyone could see the
//     request) never applies; one stored in the round trip between the
//     read and the request can, but its sender saw no request.
//  2. A key takes at most one answer: once it is resolved (approved,
//     denied, timed out, stopped), later answers for it are dropped. A
//     resumed attempt rebuilds the resolved keys from the stored events
//     (workerproto.Recover), and a resumed waiting call keeps its fence.
//  3. An answer not applied for either reason is logged, and the run
//     publishes tool_approval_rejected with the reason and its controlSeq
//     (at most maxStaleRejections per attempt; then only logged), so its
//     sender learns it; a later attempt does not read it again.
//  4. Answers for keys that have not asked are kept, bounded, until a call
//     takes them or a fence passes them (no later fence can be lower: any
//     later call reads the stream after this one did), and logged at the
//     run's end.
//  5. A gated call asks only with a MaxWaiting place for its run
//     (claimWaitPlace): without one it is refused at once, its result an
//     error, and the model goes on; its run keeps its slot and uses no
//     delivery. Its wait is bounded by MaxApprovalTimeout.

// maxEarlyAnswers and maxEarlyAnswerBytes bound the answers kept for
// calls that have not asked (an answer is up to a control message's size).
const (
	maxEarlyAnswers     = 1024
	maxEarlyAnswerBytes = 1 << 20
	// maxStaleRejections bounds the tool_approval_rejected events an
	// attempt publishes for answers it drops (invariant 3).
	maxStaleRejections = 64
)

// approvalPolicy is the run's gate: the request's, widened by the
// worker's ApproveTools.
func (r *run) approvalPolicy() *bus.Approval {
	var req *bus.Approval
	if r.req != nil {
		req = r.req.Approval
	}
	if len(r.w.cfg.ApproveTools) == 0 {
		return req
	}
	p := &bus.Approval{Tools: append([]string(nil), r.w.cfg.ApproveTools...)}
	if req != nil {
		p.Tools = append(p.Tools, req.Tools...)
		p.TimeoutSeconds, p.OnTimeout = req.TimeoutSeconds, req.OnTimeout
	}
	return p
}

// gateTools wraps the run's gated tools.
func (r *run) gateTools() {
	p := r.approvalPolicy()
	if p == nil {
		return
	}
	if c := r.approvalCeiling(); c > 0 && p.Timeout() > c {
		// Lowered, not refused: the request may name no timeout, and the
		// worker's own --approve-tools have the defaults.
		q := *p
		q.TimeoutSeconds = c
		p = &q
		r.gate.clamped = true
	}
	r.gate.policy = p
	r.gate.ungated = map[string]*agent.Tool{}
	for i, t := range r.tools {
		if p.Gates(t.Name) {
			r.gate.ungated[t.Name] = t
			r.tools[i] = r.gateTool(t)
		}
	}
}

// approvalCeiling is the worker's ceiling of a call's wait in seconds
// (MaxApprovalTimeout); 0: none.
func (r *run) approvalCeiling() int {
	if c := r.w.cfg.MaxApprovalTimeout; c > 0 {
		return max(int(c/time.Second), 1)
	}
	return 0
}

// takeOverPending keeps the calls an earlier attempt left waiting: they
// wait again (runPendingCalls) with their original times. deferred are the
// calls of the batch after them that never started: they run after.
func (r *run) takeOverPending(calls []workerproto.PendingCall, deferred []agent.Content) {
	if len(calls) == 0 {
		return
	}
	r.earlier.pendingCalls = calls
	r.gate.calls.mu.Lock()
	r.gate.calls.deferred = deferred
	r.gate.calls.resumed = map[string]workerproto.PendingCall{}
	r.gate.calls.resumedKeys = map[string]bool{}
	for _, c := range calls {
		r.gate.calls.resumed[c.Call.ID] = c
		r.gate.calls.resumedKeys[c.Call.ID] = true
	}
	// The record has the exact times (the event only its publish time).
	if p := r.prev; p != nil && p.Waiting != nil {
		for _, a := range p.Waiting.Approvals {
			if have, ok := r.gate.calls.resumed[a.ToolCallID]; ok && a.ExpiresAt == have.Approval.ExpiresAt && a.RequestedAt > 0 {
				have.Approval.RequestedAt = a.RequestedAt
				r.gate.calls.resumed[a.ToolCallID] = have
			}
		}
	}
	r.gate.calls.mu.Unlock()
}

// runPendingCalls waits for the answers of the calls an earlier attempt
// left waiting (together, as their batch did), runs the approved ones,
// and publishes each result as the agent would (tool_execution_end, then
// the toolResult message) as soon as it has it. Then the batch's calls
// that never started run one by one, each asking when reached if gated,
// before the agent continues.
func (r *run) runPendingCalls(ctx context.Context) error {
	calls := r.earlier.pendingCalls
	r.earlier.pendingCalls = nil
	r.gate.calls.mu.Lock()
	deferred := r.gate.calls.deferred
	r.gate.calls.deferred = nil
	r.gate.calls.mu.Unlock()
	if r.gate.policy == nil {
		r.gate.policy = &bus.Approval{} // the earlier attempt's gate: default bounds
	}
	var mu sync.Mutex // one call's events at a time
	var results []agent.Message
	var failed error
	publish := func(m *agent.Message) {
		mu.Lock()
		defer mu.Unlock()
		if failed != nil || r.waitHandedBack.Load() {
			return // handed back: the calls without a result stay pending in the events
		}
		if err := r.publishToolResult(m); err != nil {
			failed = err
			return
		}
		results = append(results, *m)
	}
	var wg sync.WaitGroup
	for _, pc := range calls {
		wg.Go(func() {
			r.toolBusy(1) // as its tool_execution_start did in the earlier attempt
			defer r.toolBusy(-1)
			m := r.runPendingCall(ctx, pc.Call, r.gateTool)
			publish(&m)
		})
	}
	wg.Wait()
	for _, c := range deferred {
		if failed != nil || r.waitHandedBack.Load() || ctx.Err() != nil {
			break
		}
		data, err := workerproto.AppendAgentEvent(nil, &agent.Event{Type: agent.EventToolExecutionStart,
			ToolCallID: c.ID, ToolName: c.Name, Args: c.Arguments}, workerproto.Refs{})
		if err == nil {
			_, err = r.pub.Event(string(agent.EventToolExecutionStart), data, eventpub.Options{})
		}
		if err != nil {
			failed = err
			break
		}
		r.toolBusy(1)
		m := r.runPendingCall(ctx, c, r.runTool)
		publish(&m)
		r.toolBusy(-1)
	}
	if r.waitHandedBack.Load() {
		return nil
	}
	if failed != nil {
		return failed
	}
	r.agent.SetMessages(append(r.agent.Messages(), results...))
	return nil
}

// publishToolResult publishes a call's tool_execution_end and its
// toolResult message.
func (r *run) publishToolResult(m *agent.Message) error {
	res := agent.ToolResult{Content: m.Content}
	if len(m.Details) > 0 {
		res.Details = m.Details
	}
	evs := []agent.Event{
		{Type: agent.EventToolExecutionEnd, ToolCallID: m.ToolCallID, ToolName: m.ToolName, Result: &res, IsError: m.IsError},
		{Type: agent.EventMessageStart, Message: m},
		{Type: agent.EventMessageEnd, Message: m},
	}
	for j := range evs {
		data, err := workerproto.AppendAgentEvent(nil, &evs[j], workerproto.Refs{})
		if err != nil {
			return err
		}
		if _, err := r.pub.Event(string(evs[j].Type), data, eventpub.Options{}); err != nil {
			return err
		}
	}
	return nil
}

// runTool is the run's tool as the agent has it (gated or not).
func (r *run) runTool(t *agent.Tool) *agent.Tool {
	for _, have := range r.tools {
		if have.Name == t.Name {
			return have
		}
	}
	return t
}

// runPendingCall runs a call of a resumed batch with wrap(tool): the gate
// for a call that waits again, the run's own tool for one that never
// started.
func (r *run) runPendingCall(ctx context.Context, c agent.Content, wrap func(*agent.Tool) *agent.Tool) agent.Message {
	m := agent.Message{Role: agent.RoleToolResult, ToolCallID: c.ID, ToolName: c.Name}
	fail := func(text string) agent.Message {
		m.Content, m.IsError, m.Timestamp = []agent.Content{agent.Text(clipString(text, bus.MaxErrorBytes))}, true, time.Now().UnixMilli()
		return m
	}
	t := r.gate.ungated[c.Name]
	if t == nil {
		for _, have := range r.tools {
			if have.Name == c.Name {
				t = have
			}
		}
	}
	if t == nil {
		return fail(fmt.Sprintf("Tool %s not found", c.Name))
	}
	args, err := validateEdit(t, c.Arguments)
	if err != nil {
		return fail(err.Error())
	}
	// Updates are published as the agent would (run_agent's name the
	// child); those after the call returned are dropped.
	var mu sync.Mutex
	done := false
	update := func(partial agent.ToolResult) {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		data, err := workerproto.AppendAgentEvent(nil, &agent.Event{Type: agent.EventToolExecutionUpdate,
			ToolCallID: c.ID, ToolName: c.Name, Args: c.Arguments, Result: &partial}, workerproto.Refs{})
		if err == nil {
			_, _ = r.pub.Event(string(agent.EventToolExecutionUpdate), data, eventpub.Options{}) // a failed publisher fails the result's publish
		}
	}
	res, err := wrap(t).Execute(ctx, c.ID, args, update)
	mu.Lock()
	done = true
	mu.Unlock()
	if err != nil {
		return fail(err.Error())
	}
	m.Content, m.Timestamp = res.Content, time.Now().UnixMilli()
	if m.Content == nil {
		m.Content = []agent.Content{}
	}
	// The details too (run_agent's name the child: follow --tree).
	switch d := res.Details.(type) {
	case nil:
	case json.RawMessage:
		m.Details = d
	default:
		if b, err := agent.MarshalJSON(d); err == nil {
			m.Details = b
		}
	}
	return m
}

// endPickupPause ends the clock's pause for an earlier attempt's wait,
// and the record's keeping of it (carried): the next record says what
// this attempt waits for, written at once.
func (r *run) endPickupPause() {
	if r.carried.Swap(nil) != nil {
		r.hb.now()
	}
	if r.pickupPaused {
		r.pickupPaused = false
		r.clock.Resume()
	}
}

func (r *run) gateTool(t *agent.Tool) *agent.Tool {
	return &agent.Tool{
		Name: t.Name, Label: t.Label, Description: t.Description, Parameters: t.Parameters,
		ExecutionMode: t.ExecutionMode, PrepareArguments: t.PrepareArguments,
		Execute: func(ctx context.Context, id string, args map[string]any, update agent.UpdateFunc) (agent.ToolResult, error) {
			args, err := r.awaitApproval(ctx, t, id, args)
			if err != nil {
				return agent.ToolResult{}, err
			}
			return t.Execute(ctx, id, args, update)
		},
	}
}

// deliverApproval is the control owner's part: it hands an answer (its
// message size bytes) to the waiting call with its key, drops it if the
// key is resolved, or keeps it.
func (r *run) deliverApproval(a bus.ApprovalAnswer, seq uint64, stored time.Time, size int) {
	ap := &r.gate.calls
	ap.mu.Lock()
	for _, c := range ap.pending {
		if c.id == a.ToolCallID {
			c.answers = append(c.answers, answer{a, seq, stored, size})
			ap.mu.Unlock()
			select {
			case c.wake <- struct{}{}:
			default:
			}
			return
		}
	}
	if decision, ok := ap.resolved[a.ToolCallID]; ok {
		ap.mu.Unlock()
		r.dropAnswer(a.ToolCallID, seq, fmt.Sprintf("tool call %s was already resolved (%s); this answer was not applied", a.ToolCallID, decision))
		return
	}
	defer ap.mu.Unlock()
	if len(ap.early) >= maxEarlyAnswers || ap.earlyBytes+size > maxEarlyAnswerBytes {
		r.log.Warn("approval for a call that has not asked ignored: too many kept", "toolCallId", a.ToolCallID, "controlSeq", seq,
			"kept", len(ap.early), "keptBytes", ap.earlyBytes, "bytes", size)
		return
	}
	ap.early = append(ap.early, answer{a, seq, stored, size})
	ap.earlyBytes += size
}

// dropAnswer logs an answer that is not applied and tells its sender
// (invariant 3). It holds no lock: publishing may wait for the window.
func (r *run) dropAnswer(key string, seq uint64, reason string) {
	r.log.Info("approval answer not applied", "toolCallId", key, "controlSeq", seq, "reason", reason)
	ap := &r.gate.calls
	ap.mu.Lock()
	tell := ap.rejections < maxStaleRejections
	if tell {
		ap.rejections++
	}
	ap.mu.Unlock()
	if tell {
		_, _ = r.pub.Fleet(bus.EventToolApprovalRejected, bus.ToolApproval{Type: bus.EventToolApprovalRejected,
			ToolCallID: key, Reason: clipString(reason, bus.MaxErrorBytes), ControlSeq: seq})
	}
}

// rejectInvalidApproval tells the approver of a waiting call why an
// answer for it was not taken (tool_approval_rejected); an invalid answer
// for no waiting call is only logged.
func (r *run) rejectInvalidApproval(data []byte, seq uint64, err error) {
	var id struct {
		ToolCallID string `json:"toolCallId"`
	}
	if json.Unmarshal(data, &id) != nil || id.ToolCallID == "" || !r.gate.calls.isWaiting(id.ToolCallID) {
		return
	}
	_, _ = r.pub.Fleet(bus.EventToolApprovalRejected, bus.ToolApproval{Type: bus.EventToolApprovalRejected,
		ToolCallID: id.ToolCallID, Reason: clipString(err.Error(), bus.MaxErrorBytes), ControlSeq: seq})
}

// pendingApprovals is the record's waiting.approvals.
func (r *run) pendingApprovals() []bus.PendingApproval {
	ap := &r.gate.calls
	ap.mu.Lock()
	defer ap.mu.Unlock()
	out := make([]bus.PendingApproval, 0, len(ap.pending))
	for _, c := range ap.pending {
		if !c.asked {
			continue // its request is not published yet
		}
		out = append(out, bus.PendingApproval{ToolCallID: c.id, ToolName: c.tool,
			RequestedAt: c.requestedAt.UnixMilli(), ExpiresAt: c.expiresAt.UnixMilli()})
	}
	return out
}

// logUnmatchedApprovals logs the answers no call took (the run's end).
func (r *run) logUnmatchedApprovals() {
	ap := &r.gate.calls
	ap.mu.Lock()
	defer ap.mu.Unlock()
	for _, e := range ap.early {
		r.log.Warn("approval matched no gated call of the run; ignored", "toolCallId", e.a.ToolCallID, "controlSeq", e.seq)
	}
	ap.early = nil
	ap.earlyBytes = 0
}

// awaitApproval asks for an answer to a gated call (unless an earlier
// attempt asked already) and waits for it. It returns the arguments to
// run the call with (the approver's edit, validated), or the error the
// call's result carries (refused, denied, timed out, stopped).
func (r *run) awaitApproval(ctx context.Context, t *agent.Tool, id string, args map[string]any) (map[string]any, error) {
	p := r.gate.policy
	prior, resumed := r.gate.calls.takeResumed(id)
	if !r.claimWaitPlace(resumed) { // waiting.go
		return nil, r.refuseApproval(id, t.Name)
	}
	defer r.unclaimWaitPlace()
	c := &gatedCall{id: id, tool: t.Name, wake: make(chan struct{}, 1)}
	r.gate.calls.add(c)
	var stale []answer
	if resumed {
		c.requestedAt, c.expiresAt = time.UnixMilli(prior.Approval.RequestedAt), time.UnixMilli(prior.Approval.ExpiresAt)
		if ceil := r.approvalCeiling(); ceil > 0 {
			c.expiresAt = minTime(c.expiresAt, c.requestedAt.Add(time.Duration(ceil)*time.Second))
		}
		stale = r.gate.calls.asked(c, prior.AnswersAfter)
		r.log.Info("gated tool call still waits for its answer", "toolCallId", id, "tool", t.Name, "expiresAt", c.expiresAt)
	} else {
		after, err := r.approvalFence(ctx)
		if err == nil {
			c.requestedAt = time.UnixMilli(time.Now().UnixMilli()) // as the record and events say it
			c.expiresAt = c.requestedAt.Add(time.Duration(p.Timeout()) * time.Second)
			_, err = r.pub.Fleet(bus.EventToolApprovalRequested, bus.ToolApproval{Type: bus.EventToolApprovalRequested,
				ToolCallID: id, ToolName: t.Name, Args: nonNilMap(args), ExpiresAt: c.expiresAt.UnixMilli(), AnswersAfter: after,
				Parameters: approvalSchema(t)})
		}
		if err != nil {
			r.gate.calls.remove(c)
			return nil, err
		}
		stale = r.gate.calls.asked(c, after)
		r.w.obs.ApprovalRequested(r.info())
		r.log.Info("gated tool call waits for an answer", "toolCallId", id, "tool", t.Name, "expiresAt", c.expiresAt, "answersAfter", after)
	}
	for _, a := range stale {
		// Kept for a key that has not asked: it would be stored before
		// that call's fence too.
		r.dropAnswer(a.a.ToolCallID, a.seq, fmt.Sprintf("this answer (control sequence %d) names tool call %s, which had not asked for approval when it was stored (a later call's answersAfter is %d); it was not applied",
			a.seq, a.a.ToolCallID, c.after))
	}
	r.hb.now() // the record lists the call
	handedBack := false
	outcome := "stopped"
	defer func() {
		if !handedBack { // a handed-back run's record still lists it
			for _, a := range r.gate.calls.settle(c, outcome) {
				r.dropAnswer(id, a.seq, fmt.Sprintf("tool call %s was already resolved (%s); this answer was not applied", id, outcome))
			}
			r.hb.now()
		}
	}()

	var got *answer
	var edited map[string]any
	timedOut := false
	timeOut := func() {
		timedOut = true
		if p.Aborts() {
			// Stopped before the wait ends: the run finishes without
			// taking a slot again.
			r.tally.AbortWith(bus.ReasonApprovalTimeout, fmt.Sprintf("tool call %s (%s) was not approved within %s",
				id, t.Name, c.expiresAt.Sub(c.requestedAt).Round(time.Second)))
			r.stop()
		}
	}
	// The call waits (with no other call running, the run leaves its
	// slot); waitInCall counts it running again as the wait ends.
	err := r.waitInCall(ctx, bus.WaitingApproval, c.requestedAt, func(wctx context.Context) error {
		defer func() { r.traceApprovalDecision(wctx, id, got, timedOut) }() // trace.go
		timer := time.NewTimer(time.Until(c.expiresAt))
		defer timer.Stop()
		expired := false
		for {
			for _, a := range r.gate.calls.next(c) {
				switch {
				case got != nil:
					r.dropAnswer(id, a.seq, fmt.Sprintf("tool call %s was already resolved (%s); this answer was not applied", id, got.a.Decision))
					continue
				case a.seq <= c.after:
					// Read late (a catch-up): stored before the call asked.
					r.dropAnswer(id, a.seq, fmt.Sprintf("this answer (control sequence %d) was stored before tool call %s asked for approval (answersAfter %d); it was not applied",
						a.seq, id, c.after))
					continue
				}
				if a.stored.After(c.expiresAt) {
					// Sent after the call expired (read late, e.g. on a
					// resume): the call timed out.
					r.log.Info("answer came after the call expired", "toolCallId", id, "controlSeq", a.seq)
					timeOut()
					return nil
				}
				if a.a.Decision == bus.DecisionApprove && a.a.Arguments != nil {
					v, err := validateEdit(t, a.a.Arguments)
					if err != nil {
						r.log.Info("approval's edited arguments refused; the call goes on waiting", "toolCallId", id, "controlSeq", a.seq, "err", err)
						_, _ = r.pub.Fleet(bus.EventToolApprovalRejected, bus.ToolApproval{Type: bus.EventToolApprovalRejected,
							ToolCallID: id, Reason: clipString(err.Error(), bus.MaxErrorBytes), ControlSeq: a.seq})
						continue
					}
					edited = v
				}
				got = &a
			}
			if got != nil {
				return nil
			}
			if expired {
				timeOut()
				return nil
			}
			select {
			case <-c.wake:
			case <-timer.C:
				// An answer that came with the timer (the select may
				// pick either) is taken: one more look at the queue.
				expired = true
			case <-wctx.Done():
				return wctx.Err()
			}
		}
	})
	waited := time.Since(c.requestedAt)
	switch {
	case errors.Is(err, errWaitHandedBack):
		handedBack = true
		r.handBackWhileWaiting()
		r.toolBusy(1) // the call's count, which its own hand-back must not wait for
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("stopped while waiting for approval: %w", err)
	case timedOut:
		outcome = bus.DecisionTimeout
		reason := fmt.Sprintf("not approved within %s", c.expiresAt.Sub(c.requestedAt).Round(time.Second))
		if r.gate.clamped {
			reason += " (this worker's ceiling, --max-approval-timeout)"
		}
		r.resolved(id, bus.DecisionTimeout, "", reason, 0, nil, waited)
		if p.Aborts() {
			r.log.Warn("gated tool call not answered in time; the run aborted", "toolCallId", id)
		}
		return nil, fmt.Errorf("tool call %s", reason)
	}
	a := got.a
	outcome = a.Decision
	r.resolved(id, a.Decision, a.By, a.Reason, got.seq, edited, waited)
	if a.Decision == bus.DecisionDeny {
		text := "tool call denied"
		if a.By != "" {
			text += " by " + a.By
		}
		if a.Reason != "" {
			text += ": " + a.Reason
		}
		return nil, errors.New(text)
	}
	if edited != nil {
		return edited, nil
	}
	return args, nil
}

// Reading a fence is a round trip to the server that a gated call cannot
// ask without: a failure a retry may cure (a reconnect, a new stream
// leader, a try that timed out) is retried with backoff, each try bounded
// by fenceTryTimeout, for at most fenceReadBound and while the call's
// context lasts; only then, or at once for any other failure, is the
// call's result an error.
const (
	fenceTryTimeout = 10 * time.Second
	fenceReadBound  = time.Minute
	fenceFirstPause = 100 * time.Millisecond
	fenceMaxPause   = 2 * time.Second
)

// approvalFence reads the fence of a call about to ask (invariant 1): the
// control stream's last sequence now.
func (r *run) approvalFence(ctx context.Context) (uint64, error) {
	bctx, cancel := context.WithTimeout(ctx, fenceReadBound)
	defer cancel()
	pause := fenceFirstPause
	for try := 1; ; try++ {
		last, err := r.readFence(bctx)
		if err == nil {
			return last, nil
		}
		if bctx.Err() != nil || !(natserr.Transient(err) || errors.Is(err, context.DeadlineExceeded)) {
			return 0, fmt.Errorf("cannot ask for approval: reading the control stream (%d tries): %w", try, err)
		}
		r.log.Warn("reading the control stream to ask for approval failed; retrying", "try", try, "err", err)
		t := time.NewTimer(pause + rand.N(pause))
		select {
		case <-t.C:
		case <-bctx.Done():
			t.Stop()
			return 0, fmt.Errorf("cannot ask for approval: reading the control stream (%d tries): %w", try, err)
		}
		pause = min(2*pause, fenceMaxPause)
	}
}

// readFence is one try of approvalFence, with its own timeout.
func (r *run) readFence(ctx context.Context) (uint64, error) {
	tctx, cancel := context.WithTimeout(ctx, fenceTryTimeout)
	defer cancel()
	return r.w.controlReads.lastSeq(tctx)
}

// refuseApproval is a gated call's refusal past MaxWaiting (invariant 5).
func (r *run) refuseApproval(id, tool string) error {
	r.w.obs.ApprovalRefused(r.info(), "max_waiting")
	r.log.Warn("gated tool call refused: the worker's runs waiting off their slots are at --max-waiting", "toolCallId", id, "tool", tool,
		"maxWaiting", r.w.cfg.MaxWaiting)
	return fmt.Errorf("tool call %s was not run: the fleet has too many runs waiting for approval (this worker's limit is %d, --max-waiting); it cannot ask now",
		id, max(r.w.cfg.MaxWaiting, 0))
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// resolved publishes a call's outcome; edited is the approver's edit of
// its arguments (nil: none), so readers see what the call runs with.
func (r *run) resolved(id, decision, by, reason string, seq uint64, edited map[string]any, waited time.Duration) {
	_, _ = r.pub.Fleet(bus.EventToolApprovalResolved, bus.ToolApproval{Type: bus.EventToolApprovalResolved,
		ToolCallID: id, Decision: decision, By: by, Reason: reason, ControlSeq: seq, Arguments: edited})
	r.w.obs.ApprovalResolved(r.info(), decision, waited)
	r.log.Info("gated tool call resolved", "toolCallId", id, "decision", decision, "by", by, "controlSeq", seq, "waited", waited)
}

// validateEdit checks an approver's arguments as the model's are checked.
func validateEdit(t *agent.Tool, args map[string]any) (map[string]any, error) {
	if t.PrepareArguments != nil {
		var err error
		if args, err = t.PrepareArguments(args); err != nil {
			return nil, err
		}
	}
	return t.ValidateArguments(args)
}

// approvalSchema is the schema an approver's edit must pass, for the
// request event; too large a one is left out (the worker checks anyway).
func approvalSchema(t *agent.Tool) json.RawMessage {
	if p := t.ParametersOrDefault(); len(p) <= bus.MaxApprovalSchemaBytes && json.Valid(p) {
		return p
	}
	return nil
}

func nonNilMap(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

// decodeApproval is the control owner's decoding of an approve message.
func decodeApproval(data []byte) (bus.ApprovalAnswer, error) {
	return workerproto.DecodeApproval(data)
}
