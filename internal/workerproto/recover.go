package workerproto

import (
	"encoding/json"
	"sort"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// InterruptedToolResult is the text of the error result a resumed attempt
// gives a tool call whose result no earlier attempt recorded.
const InterruptedToolResult = "the worker stopped before the result of this tool call was recorded; the tool may or may not have run"

// Recovery is what a new attempt of a run restores from the events that
// earlier attempts stored before its own run_started (crash recovery).
type Recovery struct {
	// Attempt is the newest earlier attempt seen (0: no events).
	Attempt int
	// Messages is the transcript to restore: the readers' view of the
	// earlier attempts (the same bus.Transcript reducer) without its dropped
	// tail. Its length is run_resumed's messagesRestored.
	Messages []agent.Message
	// Dropped counts messages removed from the end of the view: assistant
	// messages that ended aborted, and any message marked interrupted (cut
	// off, or a tool result cancelled, because its worker stopped).
	Dropped int
	// DroppedMessages are those messages, in transcript order.
	DroppedMessages []agent.Message
	// CutOffUsage is the usage of the model calls that attempts before the
	// view's were charged and the view does not have (the cutOffUsage of
	// the run_resumed it rests on). The dropped messages' own usage is not
	// in it: the new attempt adds the part that is its run's.
	CutOffUsage agent.Usage
	// Partial is set when an assistant message was being streamed and never
	// ended (it is not in the view, so nothing to drop).
	Partial bool
	// Synthetic are the tool results the new attempt publishes
	// (message_start/message_end) right after run_resumed, for the tool
	// calls of the last assistant message that have no toolResult message:
	// the result of the call's stored tool_execution_end (it ran, e.g. a
	// parallel sibling of a waiting call), else an error result.
	Synthetic []agent.Message
	// ControlSeqs are the control sequences of the restored messages that
	// came from steering and follow-ups: already delivered.
	ControlSeqs []uint64
	// Pending are the tool calls of the last assistant message that asked
	// for approval (tool_approval_requested) and have neither
	// tool_approval_resolved nor tool_execution_end: they wait again with
	// their original times, without a new request, and get no synthetic
	// result. An approved call without a result gets the synthetic one.
	Pending []PendingCall
	// Deferred are the calls after the first pending call that have no
	// tool_execution_start (a sequential batch stopped at a waiting call):
	// they never ran, so they run, in order, once the pending calls
	// resolve, and get no synthetic result.
	Deferred []agent.Content
	// AnsweredSeqs are the control sequences of the approvals earlier
	// attempts used (resolved or rejected) and of the steer and follow-up
	// messages they rejected (control_rejected): not applied again.
	AnsweredSeqs []uint64
	// Resolved are the gated calls' keys earlier attempts settled, with
	// the outcome (the decision of tool_approval_resolved; "ended" for a
	// call that asked and got its tool_execution_end without one, e.g.
	// stopped while waiting): answers for them are dropped. Keys in
	// Pending or Deferred are not in it.
	Resolved map[string]string
	// UsedKeys are the tool call keys any tool_approval_* or
	// tool_execution_* envelope given names: every attempt's, also those
	// after a gap and those stored after a newer attempt's run_started,
	// which the view leaves out. A new call must not get one of them: an
	// approver may have seen a request with that key for another call
	// (other arguments), and its answer would name the new call.
	UsedKeys map[string]bool
	// Compactions are the view's compaction_end events, failed ones too,
	// in order: the last successful one is where the new attempt's
	// context starts; each one's usage was charged.
	Compactions []*bus.CompactionEnd
	// Finished is set when the run already has its run_finished.
	Finished *bus.RunFinished
	// LastSeq is the seq of the newest attempt's last envelope.
	LastSeq uint64
}

// PendingCall is a gated tool call still waiting for its answer.
type PendingCall struct {
	Call     agent.Content // the tool call, from the assistant message
	Approval bus.PendingApproval
	// AnswersAfter is the request's fence (0 from a worker before 1.8:
	// every answer counts).
	AnswersAfter uint64
}

// Recover rebuilds what a new attempt restores from a run's envelopes, given
// in stream order (those stored before the new attempt's run_started).
// Envelopes of an attempt stored after a newer attempt's run_started are
// left out; within an attempt, envelopes are taken in seq order without
// duplicates. now stamps the synthetic tool results (Unix ms).
func Recover(envs []*bus.Envelope, now int64) *Recovery {
	kept := make([]*bus.Envelope, 0, len(envs))
	newest := 0
	used := usedKeys(envs)
	for _, e := range envs {
		if e.Attempt < newest {
			continue
		}
		newest = e.Attempt
		kept = append(kept, e)
	}
	// Attempts are non-decreasing in kept: sorting by (attempt, seq) only
	// reorders within an attempt (a re-sent event stored late).
	sort.SliceStable(kept, func(i, j int) bool {
		if kept[i].Attempt != kept[j].Attempt {
			return kept[i].Attempt < kept[j].Attempt
		}
		return kept[i].Seq < kept[j].Seq
	})
	// Only an attempt's gapless prefix counts: events missing from the
	// middle (lost with a cluster node, re-sent later, after this read)
	// would leave a view without its beginning, e.g. a transcript without
	// its prompt. What follows a gap is restored by nobody: the run goes on
	// from the prefix, as readers do from what run_resumed says.
	t := &bus.Transcript{}
	gates := approvalTracker{requested: map[string]bus.PendingApproval{}, after: map[string]uint64{}, done: map[string]bool{},
		started: map[string]bool{}, ended: map[string]agent.Message{}, resolved: map[string]string{}}
	var answered []uint64
	var compactions []*bus.CompactionEnd
	attempt, next := 0, uint64(1)
	for _, e := range kept {
		if e.Attempt != attempt {
			attempt, next = e.Attempt, 1
		}
		if e.Seq != next {
			if e.Seq > next {
				next = ^uint64(0) // a gap: skip the rest of this attempt
			}
			continue
		}
		next++
		_ = t.Apply(e)
		if e.Type == bus.EventCompactionEnd {
			if ev, err := e.Decode(); err == nil && ev.CompactionEnd != nil {
				compactions = append(compactions, ev.CompactionEnd)
			}
		}
		if s := gates.apply(e); s > 0 {
			answered = append(answered, s)
		}
	}
	t.FallBackToEarlierAttempts()
	rec := &Recovery{Attempt: t.Attempt, Finished: t.Finished, LastSeq: t.LastSeq, Partial: t.Partial() != nil, UsedKeys: used}
	msgs := t.Messages
	n := len(msgs)
	for n > 0 {
		m := &msgs[n-1]
		if !t.Interrupted(n-1) && (m.Role != agent.RoleAssistant || m.StopReason != agent.StopReasonAborted) {
			break
		}
		n--
	}
	rec.Dropped = len(msgs) - n
	rec.DroppedMessages = append([]agent.Message(nil), msgs[n:]...)
	rec.CutOffUsage = t.CutOffUsage()
	rec.Messages = append([]agent.Message(nil), msgs[:n]...)
	for i := range n {
		if s := t.ControlSeq(i); s > 0 {
			rec.ControlSeqs = append(rec.ControlSeqs, s)
		}
	}
	rec.AnsweredSeqs = answered
	rec.Compactions = compactions
	rec.Pending = gates.pending(rec.Messages)
	rec.Deferred = gates.deferred(rec.Messages, rec.Pending)
	skip := map[string]bool{}
	for _, p := range rec.Pending {
		skip[p.Call.ID] = true
	}
	for _, c := range rec.Deferred {
		skip[c.ID] = true
	}
	for k, outcome := range gates.resolved {
		if !skip[k] {
			if rec.Resolved == nil {
				rec.Resolved = map[string]string{}
			}
			rec.Resolved[k] = outcome
		}
	}
	for _, m := range missingToolResults(rec.Messages, now) {
		if skip[m.ToolCallID] {
			continue
		}
		if end, ok := gates.ended[m.ToolCallID]; ok {
			end.Timestamp = now
			m = end
		}
		rec.Synthetic = append(rec.Synthetic, m)
	}
	return rec
}

// usedKeys is Recovery.UsedKeys: the toolCallId of every envelope of
// envs whose event is about one tool call (nil when none).
func usedKeys(envs []*bus.Envelope) map[string]bool {
	var used map[string]bool
	for _, e := range envs {
		switch e.Type {
		case bus.EventToolApprovalRequested, bus.EventToolApprovalResolved, bus.EventToolApprovalRejected,
			string(agent.EventToolExecutionStart), string(agent.EventToolExecutionUpdate), string(agent.EventToolExecutionEnd):
		default:
			continue
		}
		var ev struct {
			ToolCallID string `json:"toolCallId"`
		}
		if json.Unmarshal(e.Event, &ev) != nil || ev.ToolCallID == "" {
			continue
		}
		if used == nil {
			used = map[string]bool{}
		}
		used[ev.ToolCallID] = true
	}
	return used
}

// deferred returns the calls of the last assistant message after the first
// pending one that never started.
func (g *approvalTracker) deferred(msgs []agent.Message, pending []PendingCall) []agent.Content {
	if len(pending) == 0 {
		return nil
	}
	last := lastAssistant(msgs)
	if last < 0 {
		return nil
	}
	waiting := map[string]bool{}
	for _, p := range pending {
		waiting[p.Call.ID] = true
	}
	var out []agent.Content
	after := false
	for _, c := range msgs[last].ToolCalls() {
		switch {
		case waiting[c.ID]:
			after = true
		case after && !g.started[c.ID]:
			out = append(out, c)
		}
	}
	return out
}

// approvalTracker follows the approval events of the current assistant
// message's tool calls (an assistant message_end starts afresh: call ids
// may repeat across turns).
type approvalTracker struct {
	requested map[string]bus.PendingApproval
	after     map[string]uint64 // the requests' answersAfter
	done      map[string]bool   // resolved, or its tool_execution_end came
	started   map[string]bool   // its tool_execution_start came
	// ended are the results of the calls' tool_execution_end, as
	// toolResult messages.
	ended map[string]agent.Message
	// resolved are the keys settled in any turn (not cleared): see
	// Recovery.Resolved.
	resolved map[string]string
}

// apply takes one envelope; it returns the control sequence of an answer
// the event used, or of a control message it rejected (0: none).
func (g *approvalTracker) apply(e *bus.Envelope) uint64 {
	switch e.Type {
	case string(agent.EventMessageEnd), string(agent.EventToolExecutionStart), string(agent.EventToolExecutionEnd),
		bus.EventToolApprovalRequested, bus.EventToolApprovalResolved, bus.EventToolApprovalRejected,
		bus.EventControlRejected:
	default:
		return 0
	}
	ev, err := e.Decode()
	if err != nil {
		return 0
	}
	switch {
	case ev.Control != nil:
		return ev.Control.ControlSeq
	case ev.Agent != nil && ev.Type == string(agent.EventMessageEnd):
		if m := ev.Agent.Message; m != nil && m.Role == agent.RoleAssistant {
			clear(g.requested)
			clear(g.after)
			clear(g.done)
			clear(g.started)
			clear(g.ended)
		}
	case ev.Agent != nil && ev.Type == string(agent.EventToolExecutionStart):
		g.started[ev.Agent.ToolCallID] = true
	case ev.Agent != nil && ev.Type == string(agent.EventToolExecutionEnd):
		a := ev.Agent
		if _, asked := g.requested[a.ToolCallID]; asked && !g.done[a.ToolCallID] {
			g.resolved[a.ToolCallID] = "ended"
		}
		g.done[a.ToolCallID] = true
		g.started[a.ToolCallID] = true
		if a.Result != nil && !e.Interrupted {
			m := agent.Message{Role: agent.RoleToolResult, ToolCallID: a.ToolCallID, ToolName: a.ToolName,
				Content: a.Result.Content, IsError: a.IsError != nil && *a.IsError, AddedToolNames: a.Result.AddedToolNames}
			if m.Content == nil {
				m.Content = []agent.Content{}
			}
			g.ended[a.ToolCallID] = m
		}
	case ev.Approval != nil && ev.Type == bus.EventToolApprovalRequested:
		a := ev.Approval
		if _, ok := g.requested[a.ToolCallID]; !ok {
			g.requested[a.ToolCallID] = bus.PendingApproval{ToolCallID: a.ToolCallID, ToolName: a.ToolName,
				RequestedAt: e.TS, ExpiresAt: a.ExpiresAt}
			g.after[a.ToolCallID] = a.AnswersAfter
		}
	case ev.Approval != nil && ev.Type == bus.EventToolApprovalResolved:
		g.done[ev.Approval.ToolCallID] = true
		g.resolved[ev.Approval.ToolCallID] = ev.Approval.Decision
		return ev.Approval.ControlSeq
	case ev.Approval != nil:
		return ev.Approval.ControlSeq
	}
	return 0
}

// pending returns the waiting calls of the last assistant message of
// msgs that have no result.
func (g *approvalTracker) pending(msgs []agent.Message) []PendingCall {
	if len(msgs) == 0 {
		return nil
	}
	last := lastAssistant(msgs)
	if last < 0 {
		return nil
	}
	have := map[string]bool{}
	for _, m := range msgs[last+1:] {
		if m.Role == agent.RoleToolResult {
			have[m.ToolCallID] = true
		}
	}
	var out []PendingCall
	for _, c := range msgs[last].ToolCalls() {
		p, asked := g.requested[c.ID]
		if !asked || g.done[c.ID] || have[c.ID] {
			continue
		}
		have[c.ID] = true
		out = append(out, PendingCall{Call: c, Approval: p, AnswersAfter: g.after[c.ID]})
	}
	return out
}

// missingToolResults returns error results for the tool calls of the last
// assistant message that have no result after it.
func missingToolResults(msgs []agent.Message, now int64) []agent.Message {
	last := lastAssistant(msgs)
	if last < 0 {
		return nil
	}
	have := map[string]bool{}
	for _, m := range msgs[last+1:] {
		if m.Role == agent.RoleToolResult {
			have[m.ToolCallID] = true
		}
	}
	var out []agent.Message
	for _, c := range msgs[last].ToolCalls() {
		if have[c.ID] {
			continue
		}
		have[c.ID] = true
		out = append(out, agent.Message{Role: agent.RoleToolResult, ToolCallID: c.ID, ToolName: c.Name,
			Content: []agent.Content{agent.Text(InterruptedToolResult)}, IsError: true, Timestamp: now})
	}
	return out
}

// EndsWithAnswer reports whether a transcript ends with an assistant
// message that asks for no tool call: the run has its final answer (or
// its final model error) and needs no other model call.
func EndsWithAnswer(msgs []agent.Message) bool {
	if len(msgs) == 0 {
		return false
	}
	m := &msgs[len(msgs)-1]
	return m.Role == agent.RoleAssistant && len(m.ToolCalls()) == 0
}

// lastAssistant is the index of the last assistant message of msgs, -1 if
// none.
func lastAssistant(msgs []agent.Message) int {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == agent.RoleAssistant {
			return i
		}
	}
	return -1
}
