package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/park"
)

// Child runs (protocol 1.10; docs/architecture.md, child runs).
//
// The built-in tool run_agent starts a child run on the fleet and returns
// its final answer. Invariants:
//
//  1. The child's id is the fleet's child key's RunID(parent, call key)
//     (bus.ChildKey): a function of the run and the call alone (the key is
//     run-unique, worker/internal/callkey, and the fleet has one child
//     key), so every attempt of the parent, on any worker, names the same
//     child; and no submitter can compute it, so none takes it first.
//  2. The tool runs only after the call's events are stored (wrapTool's
//     storedBeforeTheCall), and submits only when neither the child's
//     record nor a queued request has the id (a resumed parent on a
//     worker with other ceilings would build another body: the queued
//     one, sealed and linked to this run, is the child): a resumed
//     parent finds the child, queued, running or finished, and waits for
//     it; it never starts it twice. A call an earlier attempt left
//     without a result runs again on resume (runChildCallsLeft) instead
//     of getting the "may or may not have run" result: by 1 it is the
//     same child.
//  3. The bounds are checked before anything is submitted: the depth and
//     count are the request's children bounds capped by the worker's
//     ceilings (Config.MaxChildDepth, MaxChildren), and a child carries
//     the root's bounds, so no level of the tree widens them. The child's
//     tenant is the parent's (its tenant metadata is copied over whatever
//     a scripted request says), and so is its approval policy.
//  4. The parent waits off its slot (waitInCall, wait kind "children"):
//     a worker's slots go to children, not to parents waiting for them.
//  5. A parent stopped by an abort or its deadline aborts the children
//     it waits for (each of them its own in turn); no other stop does (a
//     drain, a lost lease, a failed publish): the next attempt waits for
//     them again (2). A parked parent woken by an
//     abort aborts the children of its calls left without a result.
//  6. A parent that waits only for children (and approvals) parks as one
//     waiting for approvals (worker/park.go): its calls stay without a
//     result in its events. A child, once its run_finished is stored (or
//     a redelivery finds it finished), wakes its parent if the parent's
//     record says parked, the parent named by the child's record (a
//     redelivery has no request), and acks its request only once the
//     wake is published (a failed wake hands it back); the parking attempt, once its record says
//     parked, looks at the records of the children it waited for and
//     wakes itself if one finished. One of the two sees the other (both
//     write their record, then read the other's), so a finished child
//     never leaves its parent parked; extra wakes are dropped
//     (worker/internal/park, invariant 4). The woken attempt finds the
//     children by 2.
//  7. A run is a parent's child only if a worker made it: its request's
//     child link is sealed (child.proof, bus.ChildKey.Seal) and a worker
//     that takes a request checks the seal before anything reads the link
//     (checkChildLink, in plan), so the link in a record or run_started
//     is a worker's. The parent takes a run as its child only when its
//     record's link names it; its id is published (the call's
//     tool_execution_update, details.childRunId) only once its request
//     is stored.

// WaitingChildren: a run waits for its child runs (since 1.10).
const waitingChildren = bus.WaitingChildren

// childArgs are run_agent's arguments.
type childArgs struct {
	Prompt string `json:"prompt" jsonschema:"description=The task for the child agent: it sees only this text"`
	// Request: a child's run request fields; only on workers that run
	// scripted runs (--allow-faux).
	Request map[string]any `json:"request,omitempty" jsonschema:"description=Run request fields for the child (model\\, systemPrompt\\, tools\\, limits\\, faux); only on workers that allow scripted runs"`
}

// childRequest is what run_agent's request argument may set.
type childRequest struct {
	Model        *bus.ModelRef   `json:"model,omitempty"`
	SystemPrompt string          `json:"systemPrompt,omitempty"`
	Tools        []string        `json:"tools,omitempty"`
	Limits       *bus.Limits     `json:"limits,omitempty"`
	Faux         *bus.FauxScript `json:"faux,omitempty"`
}

// runAgentTool is the run_agent tool of the worker.
func (w *Worker) runAgentTool() *agent.Tool {
	t := agent.NewTool(bus.ToolRunAgent,
		"Hand a task to another agent, which runs as its own run on the fleet, and return its final answer. Parallel calls run in parallel.",
		func(ctx context.Context, a childArgs, update agent.UpdateFunc) (agent.ToolResult, error) {
			r, _ := ctx.Value(runKey{}).(*run)
			id, _ := ctx.Value(toolCallKey{}).(string)
			if r == nil || id == "" {
				return agent.ToolResult{}, errors.New("run_agent runs only inside a run")
			}
			text, err := r.runChild(ctx, id, a, update)
			if err != nil {
				return agent.ToolResult{}, err
			}
			res := agent.TextResult(text)
			res.Details = childDetails(r.childID(id))
			return res, nil
		})
	inner := t.Execute
	t.Execute = func(ctx context.Context, id string, args map[string]any, update agent.UpdateFunc) (agent.ToolResult, error) {
		return inner(context.WithValue(ctx, toolCallKey{}, id), id, args, update)
	}
	return t
}

// toolCallKey carries a call's key to the tool (wrapTool).
type toolCallKey struct{}

// childBounds are the tree's bounds for this run: the request's, capped
// by the worker's ceilings (invariant 3).
func (r *run) childBounds() (depth, maxDepth, maxChildren int) {
	maxDepth, maxChildren = r.w.cfg.MaxChildDepth, r.w.cfg.MaxChildren
	if c := r.req.Children; c != nil {
		if c.MaxDepth > 0 {
			maxDepth = min(maxDepth, c.MaxDepth)
		}
		if c.Max > 0 {
			maxChildren = min(maxChildren, c.Max)
		}
	}
	if r.req.Child != nil {
		depth = r.req.Child.Depth
	}
	return depth, maxDepth, maxChildren
}

// childRequest builds the request of the child of call key (invariant 3).
func (r *run) childRequest(id string, a childArgs) (*bus.RunRequest, error) {
	if a.Prompt == "" {
		return nil, errors.New(`run_agent needs a "prompt"`)
	}
	depth, maxDepth, maxChildren := r.childBounds()
	if depth+1 > maxDepth {
		return nil, fmt.Errorf("run_agent refused: the child would be at depth %d, the tree's limit is %d", depth+1, maxDepth)
	}
	if n := r.childrenStarted.Add(1); int(n) > maxChildren {
		return nil, fmt.Errorf("run_agent refused: this run may start at most %d child runs", maxChildren)
	}
	treeMax, root := r.treeLimit() // treebudget.go
	req := &bus.RunRequest{ID: id, Prompt: a.Prompt,
		Children: &bus.Children{MaxDepth: maxDepth, Max: maxChildren},
		Child: &bus.ChildOf{ParentRunID: r.id, RootRunID: root, Depth: depth + 1, TreeMaxCostUsd: treeMax,
			Proof: bus.ProofPlaceholder}} // sealed by startChild
	if !r.modelRef.IsZero() && r.req.Faux == nil {
		m := r.modelRef
		req.Model = &m
	}
	if a.Request != nil {
		if r.w.cfg.NoFaux {
			return nil, errors.New(`run_agent's "request" is only for workers that run scripted runs (--allow-faux)`)
		}
		raw, err := json.Marshal(a.Request)
		if err != nil {
			return nil, fmt.Errorf("run_agent's request: %w", err)
		}
		var cr childRequest
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cr); err != nil {
			return nil, fmt.Errorf("run_agent's request: %w (it takes model, systemPrompt, tools, limits, faux)", err)
		}
		if cr.Model != nil {
			req.Model = cr.Model
		}
		req.SystemPrompt, req.Tools, req.Limits, req.Faux = cr.SystemPrompt, cr.Tools, cr.Limits, cr.Faux
	}
	if req.Model == nil && req.Faux != nil && r.modelRef.Provider == "faux" {
		m := r.modelRef // a scripted child of a scripted parent: the same faux model
		req.Model = &m
	}
	if req.Model == nil && r.req.Faux != nil && req.Faux == nil {
		return nil, errors.New(`run_agent: a scripted parent's child needs a "request" with its own faux script`)
	}
	req.Metadata = r.childTenant()
	req.Priority = r.childLane().RecordPriority() // the subject's (Names.CheckLane)
	// The parent's approval policy over whatever the call asks (the
	// request argument cannot set one): a tool gated for the parent stays
	// gated through a child, and its child's (invariant 3).
	if ap := r.req.Approval; ap != nil {
		c := *ap
		c.Tools = slices.Clone(ap.Tools)
		req.Approval = &c
	}
	if err := req.Validate(id); err != nil {
		return nil, fmt.Errorf("run_agent: %w", err)
	}
	return req, nil
}

// childTenant is the metadata that names the parent's tenant, copied to
// its children whatever they ask (invariant 3).
func (r *run) childTenant() map[string]string {
	md := map[string]string{}
	keys := []string{DefaultTenantKey}
	if tb := r.w.cfg.Budgets; tb != nil && tb.Key != "" {
		keys = append(keys, tb.Key)
	}
	for _, k := range keys {
		if v, ok := r.req.Metadata[k]; ok {
			md[k] = v
		}
	}
	if len(md) == 0 {
		return nil
	}
	return maps.Clone(md)
}

// childLane is where a child is submitted: its parent's lane, the
// parent's priority and tenant token.
func (r *run) childLane() bus.Lane {
	return bus.LaneOf(r.queue, r.lane.EffectivePriority(), r.lane.Tenant)
}

// childID is the run id of the child of call key (invariant 1); "" when
// this worker has no child key.
func (r *run) childID(key string) string {
	if r.w.childKey == nil {
		return ""
	}
	return r.w.childKey.RunID(r.id, key)
}

// childDetails are a run_agent call's details: the child's id (invariant
// 7; readers cannot compute it).
func childDetails(id string) map[string]string {
	return map[string]string{bus.ChildRunIDDetail: id}
}

// runChild starts (or finds) the child of call key and waits for its end.
func (r *run) runChild(ctx context.Context, key string, a childArgs, update agent.UpdateFunc) (string, error) {
	w := r.w
	id := r.childID(key)
	if id == "" {
		return "", errors.New("run_agent: this worker has no child key (the agents_keys bucket, which a 1.10 worker that ensures the streams creates)")
	}
	r.childCall(key)
	// stopped is the call's end when the run stops: only an abort or the
	// deadline ends the child (invariant 5); a lost lease, a failed
	// publish or a drain leaves it to the next attempt, which waits for
	// it. A woken attempt past its deadline stops here, before any read.
	stopped := func() (string, error) {
		if r.stoppedForGood(ctx) {
			r.abortChild(id)
		}
		return "", fmt.Errorf("run_agent: stopped while waiting for child run %s", id)
	}
	if ctx.Err() != nil {
		return stopped()
	}
	rec, err := w.getRecord(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		if lose := w.cfg.loseChild; lose != nil && lose(id) {
			r.log.Info("test: child run lost before its submit", "child", id)
			break
		}
		if err := r.startChild(ctx, id, a); err != nil {
			return "", err
		}
	case err != nil && ctx.Err() != nil:
		return stopped()
	case err != nil:
		return "", fmt.Errorf("run_agent: cannot read the child run %s: %w", id, err)
	case rec.Child == nil || rec.Child.ParentRunID != r.id:
		// Not ours (invariant 7): only a worker's child has the link.
		return "", fmt.Errorf("run_agent: run %s exists and is not this run's child", id)
	default:
		r.childrenStarted.Add(1)
		r.log.Info("child run found: waiting for it", "child", id, "state", rec.State)
	}
	if hook := w.cfg.childStored; hook != nil {
		hook(ctx, id)
	}
	if update != nil {
		update(agent.ToolResult{Content: []agent.Content{}, Details: childDetails(id)}) // its request is stored (invariant 7)
	}
	var final *bus.RunRecord
	// A handed-back wait keeps id in r.awaiting: parkWaiting, which runs
	// after this returns, reads it (invariant 6). The attempt ends there.
	r.await(id, true)
	err = r.waitInCall(ctx, waitingChildren, time.Now(), func(wctx context.Context) error {
		final, err = r.awaitChild(wctx, id) // worker/childwait.go
		return err
	})
	if !errors.Is(err, errWaitHandedBack) {
		r.await(id, false)
	}
	switch {
	case errors.Is(err, errWaitHandedBack):
		r.handBackWhileWaiting()
		r.toolBusy(1) // the call's count, which its own hand-back must not wait for
		return "", err
	case err != nil && ctx.Err() != nil:
		return stopped()
	case err != nil:
		return "", fmt.Errorf("run_agent: child run %s: %w", id, err)
	}
	if final.State != bus.StatusSucceeded {
		msg := fmt.Sprintf("child run %s %s", id, final.State)
		if final.Error != "" {
			msg += ": " + final.Error
		} else if final.Reason != "" {
			msg += ": " + final.Reason
		}
		return "", errors.New(msg)
	}
	t, err := w.c.LoadTranscript(ctx, id)
	if err != nil {
		return "", fmt.Errorf("run_agent: cannot read child run %s's answer: %w", id, err)
	}
	return t.FinalText(), nil
}

// startChild submits the child's request, sealed (invariant 7), unless a
// request for it is queued already (invariant 2).
func (r *run) startChild(ctx context.Context, id string, a childArgs) error {
	w := r.w
	switch ours, err := r.queuedChild(ctx, id); {
	case err != nil:
		return err
	case ours:
		r.childrenStarted.Add(1)
		r.log.Info("child run queued already: waiting for it", "child", id)
		return nil
	}
	req, err := r.childRequest(id, a)
	if err != nil {
		return err
	}
	body, err := agent.MarshalJSON(req)
	if err == nil {
		body, err = w.childKey.Seal(r.queue, body)
	}
	if err != nil {
		return fmt.Errorf("run_agent: cannot seal the child run %s: %w", id, err)
	}
	// ctx holds the call's execute_tool span: the child's trace is its child.
	_, err = w.c.SubmitLane(ctx, r.childLane(), id, body)
	if errors.Is(err, bus.ErrRunIDTaken) {
		// Stored meanwhile by another attempt of this run (a different
		// body): ours if sealed and linked to this run.
		if ours, qerr := r.queuedChild(ctx, id); qerr == nil && ours {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("run_agent: cannot submit the child run %s: %w", id, err)
	}
	r.log.Info("child run submitted", "child", id, "depth", req.Child.Depth)
	return nil
}

// queuedChild reports whether the runs stream holds a request for child
// id, sealed by a worker and linked to this run (invariant 2); a queued
// request for id that is not is an error.
func (r *run) queuedChild(ctx context.Context, id string) (bool, error) {
	// Its lane, or the old subject (queued by a worker before 1.10).
	var m *jetstream.RawStreamMsg
	for _, l := range []bus.Lane{r.childLane(), {Queue: r.queue}} {
		var err error
		m, err = r.w.runsStream.GetLastMsgForSubject(ctx, r.w.names.RequestSubject(l, id))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			if l.Old() {
				return false, nil
			}
			continue
		}
		if err != nil {
			return false, fmt.Errorf("run_agent: cannot read the queued child run %s: %w", id, err)
		}
		break
	}
	var link struct {
		Child *bus.ChildOf `json:"child"`
	}
	if json.Unmarshal(m.Data, &link) != nil || link.Child == nil || link.Child.ParentRunID != r.id ||
		!r.w.childKey.Verify(r.queue, m.Data, link.Child.Proof) {
		return false, fmt.Errorf("run_agent: run %s is queued and is not this run's child", id)
	}
	return true, nil
}

// checkChildLink refuses a request's child link that no worker sealed
// (invariant 7), and drops the proof from what the run keeps (records,
// run_started).
func (r *run) checkChildLink(add func(format string, args ...any)) {
	c := r.req.Child
	if c == nil {
		return
	}
	k := r.w.childKey
	switch {
	case len(c.Proof) != len(bus.ProofPlaceholder):
		// The decoder named the problem.
	case k == nil:
		add("child: this worker cannot check a child link: it has no child key (the agents_keys bucket)")
	case !k.Verify(r.queue, r.request.Data(), c.Proof):
		add("child: the link was not made by a worker of this fleet (child.proof does not match the request): only a worker may submit a child run")
	default:
		c.Proof = ""
		return
	}
	r.req.Child = nil // nothing trusts a link that failed
}

// openChildKey reads (or creates) the fleet's child key (bus.ChildKey);
// without it, run_agent calls fail and child requests are refused.
func (w *Worker) openChildKey(ctx context.Context) {
	k, err := w.c.ChildKey(ctx)
	if err != nil {
		w.log.Warn("child runs off: no child key (create the streams with EnsureStreams; the worker role reads agents_keys)", "err", err)
		return
	}
	w.childKey = k
}

// stoppedForGood reports whether the run stopped for an abort or its
// deadline, the stops that end its children (invariant 5).
func (r *run) stoppedForGood(ctx context.Context) bool {
	return r.tally.Aborted() || errors.Is(context.Cause(ctx), context.DeadlineExceeded) ||
		(r.clock != nil && r.clock.TimedOut())
}

// abortChild aborts a child its stopped parent waited for (invariant 5).
func (r *run) abortChild(id string) {
	reason := "parent run " + r.id + " stopped"
	if r.tally.Aborted() {
		reason = "parent run " + r.id + " aborted"
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.w.hardCtx), 5*time.Second)
	defer cancel()
	if _, err := r.w.c.Abort(ctx, id, reason); err != nil && !errors.Is(err, bus.ErrRunFinished) {
		r.log.Warn("cannot abort a child run", "child", id, "err", err)
	}
}

// takeChildCalls keeps out of a resume's synthetic results ("may or may
// not have run") those of run_agent calls, and keeps the calls for
// runChildCallsLeft (invariant 2). It counts the run's children so far.
func (r *run) takeChildCalls(synthetic, msgs []agent.Message) []agent.Message {
	offered := slices.Contains(r.toolList, bus.ToolRunAgent)
	for _, m := range msgs {
		if m.Role == agent.RoleToolResult && m.ToolName == bus.ToolRunAgent {
			r.childrenStarted.Add(1)
		}
		if m.Role == agent.RoleAssistant {
			for _, c := range m.ToolCalls() {
				if c.Name == bus.ToolRunAgent {
					r.childCall(c.ID)
				}
			}
		}
	}
	if !offered {
		return synthetic
	}
	calls := map[string]agent.Content{}
	for _, m := range msgs {
		if m.Role == agent.RoleAssistant {
			for _, c := range m.ToolCalls() {
				calls[c.ID] = c
			}
		}
	}
	var out []agent.Message
	for _, m := range synthetic {
		if c, ok := calls[m.ToolCallID]; ok && m.ToolName == bus.ToolRunAgent {
			r.earlier.childCalls = append(r.earlier.childCalls, c)
			continue
		}
		out = append(out, m)
	}
	return out
}

// runChildCallsLeft runs the run_agent calls an earlier attempt left
// without a result, together, and publishes their results as the agent
// would (the toolResult message) before the agent continues.
func (r *run) runChildCallsLeft(ctx context.Context) error {
	calls := r.earlier.childCalls
	r.earlier.childCalls = nil
	var mu sync.Mutex // one call's events at a time
	var results []agent.Message
	var failed error
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Go(func() {
			r.toolBusy(1) // as its tool_execution_start did in the earlier attempt
			defer r.toolBusy(-1)
			m := r.runPendingCall(ctx, c, r.runTool)
			mu.Lock()
			defer mu.Unlock()
			if failed != nil || r.waitHandedBack.Load() {
				return // handed back: the next attempt runs the call again
			}
			if err := r.publishToolResult(&m); err != nil {
				failed = err
				return
			}
			results = append(results, m)
		})
	}
	wg.Wait()
	if failed != nil || r.waitHandedBack.Load() {
		return failed
	}
	r.agent.SetMessages(append(r.agent.Messages(), results...))
	return nil
}

// await adds the child id to the children the run waits for, or removes
// it.
func (r *run) await(id string, on bool) {
	a := &r.awaiting
	a.Lock()
	defer a.Unlock()
	if a.ids == nil {
		a.ids = map[string]bool{}
	}
	if on {
		a.ids[id] = true
	} else {
		delete(a.ids, id)
	}
}

// awaitsChildren reports whether a run_agent call of the attempt waits
// for its child (or did, when the park ended its wait).
func (r *run) awaitsChildren() bool {
	a := &r.awaiting
	a.Lock()
	defer a.Unlock()
	return len(a.ids) > 0
}

// childFinished reports whether a child the parked run waited for has
// finished (invariant 6); a failed read counts as finished: the wake is
// harmless, a run parked for ever is not. A child without a record is
// queued (or lost: the parent's timer at its deadline wakes it, park.go):
// waking for it would only park again.
func (r *run) childFinished(ctx context.Context) bool {
	a := &r.awaiting
	a.Lock()
	ids := slices.Collect(maps.Keys(a.ids))
	a.Unlock()
	for _, id := range ids {
		rec, err := r.w.getRecord(ctx, id)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil || rec.Finished() {
			return true
		}
	}
	return false
}

// wakeParent wakes the parked parent (link's) of a finished child
// (invariant 6). The link comes from the child's record or request: a
// redelivery that finds the child finished has no request (prepare did
// not run). An error means the wake is not known to be published: the
// caller hands the child's request back instead of acking it, so its
// redelivery wakes again (the parent's park timer is not armed for
// children).
func (r *run) wakeParent(ctx context.Context, link *bus.ChildOf) error {
	if link == nil {
		return nil
	}
	parent := link.ParentRunID
	// The parent's call waiting in a worker learns it from the notice
	// (worker/childwait.go); a parked one from the wake below.
	r.w.noticeChildDone(parent, r.id)
	rec, err := r.w.getRecord(ctx, parent)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err == nil && (rec.Parked == nil || rec.Finished()) {
		return nil
	}
	env := r.w.parking
	if err == nil && env == nil {
		var s jetstream.Stream
		if s, err = r.w.js.Stream(ctx, r.w.names.ParkedStream()); err == nil {
			env = &park.Env{JS: r.w.js, Names: r.w.names, Runs: r.w.runsStream, Parked: s, Read: r.w.getRecord, Log: r.w.log}
		}
	}
	if err == nil {
		if f := r.w.cfg.wakeFault; f != nil {
			err = f(parent)
		}
	}
	if err == nil {
		err = env.Wake(ctx, rec)
	}
	if err != nil {
		r.log.Error("cannot wake the parked parent of this child run; handing the request back", "parent", parent, "err", err)
		return err
	}
	r.log.Info("woke the parked parent", "parent", parent)
	return nil
}

// childLink is the parent link of the run's request, if any.
func (r *run) childLink() *bus.ChildOf {
	if r.req == nil {
		return nil
	}
	return r.req.Child
}

// abortChildrenLeft aborts the children of the calls an earlier attempt
// left without a result, when this attempt stops before it waits for
// them (an abort woke a parked parent: invariant 5).
func (r *run) abortChildrenLeft() {
	for _, c := range r.earlier.childCalls {
		if id := r.childID(c.ID); id != "" {
			r.abortChild(id)
		}
	}
	r.earlier.childCalls = nil
}

// childCall records the key of a run_agent call of the run (childKeys).
func (r *run) childCall(key string) {
	k := &r.childKeys
	k.Lock()
	defer k.Unlock()
	if k.keys == nil {
		k.keys = map[string]bool{}
	}
	k.keys[key] = true
}

// treeCost is own plus the cost of every child run the run's run_agent
// calls started, each child's own tree counted (its record's treeCost,
// else its cost); ok is false for a run that started none. A child still
// running (its parent aborted) counts what it spent so far. The calls are
// childKeys and those in the agent's messages: a resumed attempt's
// context lacks the calls a compaction summarised (worker/compaction.go),
// the events it read have them.
func (r *run) treeCost(own float64) (total float64, ok bool) {
	if r.agent == nil || !slices.Contains(r.toolList, bus.ToolRunAgent) {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(r.w.hardCtx, 5*time.Second)
	defer cancel()
	k := &r.childKeys
	k.Lock()
	keys := maps.Clone(k.keys)
	k.Unlock()
	if keys == nil {
		keys = map[string]bool{}
	}
	for _, m := range r.agent.Messages() {
		if m.Role != agent.RoleAssistant {
			continue
		}
		for _, c := range m.ToolCalls() {
			if c.Name == bus.ToolRunAgent {
				keys[c.ID] = true
			}
		}
	}
	total = own
	for key := range keys {
		id := r.childID(key)
		if id == "" {
			continue
		}
		rec, err := r.w.getRecord(ctx, id)
		if err != nil {
			continue // refused before it was submitted, or unreadable
		}
		ok = true
		if rec.TreeCost > 0 {
			total += rec.TreeCost
		} else {
			total += rec.Cost
		}
	}
	return total, ok
}
