package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
)

// Approval of tool calls. A gated tool (the request's approval.tools, or
// the worker's ApproveTools) is wrapped so that its execution, after the
// agent's tool_execution_start, first asks for an answer and waits for it
// without a slot (waiting.go). The agent core knows nothing of it: in a
// parallel batch each call's Execute runs on its own goroutine, so gated
// calls of a batch ask together while ungated ones run; in sequential mode
// each asks when reached.
//
// Answers come from the control owner (control.go): each is matched to the
// oldest unresolved gated call with its toolCallId; one that matches
// nothing yet is kept until the run ends (then logged and ignored).

// maxEarlyAnswers and maxEarlyAnswerBytes bound the answers kept for
// calls that have not asked (an answer is up to a control message's size).
const (
	maxEarlyAnswers     = 1024
	maxEarlyAnswerBytes = 1 << 20
)

type answer struct {
	a      bus.ApprovalAnswer
	seq    uint64
	stored time.Time // when AGENTS_CONTROL stored it
	size   int       // its message's bytes
}

// approvals is a run's gated calls and unmatched answers.
type approvals struct {
	mu      sync.Mutex
	pending []*gatedCall // in the order they asked
	early   []answer     // in stream order
	// earlyBytes is the size of the kept answers' messages.
	earlyBytes int
	// resumed are calls an earlier attempt asked for that got no answer:
	// they wait again with their original times, without a new request.
	resumed map[string]bus.PendingApproval
	// deferred are the calls of that batch that never started.
	deferred []agent.Content
}

type gatedCall struct {
	id, tool    string
	requestedAt time.Time
	expiresAt   time.Time
	answers     []answer
	wake        chan struct{}
}

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
	r.approval = p
	r.ungated = map[string]*agent.Tool{}
	for i, t := range r.tools {
		if p.Gates(t.Name) {
			r.ungated[t.Name] = t
			r.tools[i] = r.gateTool(t)
		}
	}
}

// takeOverPending keeps the calls an earlier attempt left waiting: they
// wait again (runPendingCalls) with their original times. deferred are the
// calls of the batch after them that never started: they run after.
func (r *run) takeOverPending(calls []workerproto.PendingCall, deferred []agent.Content) {
	if len(calls) == 0 {
		return
	}
	r.pendingCalls = calls
	r.appr.mu.Lock()
	r.appr.deferred = deferred
	r.appr.resumed = map[string]bus.PendingApproval{}
	for _, c := range calls {
		r.appr.resumed[c.Call.ID] = c.Approval
	}
	// The record has the exact times (the event only its publish time).
	if p := r.prev; p != nil && p.Waiting != nil {
		for _, a := range p.Waiting.Approvals {
			if have, ok := r.appr.resumed[a.ToolCallID]; ok && a.ExpiresAt == have.ExpiresAt && a.RequestedAt > 0 {
				have.RequestedAt = a.RequestedAt
				r.appr.resumed[a.ToolCallID] = have
			}
		}
	}
	r.appr.mu.Unlock()
}

// runPendingCalls waits for the answers of the calls an earlier attempt
// left waiting (together, as their batch did), runs the approved ones,
// and publishes each result as the agent would (tool_execution_end, then
// the toolResult message) as soon as it has it. Then the batch's calls
// that never started run one by one, each asking when reached if gated,
// before the agent continues.
func (r *run) runPendingCalls(ctx context.Context) error {
	calls := r.pendingCalls
	r.pendingCalls = nil
	r.appr.mu.Lock()
	deferred := r.appr.deferred
	r.appr.deferred = nil
	r.appr.mu.Unlock()
	if r.approval == nil {
		r.approval = &bus.Approval{} // the earlier attempt's gate: default bounds
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
			_, err = r.pub.event(string(agent.EventToolExecutionStart), data, 0)
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
		if _, err := r.pub.event(string(evs[j].Type), data, 0); err != nil {
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
	t := r.ungated[c.Name]
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
	res, err := wrap(t).Execute(ctx, c.ID, args, func(agent.ToolResult) {})
	if err != nil {
		return fail(err.Error())
	}
	m.Content, m.Timestamp = res.Content, time.Now().UnixMilli()
	if m.Content == nil {
		m.Content = []agent.Content{}
	}
	return m
}

// endPickupPause ends the clock's pause for an earlier attempt's wait.
func (r *run) endPickupPause() {
	if r.pickupPaused {
		r.pickupPaused = false
		r.clock.resume()
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
// message size bytes) to the oldest waiting call with its id, or keeps it.
func (r *run) deliverApproval(a bus.ApprovalAnswer, seq uint64, stored time.Time, size int) {
	ap := &r.appr
	ap.mu.Lock()
	defer ap.mu.Unlock()
	for _, c := range ap.pending {
		if c.id == a.ToolCallID {
			c.answers = append(c.answers, answer{a, seq, stored, size})
			select {
			case c.wake <- struct{}{}:
			default:
			}
			return
		}
	}
	if len(ap.early) >= maxEarlyAnswers || ap.earlyBytes+size > maxEarlyAnswerBytes {
		r.log.Warn("approval for a call that has not asked ignored: too many kept", "toolCallId", a.ToolCallID, "controlSeq", seq,
			"kept", len(ap.early), "keptBytes", ap.earlyBytes, "bytes", size)
		return
	}
	ap.early = append(ap.early, answer{a, seq, stored, size})
	ap.earlyBytes += size
}

// rejectInvalidApproval tells the approver of a waiting call why an
// answer for it was not taken (tool_approval_rejected); an invalid answer
// for no waiting call is only logged.
func (r *run) rejectInvalidApproval(data []byte, seq uint64, err error) {
	var id struct {
		ToolCallID string `json:"toolCallId"`
	}
	if json.Unmarshal(data, &id) != nil || id.ToolCallID == "" || !r.appr.isWaiting(id.ToolCallID) {
		return
	}
	_, _ = r.pub.fleetEvent(bus.EventToolApprovalRejected, bus.ToolApproval{Type: bus.EventToolApprovalRejected,
		ToolCallID: id.ToolCallID, Reason: clipString(err.Error(), bus.MaxErrorBytes), ControlSeq: seq})
}

// isWaiting reports whether a call with the id waits for its answer.
func (ap *approvals) isWaiting(id string) bool {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	for _, c := range ap.pending {
		if c.id == id {
			return true
		}
	}
	return false
}

// add registers a waiting call and gives it the answers kept for it.
func (ap *approvals) add(c *gatedCall) {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	ap.pending = append(ap.pending, c)
	kept := ap.early[:0]
	for _, e := range ap.early {
		if e.a.ToolCallID == c.id {
			c.answers = append(c.answers, e)
			ap.earlyBytes -= e.size
		} else {
			kept = append(kept, e)
		}
	}
	clear(ap.early[len(kept):])
	ap.early = kept
}

func (ap *approvals) remove(c *gatedCall) {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	for i, p := range ap.pending {
		if p == c {
			ap.pending = append(ap.pending[:i:i], ap.pending[i+1:]...)
			return
		}
	}
}

// next takes the call's queued answers.
func (ap *approvals) next(c *gatedCall) []answer {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	out := c.answers
	c.answers = nil
	return out
}

func (ap *approvals) takeResumed(id string) (bus.PendingApproval, bool) {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	p, ok := ap.resumed[id]
	if ok {
		delete(ap.resumed, id)
	}
	return p, ok
}

// pendingApprovals is the record's waiting.approvals.
func (r *run) pendingApprovals() []bus.PendingApproval {
	ap := &r.appr
	ap.mu.Lock()
	defer ap.mu.Unlock()
	out := make([]bus.PendingApproval, 0, len(ap.pending))
	for _, c := range ap.pending {
		out = append(out, bus.PendingApproval{ToolCallID: c.id, ToolName: c.tool,
			RequestedAt: c.requestedAt.UnixMilli(), ExpiresAt: c.expiresAt.UnixMilli()})
	}
	return out
}

// logUnmatchedApprovals logs the answers no call took (the run's end).
func (r *run) logUnmatchedApprovals() {
	ap := &r.appr
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
// call's result carries (denied, timed out, stopped).
func (r *run) awaitApproval(ctx context.Context, t *agent.Tool, id string, args map[string]any) (map[string]any, error) {
	p := r.approval
	c := &gatedCall{id: id, tool: t.Name, wake: make(chan struct{}, 1)}
	if prior, ok := r.appr.takeResumed(id); ok {
		c.requestedAt, c.expiresAt = time.UnixMilli(prior.RequestedAt), time.UnixMilli(prior.ExpiresAt)
		r.log.Info("gated tool call still waits for its answer", "toolCallId", id, "tool", t.Name, "expiresAt", c.expiresAt)
	} else {
		c.requestedAt = time.UnixMilli(time.Now().UnixMilli()) // as the record and events say it
		c.expiresAt = c.requestedAt.Add(time.Duration(p.Timeout()) * time.Second)
		if _, err := r.pub.fleetEvent(bus.EventToolApprovalRequested, bus.ToolApproval{Type: bus.EventToolApprovalRequested,
			ToolCallID: id, ToolName: t.Name, Args: nonNilMap(args), ExpiresAt: c.expiresAt.UnixMilli(), Parameters: approvalSchema(t)}); err != nil {
			return nil, err
		}
		r.w.obs.ApprovalRequested(r.info())
		r.log.Info("gated tool call waits for an answer", "toolCallId", id, "tool", t.Name, "expiresAt", c.expiresAt)
	}
	r.appr.add(c)
	r.hb.now() // the record lists the call
	handedBack := false
	defer func() {
		if !handedBack { // a handed-back run's record still lists it
			r.appr.remove(c)
			r.hb.now()
		}
	}()

	var got *answer
	var edited map[string]any
	timedOut := false
	r.toolBusy(-1) // the call waits: with no other call running, the run leaves its slot
	defer r.toolBusy(1)
	timeOut := func() {
		timedOut = true
		if p.Aborts() {
			// Stopped before the wait ends: the run finishes without
			// taking a slot again.
			r.tally.abortWith(bus.ReasonApprovalTimeout, fmt.Sprintf("tool call %s (%s) was not approved within %s",
				id, t.Name, time.Duration(p.Timeout())*time.Second))
			r.stop()
		}
	}
	err := r.waitOffSlot(ctx, bus.WaitingApproval, c.requestedAt, func(wctx context.Context) error {
		defer func() { r.traceApprovalDecision(wctx, id, got, timedOut) }() // trace.go
		timer := time.NewTimer(time.Until(c.expiresAt))
		defer timer.Stop()
		expired := false
		for {
			for _, a := range r.appr.next(c) {
				if got != nil {
					r.log.Info("further answer to a resolved call ignored", "toolCallId", id, "controlSeq", a.seq)
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
						_, _ = r.pub.fleetEvent(bus.EventToolApprovalRejected, bus.ToolApproval{Type: bus.EventToolApprovalRejected,
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
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("stopped while waiting for approval: %w", err)
	case timedOut:
		reason := fmt.Sprintf("not approved within %s", time.Duration(p.Timeout())*time.Second)
		r.resolved(id, bus.DecisionTimeout, "", reason, 0, waited)
		if p.Aborts() {
			r.log.Warn("gated tool call not answered in time; the run aborted", "toolCallId", id)
		}
		return nil, fmt.Errorf("tool call %s", reason)
	}
	a := got.a
	r.resolved(id, a.Decision, a.By, a.Reason, got.seq, waited)
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

func (r *run) resolved(id, decision, by, reason string, seq uint64, waited time.Duration) {
	_, _ = r.pub.fleetEvent(bus.EventToolApprovalResolved, bus.ToolApproval{Type: bus.EventToolApprovalResolved,
		ToolCallID: id, Decision: decision, By: by, Reason: reason, ControlSeq: seq})
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
