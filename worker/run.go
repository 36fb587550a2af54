package worker

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/llm/faux"
)

// run is one attempt at one run request.
type run struct {
	w           *Worker
	msg         jetstream.Msg
	id, queue   string
	attempt     int
	reqSeq      uint64
	submittedAt time.Time
	startedAt   time.Time
	log         *slog.Logger

	req      *bus.RunRequest
	limits   bus.Limits
	modelRef bus.ModelRef
	notice   string
	toolList []string
	prompt   []agent.Message
	agent    *agent.Agent
	ctl      *controls
	pub      *publisher
	cancel   context.CancelFunc

	// listener state: the agent calls its listener one event at a time.
	msgSeqs          []uint64
	toolSeqs         []uint64
	lastAssistantSeq uint64

	mu            sync.Mutex
	turns         int
	usage         agent.Usage
	lastAssistant *agent.Message
	abortReason   *string
	limitReason   string
	limitText     string
	tooLarge      error
	pubErr        error
}

func (w *Worker) handle(m jetstream.Msg) {
	queue, runID, err := w.names.ParseSubmit(m.Subject())
	if err != nil {
		// No events: the subject cannot name a run safely.
		w.log.Error("request with an invalid subject terminated", "subject", clipString(m.Subject(), 200), "err", err)
		_ = m.TermWithReason("invalid subject: " + clipString(err.Error(), 200))
		return
	}
	r := &run{w: w, msg: m, id: runID, queue: queue, startedAt: time.Now()}
	if md, err := m.Metadata(); err == nil {
		r.attempt = int(md.NumDelivered)
		r.reqSeq = md.Sequence.Stream
		r.submittedAt = md.Timestamp
	}
	r.attempt = max(r.attempt, 1)
	r.log = w.log.With("run", runID, "queue", queue, "attempt", r.attempt)
	r.ctl = newControls(r)
	r.execute()
}

func (r *run) info() RunInfo {
	return RunInfo{ID: r.id, Queue: r.queue, Attempt: r.attempt, Model: r.modelRef.String(),
		SubmittedAt: r.submittedAt, StartedAt: r.startedAt}
}

func (r *run) execute() {
	w := r.w
	ctx := w.hardCtx
	rec, err := w.getRecord(ctx, r.id)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		r.log.Warn("cannot read the run record; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return
	}
	if rec != nil && rec.Finished() {
		if rec.RequestSeq == r.reqSeq {
			// This request already ran to its end; only the ack was lost.
			r.log.Info("request already finished; acknowledging", "state", rec.State)
			_ = r.msg.Ack()
			return
		}
		// A new request reusing a finished run's id. Its record and events
		// stay untouched: a run has exactly one run_finished.
		r.log.Warn("bad request: run id already used by a finished run; terminated", "state", rec.State)
		_ = r.msg.TermWithReason("bad_request: run id already used by a finished run")
		return
	}
	if r.attempt > 1 {
		// Seam for issue 7: resume from the run's events instead of
		// starting over (restore the transcript, skip delivered controls,
		// publish run_resumed). Until then a redelivered run starts over.
		r.log.Info("redelivered request: starting the run over")
	}
	req, err := bus.DecodeRunRequest(r.msg.Data(), r.id)
	r.req = req
	if err == nil {
		err = r.plan(ctx)
	}
	if err != nil {
		r.badRequest(err)
		return
	}
	r.start()
}

// plan resolves the request against the worker: model, provider, tools,
// continueFrom, and builds the Agent.
func (r *run) plan(ctx context.Context) error {
	w, req := r.w, r.req
	r.limits = req.EffectiveLimits()
	ref := w.defaultModel
	if req.Model != nil {
		ref = *req.Model
	}
	r.modelRef = ref
	if req.Faux != nil && ref.Provider != "faux" {
		return bus.BadRequest(`"faux" is only for the faux provider, but the model is %s`, ref)
	}
	p := w.providers[ref.Provider]
	if p == nil {
		return bus.BadRequest("unknown model provider %q: this worker has %s", ref.Provider, w.providerNames())
	}
	model := p.Model(ref.ID)
	if model.ID == "" {
		model.ID = ref.ID
	}
	if model.Provider == "" {
		model.Provider = ref.Provider
	}
	stream := p.Stream
	if req.Faux != nil {
		resps := make([]faux.Response, len(req.Faux.Responses))
		for i, fr := range req.Faux.Responses {
			resps[i] = faux.Response{Content: fr.Content, StopReason: fr.StopReason, ErrorMessage: fr.ErrorMessage}
		}
		fm := faux.New(faux.Options{TokenSize: req.Faux.TokenSize, TokensPerSecond: req.Faux.TokensPerSecond}, resps...)
		stream = fm.Stream
		model = agent.Model{ID: ref.ID, Name: ref.ID, API: "faux", Provider: "faux"}
	} else if n, ok := p.(Noticer); ok {
		r.notice = n.Notice()
	}
	tools := make([]*agent.Tool, 0, len(req.Tools))
	r.toolList = []string{}
	for _, name := range req.Tools {
		t := w.tools[name]
		if t == nil {
			return bus.BadRequest("unknown tool %q: this worker has %v", clipString(name, 64), w.toolNames)
		}
		tools = append(tools, t)
		r.toolList = append(r.toolList, name)
	}
	if req.ContinueFrom != "" {
		prior, err := r.loadPrior(ctx, req.ContinueFrom)
		if err != nil {
			return err
		}
		r.prompt = append(r.prompt, prior...)
	}
	r.prompt = append(r.prompt, req.Messages...)
	if req.Prompt != "" {
		r.prompt = append(r.prompt, agent.UserText(req.Prompt, req.Images...))
	}
	r.agent = agent.New(agent.Options{
		SystemPrompt:        req.SystemPrompt,
		Model:               model,
		ThinkingLevel:       req.ThinkingLevel,
		Tools:               tools,
		StreamFn:            r.observeStream(stream),
		ShouldStopAfterTurn: r.shouldStop,
		SteeringMode:        req.SteeringMode,
		FollowUpMode:        req.FollowUpMode,
		ToolExecution:       req.ToolExecution,
		SessionID:           r.id,
		Temperature:         req.Temperature,
		MaxTokens:           req.MaxTokens,
	})
	r.agent.Subscribe(r.onEvent)
	return nil
}

// loadPrior loads the transcript of a finished run (continueFrom).
func (r *run) loadPrior(ctx context.Context, id string) ([]agent.Message, error) {
	rec, err := r.w.getRecord(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, bus.BadRequest("continueFrom: run %s not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("continueFrom: %w", err)
	}
	if !rec.Finished() {
		return nil, bus.BadRequest("continueFrom: run %s has not finished (it is %s)", id, rec.State)
	}
	lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	t, err := r.w.c.LoadTranscript(lctx, id)
	if err != nil || !t.Done() {
		return nil, bus.BadRequest("continueFrom: cannot load the events of run %s: %v", id, err)
	}
	return t.Messages, nil
}

func (r *run) badRequest(err error) {
	text := err.Error()
	r.log.Warn("bad request", "err", text)
	r.pub = newPublisher(r.w, r.id, r.attempt, nil)
	started := r.runStarted()
	if r.req != nil {
		started.Model = r.req.Model
		started.Tools = append([]string{}, r.req.Tools...)
	}
	_, _ = r.pub.fleetEvent(bus.EventRunStarted, started)
	fin := bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusFailed, Reason: bus.ReasonBadRequest,
		Error: text, DurationMs: time.Since(r.startedAt).Milliseconds()}
	rec := r.record(bus.StatusFailed)
	rec.Reason, rec.Error, rec.FinishedAt = bus.ReasonBadRequest, text, time.Now()
	_ = r.pub.putRecord(rec, true, true)
	_, _ = r.pub.fleetEvent(bus.EventRunFinished, fin)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(r.w.hardCtx), 30*time.Second)
	defer cancel()
	if err := r.pub.flush(fctx); err != nil {
		r.log.Error("bad request: events not stored; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(time.Second)
		return
	}
	r.w.obs.RunFinished(r.info(), fin)
	_ = r.msg.TermWithReason("bad_request: " + clipString(text, 200))
}

func (r *run) runStarted() bus.RunStarted {
	s := bus.RunStarted{Type: bus.EventRunStarted, Queue: r.queue, Worker: r.w.id, Attempt: r.attempt,
		Tools: r.toolList, Notice: r.notice}
	if s.Tools == nil {
		s.Tools = []string{}
	}
	if !r.modelRef.IsZero() {
		m := r.modelRef
		s.Model = &m
	}
	if r.req != nil {
		s.ContinueFrom, s.Metadata = r.req.ContinueFrom, r.req.Metadata
	}
	if !r.submittedAt.IsZero() {
		s.SubmittedAt = r.submittedAt.UnixMilli()
	}
	return s
}

func (r *run) start() {
	w := r.w
	runCtx, cancel := context.WithCancel(w.hardCtx)
	defer cancel()
	r.cancel = cancel
	timeout := time.Duration(r.limits.TimeoutSeconds) * time.Second
	tctx, tcancel := context.WithTimeout(runCtx, timeout)
	defer tcancel()
	tctx = context.WithValue(tctx, runKey{}, r)

	r.pub = newPublisher(w, r.id, r.attempt, r.publishFailed)
	w.register(r)
	defer w.unregister(r)
	if r.notice != "" {
		r.log.Warn(r.notice)
	}
	_ = r.pub.putRecord(r.record(bus.StateRunning), false, true)
	_, _ = r.pub.fleetEvent(bus.EventRunStarted, r.runStarted())
	w.obs.RunStarted(r.info())
	r.log.Debug("run started", "model", r.modelRef.String())

	r.ctl.catchUp(tctx)
	var runErr error
	if !r.stopping() {
		runErr = r.agent.PromptMessages(tctx, r.prompt...)
		// A steer or follow-up that came after the agent's last poll is
		// still delivered: go on while messages remain.
		for runErr == nil && tctx.Err() == nil && !r.modelFailed() && !r.idleAndDone(tctx) {
			runErr = r.agent.Continue(tctx)
		}
	}
	lastControl := r.ctl.close()

	timedOut := errors.Is(tctx.Err(), context.DeadlineExceeded) && runCtx.Err() == nil
	r.mu.Lock()
	aborted, pubErr := r.abortReason != nil, r.pubErr
	r.mu.Unlock()
	drained := w.hardCtx.Err() != nil && !aborted && !timedOut

	fctx, fcancel := context.WithTimeout(context.WithoutCancel(w.hardCtx), 30*time.Second)
	defer fcancel()
	if pubErr != nil || drained {
		// Stop and hand back: another attempt runs it (issue 7 resumes).
		_ = r.pub.flush(fctx)
		if pubErr != nil {
			r.log.Error("events could not be stored; handing the run back", "err", pubErr)
			_ = r.msg.NakWithDelay(time.Second)
		} else {
			r.log.Warn("worker stopping: run stopped and handed back")
			_ = r.msg.Nak()
			w.obs.RunHandedBack(r.info())
		}
		return
	}
	fin := r.outcome(runErr, timedOut, timeout)
	fin.LastControlSeq = lastControl
	// The final record is published before run_finished, so a follower
	// that saw run_finished reads the final record.
	rec := r.record(fin.Status)
	rec.Reason, rec.Error, rec.FinishedAt = fin.Reason, fin.Error, time.Now()
	_ = r.pub.putRecord(rec, true, true)
	_, _ = r.pub.fleetEvent(bus.EventRunFinished, fin)
	if err := r.pub.flush(fctx); err != nil {
		r.log.Error("run_finished not stored; handing the run back", "err", err)
		_ = r.msg.NakWithDelay(time.Second)
		return
	}
	if err := r.msg.DoubleAck(fctx); err != nil {
		r.log.Warn("ack failed", "err", err)
	}
	w.obs.RunFinished(r.info(), fin)
	r.log.Info("run finished", "status", fin.Status, "reason", fin.Reason, "turns", fin.Turns,
		"tokens", fin.Usage.TotalTokens, "durationMs", fin.DurationMs)
}

func (r *run) outcome(runErr error, timedOut bool, timeout time.Duration) bus.RunFinished {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded, Usage: r.usage,
		Cost: r.usage.Cost.Total, Turns: r.turns, DurationMs: time.Since(r.startedAt).Milliseconds()}
	fail := func(reason, text string) { f.Status, f.Reason, f.Error = bus.StatusFailed, reason, text }
	switch {
	case r.abortReason != nil:
		f.Status, f.Reason, f.Error = bus.StatusAborted, bus.ReasonAbortedByUser, *r.abortReason
		if f.Error == "" {
			f.Error = "aborted by user"
		}
	case timedOut:
		fail(bus.ReasonTimeout, fmt.Sprintf("the run exceeded its timeout of %s", timeout))
	case r.tooLarge != nil:
		fail(bus.ReasonEventTooLarge, r.tooLarge.Error())
	case r.limitReason != "":
		fail(r.limitReason, r.limitText)
	case runErr != nil:
		fail(bus.ReasonInternal, runErr.Error())
	case r.lastAssistant != nil && (r.lastAssistant.StopReason == agent.StopReasonError || r.lastAssistant.StopReason == agent.StopReasonAborted):
		fail(bus.ReasonModelError, r.lastAssistant.ErrorMessage)
	}
	return f
}

// idleAndDone is called when the agent went idle: it reports whether the
// run may finish (no late control message is queued).
func (r *run) idleAndDone(ctx context.Context) bool {
	if h := r.w.beforeIdleCheck; h != nil {
		h(r.id)
	}
	return r.ctl.finishIfIdle(ctx)
}

// abort stops the run at the user's request.
func (r *run) abort(reason string) {
	r.mu.Lock()
	if r.abortReason == nil {
		r.abortReason = &reason
	}
	r.mu.Unlock()
	if r.cancel != nil {
		r.cancel()
	}
	if r.agent != nil {
		r.agent.Abort()
	}
}

func (r *run) publishFailed(err error) {
	r.mu.Lock()
	if r.pubErr == nil {
		r.pubErr = err
	}
	r.mu.Unlock()
	if r.cancel != nil {
		r.cancel()
	}
}

// stopping reports whether the run must not go on (abort, limit, failure).
func (r *run) stopping() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.abortReason != nil || r.limitReason != "" || r.tooLarge != nil || r.pubErr != nil
}

func (r *run) modelFailed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.lastAssistant
	return m != nil && (m.StopReason == agent.StopReasonError || m.StopReason == agent.StopReasonAborted)
}

// shouldStop enforces maxTurns and maxTotalTokens after each turn, when
// the agent would otherwise run another one.
func (r *run) shouldStop(_ context.Context, tc *agent.TurnContext) (bool, error) {
	wantsMore := len(tc.Message.ToolCalls()) > 0 || r.agent.HasQueuedMessages()
	if !wantsMore {
		return false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.turns >= r.limits.MaxTurns:
		r.limitReason = bus.ReasonMaxTurns
		r.limitText = fmt.Sprintf("the run reached its limit of %d turns while the model wanted another", r.limits.MaxTurns)
		return true, nil
	case r.limits.MaxTotalTokens > 0 && r.usage.TotalTokens >= r.limits.MaxTotalTokens:
		r.limitReason = bus.ReasonTokenBudget
		r.limitText = fmt.Sprintf("the run used %d tokens, its budget is %d", r.usage.TotalTokens, r.limits.MaxTotalTokens)
		return true, nil
	}
	return false, nil
}

// onEvent is the agent listener: it publishes every event. A full publish
// window blocks it, and so the agent (back-pressure).
func (r *run) onEvent(_ context.Context, ev agent.Event) error {
	switch ev.Type {
	case agent.EventAgentStart:
		r.msgSeqs = r.msgSeqs[:0]
	case agent.EventTurnStart:
		r.toolSeqs = r.toolSeqs[:0]
	}
	we := bus.NewAgentEvent(&ev)
	var ctlSeq uint64
	switch ev.Type {
	case agent.EventMessageStart:
		ctlSeq = r.ctl.seqOf(ev.Message, false)
	case agent.EventMessageEnd:
		ctlSeq = r.ctl.seqOf(ev.Message, true)
	case agent.EventTurnEnd:
		we.MessageSeq = r.lastAssistantSeq
		we.ToolResultSeqs = lastN(r.toolSeqs, len(ev.ToolResults))
	case agent.EventAgentEnd:
		we.MessageSeqs = lastN(r.msgSeqs, len(ev.Messages))
	}
	data, err := encodeJSON(we)
	if err != nil {
		return err
	}
	seq, err := r.pub.event(string(ev.Type), data, ctlSeq)
	if err != nil {
		var tl *EventTooLargeError
		if errors.As(err, &tl) {
			r.mu.Lock()
			if r.tooLarge == nil {
				r.tooLarge = err
			}
			r.mu.Unlock()
			r.log.Error("event too large for NATS; failing the run", "err", err)
		}
		return err
	}
	switch ev.Type {
	case agent.EventMessageEnd:
		r.msgSeqs = append(r.msgSeqs, seq)
		switch ev.Message.Role {
		case agent.RoleToolResult:
			r.toolSeqs = append(r.toolSeqs, seq)
		case agent.RoleAssistant:
			r.lastAssistantSeq = seq
			m := *ev.Message
			r.mu.Lock()
			r.usage.Add(m.Usage)
			r.lastAssistant = &m
			r.mu.Unlock()
		}
	case agent.EventTurnEnd:
		r.mu.Lock()
		r.turns++
		r.mu.Unlock()
		r.w.obs.Turn(r.info())
	}
	return nil
}

func lastN(s []uint64, n int) []uint64 {
	n = min(n, len(s))
	if n <= 0 {
		return nil
	}
	return append([]uint64(nil), s[len(s)-n:]...)
}

// observeStream reports each model call to the observer.
func (r *run) observeStream(fn agent.StreamFn) agent.StreamFn {
	return func(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			start := time.Now()
			var first time.Duration
			for ev := range fn(ctx, model, llm, opts) {
				if first == 0 {
					first = time.Since(start)
				}
				if (ev.Type == agent.StreamDone || ev.Type == agent.StreamError) && ev.Message != nil {
					r.w.obs.ModelRequest(r.info(), ModelRequest{Model: r.modelRef.String(), Duration: time.Since(start),
						TimeToFirstEvent: first, Usage: ev.Message.Usage, StopReason: ev.Message.StopReason})
				}
				if !yield(ev) {
					return
				}
			}
		}
	}
}

// record is the run record now, in a state.
func (r *run) record(state string) *bus.RunRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := &bus.RunRecord{ID: r.id, Queue: r.queue, State: state, Attempt: r.attempt, Worker: r.w.id,
		RequestSeq: r.reqSeq, SubmittedAt: r.submittedAt, StartedAt: r.startedAt, HeartbeatAt: time.Now(),
		Turns: r.turns, Usage: r.usage, Cost: r.usage.Cost.Total}
	if !r.modelRef.IsZero() {
		rec.Model = r.modelRef.String()
	}
	if r.req != nil {
		rec.Metadata = r.req.Metadata
	}
	return rec
}

// heartbeat keeps the request owned and refreshes the record.
func (r *run) heartbeat() {
	if err := r.msg.InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		r.log.Warn("heartbeat failed", "err", err)
	}
	_ = r.pub.putRecord(r.record(bus.StateRunning), false, false)
}

func (w *Worker) getRecord(ctx context.Context, id string) (*bus.RunRecord, error) {
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e, err := w.kv.Get(gctx, id)
	if err != nil {
		return nil, err
	}
	var rec bus.RunRecord
	if err := jsonUnmarshal(e.Value(), &rec); err != nil {
		return nil, fmt.Errorf("record %s: %w", id, err)
	}
	rec.Revision = e.Revision()
	return &rec, nil
}

func clipString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return clipUTF8(s, n) + "…"
}
