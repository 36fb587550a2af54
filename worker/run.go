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
	startedAt   time.Time // this attempt's pickup
	runStart    time.Time // the first attempt's start: timeout and duration count from it
	log         *slog.Logger
	prev        *bus.RunRecord // the record read at pickup

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

	// a faux script's model, replaced by resume to skip restored turns
	fauxStream agent.StreamFn
	fauxSkip   func(turns int)

	// the lease (lease.go)
	leaseMu   sync.Mutex
	leaseRev  uint64
	leaseDone bool

	mu            sync.Mutex
	turns         int
	usage         agent.Usage
	lastAssistant *agent.Message
	abortReason   *string
	limitReason   string
	limitText     string
	tooLarge      error
	pubErr        error
	lost          bool
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
	r.runStart = r.startedAt
	r.log = w.log.With("run", runID, "queue", queue, "attempt", r.attempt)
	r.ctl = newControls(r)
	r.execute()
}

func (r *run) info() RunInfo {
	i := RunInfo{ID: r.id, Queue: r.queue, Attempt: r.attempt, Model: r.modelRef.String(),
		SubmittedAt: r.submittedAt, StartedAt: r.startedAt}
	if r.limits.TimeoutSeconds > 0 {
		i.Deadline = r.runStart.Add(time.Duration(r.limits.TimeoutSeconds) * time.Second)
	}
	return i
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
	if rec != nil {
		if o := r.classify(rec); o != leaseTaken {
			r.settle(o, rec)
			return
		}
		if !rec.StartedAt.IsZero() && rec.StartedAt.Before(r.runStart) {
			r.runStart = rec.StartedAt
		}
	}
	r.prev = rec
	if r.attempt > 1 {
		r.log.Info("redelivered request: resuming the run")
	}
	req, err := bus.DecodeRunRequest(r.msg.Data(), r.id)
	r.req = req
	if err == nil {
		err = r.plan(ctx)
	}
	if err != nil && !bus.IsBadRequest(err) {
		// NATS trouble while planning (loading continueFrom's run): not the
		// request's fault, so try again later instead of failing it.
		r.log.Warn("cannot prepare the run; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return
	}
	if err != nil {
		r.badRequest(err)
		return
	}
	r.start()
}

// settle handles a request that must not run: its run has finished, or the
// record belongs to another request or a newer attempt.
func (r *run) settle(o leaseOutcome, rec *bus.RunRecord) {
	switch o {
	case leaseFinished:
		if rec.RequestSeq == 0 || rec.RequestSeq == r.reqSeq {
			// This request already ran to its end; only the ack was lost.
			r.alreadyFinished(rec)
			return
		}
		r.reusedID(rec)
	case leaseReused:
		// Another request with this id is running: nothing may touch its
		// record or events.
		r.log.Warn("bad request: run id in use by another running request; terminated", "recordRequestSeq", rec.RequestSeq)
		_ = r.msg.TermWithReason("bad_request: run id in use by another request")
	case leaseNewer:
		// A newer delivery owns the run; this one is stale. Neither ack nor
		// nak: either would act on the newer delivery.
		r.log.Warn("stale delivery of a run a newer attempt owns; ignored", "recordAttempt", rec.Attempt)
	}
}

// alreadyFinished acks a redelivered request whose run has finished. If a
// crash came between the final record and run_finished, run_finished is
// published first (from the record, continuing the last attempt's seq: the
// same Nats-Msg-Id as the one its worker would have used, so it is stored
// once).
func (r *run) alreadyFinished(rec *bus.RunRecord) {
	ctx, cancel := context.WithTimeout(r.w.hardCtx, 30*time.Second)
	defer cancel()
	envs, err := r.w.c.ReadEvents(ctx, r.id, 0)
	if err != nil {
		r.log.Warn("cannot read the run's events; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return
	}
	t := &bus.Transcript{}
	for _, e := range envs {
		_ = t.Apply(e)
	}
	if !t.Done() {
		att := max(t.Attempt, 1)
		p := newPublisher(r.w, r.id, att, nil)
		p.seq = t.LastSeq
		if t.Attempt == 0 {
			// No event at all (the record is written first): run_started
			// still comes first.
			started := r.runStarted()
			started.Attempt = att
			_, _ = p.fleetEvent(bus.EventRunStarted, started)
		}
		fin := bus.RunFinished{Type: bus.EventRunFinished, Status: rec.State, Reason: rec.Reason, Error: rec.Error,
			Usage: rec.Usage, Cost: rec.Cost, Turns: rec.Turns}
		if !rec.FinishedAt.IsZero() && !rec.StartedAt.IsZero() {
			fin.DurationMs = rec.FinishedAt.Sub(rec.StartedAt).Milliseconds()
		}
		_, _ = p.fleetEvent(bus.EventRunFinished, fin)
		if err := p.flush(ctx); err != nil {
			r.log.Warn("run_finished not stored; handing the request back", "err", err)
			_ = r.msg.NakWithDelay(2 * time.Second)
			return
		}
		r.log.Warn("finished run had no run_finished; published it from the record", "state", rec.State)
	}
	r.log.Info("request already finished; acknowledging", "state", rec.State)
	_ = r.msg.Ack()
}

// reusedID rejects a new request whose id belongs to a finished run. It
// gets run_started and run_finished (bad_request) on the run's subject,
// after the original's run_finished, so readers of the original (who stop
// at its run_finished) never see them; the record is not touched. The
// envelopes' Nats-Msg-Id carries the request's stream sequence so they are
// not mistaken for the original's events.
func (r *run) reusedID(rec *bus.RunRecord) {
	text := fmt.Sprintf("run id %q is already used by a finished run (%s); submit with a new id", r.id, rec.State)
	r.log.Warn("bad request: run id already used by a finished run; terminated", "state", rec.State)
	seq := r.reqSeq
	r.pub = newPublisher(r.w, r.id, r.attempt, nil)
	r.pub.msgID = func(s uint64) string { return fmt.Sprintf("%s:req%d:%d", r.id, seq, s) }
	fctx, cancel := context.WithTimeout(context.WithoutCancel(r.w.hardCtx), 30*time.Second)
	defer cancel()
	r.rejectWithEvents(fctx, r.runStarted(), r.badRequestFinished(text), "bad_request: run id already used by a finished run")
}

// badRequestFinished is the run_finished of a bad request.
func (r *run) badRequestFinished(text string) bus.RunFinished {
	return bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusFailed, Reason: bus.ReasonBadRequest,
		Error: text, DurationMs: time.Since(r.startedAt).Milliseconds()}
}

// rejectWithEvents publishes run_started and run_finished on r.pub, waits
// until they are stored, and terminates the request (handing it back if
// the events could not be stored).
func (r *run) rejectWithEvents(ctx context.Context, started bus.RunStarted, fin bus.RunFinished, termReason string) {
	_, _ = r.pub.fleetEvent(bus.EventRunStarted, started)
	_, _ = r.pub.fleetEvent(bus.EventRunFinished, fin)
	if err := r.pub.flush(ctx); err != nil {
		r.log.Error("bad request: events not stored; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(time.Second)
		return
	}
	r.w.obs.RunFinished(r.info(), fin)
	_ = r.msg.TermWithReason(termReason)
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
		opts := faux.Options{TokenSize: req.Faux.TokenSize, TokensPerSecond: req.Faux.TokensPerSecond}
		r.fauxStream = faux.New(opts, resps...).Stream
		// A resumed run's script goes on at the response after the
		// restored turns (see resume): the script is a function of the
		// transcript, as a real model is.
		r.fauxSkip = func(n int) { r.fauxStream = faux.New(opts, resps[min(n, len(resps)):]...).Stream }
		stream = func(ctx context.Context, m agent.Model, llm agent.Context, o agent.StreamOptions) iter.Seq[agent.StreamEvent] {
			return r.fauxStream(ctx, m, llm, o)
		}
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
	if err != nil {
		return nil, fmt.Errorf("continueFrom: loading the events of run %s: %w", id, err)
	}
	if !t.Done() {
		return nil, bus.BadRequest("continueFrom: the events of run %s do not end with run_finished", id)
	}
	return t.Messages, nil
}

func (r *run) badRequest(err error) {
	text := err.Error()
	r.log.Warn("bad request", "err", text)
	started := r.runStarted()
	if r.req != nil {
		started.Model = r.req.Model
		started.Tools = append([]string{}, r.req.Tools...)
	}
	fin := r.badRequestFinished(text)
	rec := r.record(bus.StatusFailed)
	rec.Reason, rec.Error, rec.FinishedAt = bus.ReasonBadRequest, text, time.Now()
	fctx, cancel := context.WithTimeout(context.WithoutCancel(r.w.hardCtx), 30*time.Second)
	defer cancel()
	// The final record first (compare-and-set: it must not overwrite a
	// finished run or a newer attempt), then the events.
	switch o, cur, err := r.takeLease(fctx, r.prev, rec); {
	case err != nil:
		// Without its record the run would look unknown: try again later.
		r.log.Warn("bad request: record not written; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return
	case o != leaseTaken:
		r.settle(o, cur)
		return
	}
	r.pub = newPublisher(r.w, r.id, r.attempt, nil)
	r.rejectWithEvents(fctx, started, fin, "bad_request: "+clipString(text, 200))
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
	// The timeout counts from the run's first start: a crash does not
	// extend a run's budget.
	tctx, tcancel := context.WithDeadline(runCtx, r.runStart.Add(timeout))
	defer tcancel()
	tctx = context.WithValue(tctx, runKey{}, r)
	lctx, lcancel := context.WithTimeout(context.WithoutCancel(w.hardCtx), w.cfg.AckWait)
	defer lcancel()

	// Take the lease before anything is published.
	switch o, cur, err := r.takeLease(lctx, r.prev, r.record(bus.StateRunning)); {
	case err != nil:
		r.log.Warn("cannot take the run's lease; handing the request back", "err", err)
		_ = r.msg.NakWithDelay(2 * time.Second)
		return
	case o != leaseTaken:
		r.settle(o, cur)
		return
	}
	r.pub = newPublisher(w, r.id, r.attempt, r.publishFailed)
	w.register(r)
	defer w.unregister(r)
	hbStop, hbDone := make(chan struct{}), make(chan struct{})
	go r.heartbeatLoop(hbStop, hbDone)
	stopHeartbeat := sync.OnceFunc(func() { close(hbStop); <-hbDone })
	defer stopHeartbeat()
	if r.notice != "" {
		r.log.Warn(r.notice)
	}
	_, _ = r.pub.fleetEvent(bus.EventRunStarted, r.runStarted())
	w.obs.RunStarted(r.info())
	// Every way out of here tells the observer the run left this worker;
	// those that neither finish nor hand back (a lost lease, a failed
	// publish) count as handed back.
	left := false
	defer func() {
		if !left {
			w.obs.RunHandedBack(r.info())
		}
	}()
	r.log.Debug("run started", "model", r.modelRef.String())

	restored := false
	if r.attempt > 1 {
		var err error
		// Resume even when the run was aborted or its deadline passed
		// meanwhile: the outcome below then says so, instead of the
		// attempt being handed back (and redelivered until it gives up).
		restored, err = r.resume(context.WithoutCancel(tctx))
		if errors.Is(err, errAlreadyFinished) {
			stopHeartbeat()
			_ = r.pub.flush(lctx)
			r.log.Info("run already has its run_finished; acknowledging")
			_ = r.msg.Ack()
			return
		}
		if err != nil && !r.leaseIsLost() {
			r.publishFailed(fmt.Errorf("resume: %w", err))
		}
	}

	r.ctl.catchUp(tctx)
	var runErr error
	if !r.stopping() {
		switch {
		case !restored:
			runErr = r.agent.PromptMessages(tctx, r.prompt...)
		case bus.EndsWithAnswer(r.agent.Messages()):
			// The transcript has its final answer: no model call, unless
			// controls are queued (the loop below).
		default:
			runErr = r.agent.Continue(tctx)
		}
		// A steer or follow-up that came after the agent's last poll is
		// still delivered: go on while messages remain.
		for runErr == nil && tctx.Err() == nil && !r.modelFailed() && !r.idleAndDone(tctx) {
			runErr = r.agent.Continue(tctx)
		}
	}
	lastControl := r.ctl.close()
	// The finish has its own deadline, from now: a run of any length
	// finishes on its attempt.
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(w.hardCtx), w.cfg.AckWait)
	defer fcancel()

	timedOut := errors.Is(tctx.Err(), context.DeadlineExceeded) && runCtx.Err() == nil
	r.mu.Lock()
	aborted, pubErr, lost := r.abortReason != nil, r.pubErr, r.lost
	r.mu.Unlock()
	drained := w.hardCtx.Err() != nil && !aborted && !timedOut

	if lost {
		stopHeartbeat()
		r.pub.abandon()
		r.log.Warn("run stopped: lease lost to a newer attempt")
		return
	}
	if pubErr != nil || drained {
		// Stop and hand back: the next attempt resumes from the events.
		stopHeartbeat()
		_ = r.pub.flush(fctx)
		if pubErr != nil {
			r.log.Error("events could not be stored; handing the run back", "err", pubErr)
			_ = r.msg.NakWithDelay(time.Second)
		} else {
			r.log.Warn("worker stopping: run stopped and handed back")
			_ = r.msg.Nak()
			left = true
			w.obs.RunHandedBack(r.info())
		}
		return
	}
	fin := r.outcome(runErr, timedOut, timeout)
	fin.LastControlSeq = lastControl
	// Every event before run_finished is stored, then the final record
	// (the lease's last compare-and-set), then run_finished: a follower
	// that saw run_finished reads the final record, and an attempt that
	// lost the lease publishes no run_finished.
	if err := r.pub.sync(fctx); err != nil {
		stopHeartbeat()
		_ = r.pub.flush(fctx)
		r.log.Error("events could not be stored; handing the run back", "err", err)
		_ = r.msg.NakWithDelay(time.Second)
		return
	}
	rec := r.record(fin.Status)
	rec.Reason, rec.Error, rec.FinishedAt = fin.Reason, fin.Error, time.Now()
	err := r.writeLeased(fctx, rec, true)
	stopHeartbeat()
	if errors.Is(err, errLeaseLost) {
		r.loseLease()
		r.pub.abandon()
		r.log.Warn("run stopped at its end: lease lost to a newer attempt")
		return
	}
	if err != nil {
		_ = r.pub.flush(fctx)
		r.log.Error("final record not stored; handing the run back", "err", err)
		_ = r.msg.NakWithDelay(time.Second)
		return
	}
	_, _ = r.pub.fleetEvent(bus.EventRunFinished, fin)
	if err := r.pub.flush(fctx); err != nil {
		r.log.Error("run_finished not stored; handing the run back", "err", err)
		_ = r.msg.NakWithDelay(time.Second)
		return
	}
	if err := r.msg.DoubleAck(fctx); err != nil {
		r.log.Warn("ack failed", "err", err)
	}
	left = true
	w.obs.RunFinished(r.info(), fin)
	r.log.Info("run finished", "status", fin.Status, "reason", fin.Reason, "turns", fin.Turns,
		"tokens", fin.Usage.TotalTokens, "durationMs", fin.DurationMs)
}

func (r *run) outcome(runErr error, timedOut bool, timeout time.Duration) bus.RunFinished {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded, Usage: r.usage,
		Cost: r.usage.Cost.Total, Turns: r.turns, DurationMs: time.Since(r.runStart).Milliseconds()}
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
	interrupted := false
	switch ev.Type {
	case agent.EventMessageStart:
		ctlSeq = r.ctl.seqOf(ev.Message, false)
	case agent.EventMessageEnd:
		ctlSeq = r.ctl.seqOf(ev.Message, true)
		interrupted = r.cutOff(ev.Message)
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
	seq, err := r.pub.eventFlags(string(ev.Type), data, ctlSeq, interrupted)
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

// cutOff reports whether a message ends because the worker is stopping
// (drain timeout, lost lease, events not stored) rather than by the user's
// abort or a limit: an aborted assistant message, or a tool result that
// failed. Its message_end is marked interrupted, so recovery drops it and
// the next attempt regenerates it.
func (r *run) cutOff(m *agent.Message) bool {
	if m == nil {
		return false
	}
	switch {
	case m.Role == agent.RoleAssistant && m.StopReason == agent.StopReasonAborted:
	case m.Role == agent.RoleToolResult && m.IsError:
	default:
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.abortReason != nil {
		return false
	}
	return r.w.hardCtx.Err() != nil || r.lost || r.pubErr != nil
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
		RequestSeq: r.reqSeq, SubmittedAt: r.submittedAt, StartedAt: r.runStart, HeartbeatAt: time.Now(),
		Turns: r.turns, Usage: r.usage, Cost: r.usage.Cost.Total}
	if !r.modelRef.IsZero() {
		rec.Model = r.modelRef.String()
	}
	if r.req != nil {
		rec.Metadata = r.req.Metadata
	}
	return rec
}

func (w *Worker) getRecord(ctx context.Context, id string) (*bus.RunRecord, error) {
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e, err := w.kv.Get(gctx, id)
	if err != nil {
		return nil, err
	}
	return bus.DecodeRecord(e)
}

func clipString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return clipUTF8(s, n) + "…"
}
