package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// Approvals (docs/protocol.md §13): the page lists the calls that wait
// across the fleet as `submit approvals` does (bus.PendingApprovals), and
// answers one with the protocol's answer body.

// approvalsScan bounds the records read to find the waiting runs. Waiting
// runs heartbeat, so they are near the top; a run handed back by a drained
// worker sits where its record was last written.
const approvalsScan = 20_000

// approvalsPage is the body of GET /api/approvals.
type approvalsPage struct {
	Calls []bus.PendingCall `json:"calls"`
	// Next is the cursor of the next page ("before"), absent on the last.
	Next string `json:"next,omitempty"`
	// Scanned of Stored records read; Truncated: the scan stopped at its
	// bound, so older waiting runs may be missing.
	Scanned   int    `json:"scanned"`
	Stored    uint64 `json:"stored"`
	Truncated bool   `json:"truncated,omitempty"`
	// AllowControl: the page shows the answer buttons.
	AllowControl bool `json:"allowControl"`
}

func (s *server) listApprovals(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	o, err := approvalsOptions(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	o.MaxScan = s.approvalsScan
	p, err := s.client.PendingApprovalsPage(ctx, o)
	if err != nil {
		writeError(w, http.StatusBadGateway, "%v", err)
		return
	}
	out := approvalsPage{Calls: p.Calls, Next: p.NextCursor, Scanned: p.Scanned, Stored: p.Stored, Truncated: p.Truncated, AllowControl: s.allowControl}
	if out.Calls == nil {
		out.Calls = []bus.PendingCall{}
	}
	writeJSON(w, http.StatusOK, out)
}

// approvalsPageSize is the runs a page of approvals lists unless asked.
const approvalsPageSize = 100

// approvalsOptions reads the approvals page's query: queue, limit (runs,
// 1 to maxPageSize) and before (a page's next), every problem named.
func approvalsOptions(q url.Values) (bus.ApprovalsOptions, error) {
	o := bus.ApprovalsOptions{Queue: strings.TrimSpace(q.Get("queue")), Limit: approvalsPageSize}
	var problems []string
	if o.Queue != "" && bus.CheckQueue(o.Queue) != nil {
		problems = append(problems, fmt.Sprintf("queue %q must be a queue name", clipTo(o.Queue, 80)))
	}
	if l := strings.TrimSpace(q.Get("limit")); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			problems = append(problems, fmt.Sprintf("limit %q must be a positive number", clipTo(l, 80)))
		}
		o.Limit = min(max(n, 1), maxPageSize)
	}
	if b := strings.TrimSpace(q.Get("before")); b != "" {
		if bus.CheckListCursor(b) != nil {
			problems = append(problems, fmt.Sprintf("before %q must be a page cursor", clipTo(b, 80)))
		}
		o.Cursor = b
	}
	if len(problems) > 0 {
		return o, badQuery("%s", strings.Join(problems, "; "))
	}
	return o, nil
}

// approveBody is the protocol's answer (§13) without "by": the console
// says who answers.
type approveBody struct {
	ToolCallID string         `json:"toolCallId"`
	Decision   string         `json:"decision"`
	Reason     string         `json:"reason,omitempty"`
	Arguments  map[string]any `json:"arguments,omitempty"`
}

// approver is the answer's "by": the basic-auth user, else the operator's
// --approver-name, else "console".
func (s *server) approver(r *http.Request) string {
	by := s.approverName
	if s.auth != nil && s.auth.users != nil {
		by = userOf(r)
	}
	if by == "" {
		by = "console"
	}
	return clipTo(by, bus.MaxApprovalBy)
}

// approve answers one waiting call of a run. The call must be waiting
// (409 otherwise: a page shown before someone else answered); edited
// arguments are checked against the tool's schema from the call's
// request before the answer is sent (422 with the schema's complaint).
func (s *server) approve(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := bus.CheckID(id); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var b approveBody
	if !readJSON(w, r, bus.MaxControlBytes, &b) {
		return
	}
	a := bus.ApprovalAnswer{ToolCallID: b.ToolCallID, Decision: b.Decision, Reason: b.Reason, Arguments: b.Arguments, By: s.approver(r)}
	if p := a.Problems(); len(p) > 0 {
		writeError(w, http.StatusBadRequest, "%s", strings.Join(p, "; "))
		return
	}
	var opts []bus.ControlOption
	if k := r.Header.Get("Idempotency-Key"); k != "" {
		if err := bus.CheckControlID(k); err != nil {
			writeError(w, http.StatusBadRequest, "Idempotency-Key: %v", err)
			return
		}
		opts = append(opts, bus.WithControlID(k))
	}
	timeout := s.answerTimeout
	if timeout <= 0 {
		timeout = answerTimeout
	}
	ctx, endSpan := s.traceAction(r.Context(), r, "approve", id)
	defer endSpan()
	// A retry of an answer this console sent (a double click, a resend
	// after a lost response) gets the first one's answer: by then the
	// call may no longer wait, and it is not sent twice. It waits for the
	// first one's send (bounded by that send's own timeout) before its own
	// timeout starts.
	wctx, wcancel := context.WithTimeout(ctx, 2*timeout)
	sent, prior, err := s.answers.begin(wctx, id, a)
	wcancel()
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "%v", err)
		return
	}
	if prior != nil {
		if prior.answer != answerFingerprint(a) {
			writeError(w, http.StatusConflict, "tool call %s of run %s was already answered from this console (%s)", strconv.Quote(clip(a.ToolCallID)), id, prior.decision)
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]any{"controlSeq": prior.seq, "retry": true})
		return
	}
	// Whatever happens to the send (a panic included), its retries stop
	// waiting: sent is called once, here or by the defer.
	defer sent(0, false)
	ctx, cancel := context.WithTimeout(ctx, timeout) // from when this request sends
	defer cancel()
	seq, status, err := s.sendAnswer(ctx, r, id, a, opts)
	sent(seq, err == nil)
	if err != nil {
		if status == http.StatusUnprocessableEntity {
			writeJSON(w, status, map[string]string{"error": err.Error(), "field": "arguments"})
			return
		}
		writeError(w, status, "%v", err)
		return
	}
	s.log.Info("run approve", "user", userOf(r), "by", a.By, "run", id, "toolCallId", a.ToolCallID,
		"decision", a.Decision, "edited", a.Arguments != nil, "controlSeq", seq)
	writeJSON(w, http.StatusAccepted, map[string]any{"controlSeq": seq})
}

// sendAnswer checks that the call waits and that edited arguments pass
// its schema, then sends the answer; on error, the status to answer with.
func (s *server) sendAnswer(ctx context.Context, r *http.Request, id string, a bus.ApprovalAnswer, opts []bus.ControlOption) (uint64, int, error) {
	if h := s.beforeAnswer; h != nil {
		h(ctx)
	}
	call, status, err := s.waitingCall(ctx, id, a.ToolCallID)
	if err != nil {
		return 0, status, err
	}
	if a.Arguments != nil {
		if msg := checkEdit(call, a.Arguments); msg != "" {
			return 0, http.StatusUnprocessableEntity, errors.New(msg)
		}
	}
	seq, err := s.client.Answer(ctx, id, a, opts...)
	if errors.Is(err, bus.ErrRunFinished) {
		return 0, http.StatusConflict, err
	}
	if err != nil {
		return 0, http.StatusBadGateway, err
	}
	return seq, 0, nil
}

// Answers sent are remembered for retries, at most maxAnswers for
// answersFor each: enough for a double click or a browser's resend.
// An answer's send gives up after answerTimeout.
const (
	maxAnswers    = 1024
	answersFor    = 10 * time.Minute
	answerTimeout = 10 * time.Second
)

// errAnswersBusy: every answer the memo keeps is under way.
var errAnswersBusy = errors.New("too many answers under way; try again")

// answerMemo remembers the answers this console sent, per run and call.
type answerMemo struct {
	max int
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	entries map[string]*sentAnswer // run + "\x00" + toolCallId
}

// sentAnswer is one call's answer: under way until done is closed.
type sentAnswer struct {
	answer   string // answerFingerprint
	decision string
	done     chan struct{}
	seq      uint64 // set before done is closed; 0: not sent
	at       time.Time
}

func newAnswerMemo(max int, ttl time.Duration) *answerMemo {
	return &answerMemo{max: max, ttl: ttl, now: time.Now, entries: map[string]*sentAnswer{}}
}

// answerFingerprint says which answer a request is: retries are equal.
func answerFingerprint(a bus.ApprovalAnswer) string {
	b, _ := json.Marshal([]any{a.Decision, a.Reason, a.Arguments, a.By})
	return string(b)
}

// begin returns the answer sent earlier for the call (once it is no
// longer under way), or, when there is none, a func to call with the
// outcome of sending this one. The lock is never held while waiting.
func (m *answerMemo) begin(ctx context.Context, run string, a bus.ApprovalAnswer) (sent func(seq uint64, ok bool), prior *sentAnswer, err error) {
	key := run + "\x00" + a.ToolCallID
	for {
		m.mu.Lock()
		e := m.entries[key]
		if e != nil && m.now().Sub(e.at) > m.ttl && isDone(e) {
			delete(m.entries, key)
			e = nil
		}
		if e == nil {
			if !m.makeRoom() {
				m.mu.Unlock()
				return nil, nil, errAnswersBusy
			}
			e = &sentAnswer{answer: answerFingerprint(a), decision: a.Decision, done: make(chan struct{}), at: m.now()}
			m.entries[key] = e
			m.mu.Unlock()
			var once sync.Once
			return func(seq uint64, ok bool) {
				once.Do(func() {
					m.mu.Lock()
					if ok {
						e.seq, e.at = seq, m.now()
					} else if m.entries[key] == e {
						delete(m.entries, key) // not sent: a retry sends it
					}
					m.mu.Unlock()
					close(e.done)
				})
			}, nil, nil
		}
		m.mu.Unlock()
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		m.mu.Lock()
		seq := e.seq
		m.mu.Unlock()
		if seq > 0 {
			return nil, e, nil
		}
		// The first send failed and was forgotten: this one tries.
	}
}

// makeRoom drops expired answers, then the oldest sent ones, below max.
// An answer under way is never dropped (a retry of it would be sent
// again): when all max are under way, it reports false and the answer is
// refused for now (each is bounded by its send's timeout).
func (m *answerMemo) makeRoom() bool {
	now := m.now()
	for k, e := range m.entries {
		if now.Sub(e.at) > m.ttl && isDone(e) {
			delete(m.entries, k)
		}
	}
	for len(m.entries) >= m.max {
		oldest := ""
		for k, e := range m.entries {
			if isDone(e) && (oldest == "" || e.at.Before(m.entries[oldest].at)) {
				oldest = k
			}
		}
		if oldest == "" {
			return false
		}
		delete(m.entries, oldest)
	}
	return true
}

func isDone(e *sentAnswer) bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// waitingCall finds a call that waits for an answer: listed in the run's
// record, read from its events (the request, its schema). A call the
// record does not list yet (its request was just published) is looked up
// in the events too.
func (s *server) waitingCall(ctx context.Context, id, callID string) (*bus.PendingCall, int, error) {
	rec, err := s.client.Status(ctx, id)
	if errors.Is(err, bus.ErrRunNotFound) {
		return nil, http.StatusNotFound, errors.New("no run " + id)
	}
	if err != nil {
		return nil, http.StatusBadGateway, err
	}
	if rec.Finished() {
		return nil, http.StatusConflict, errors.New("run " + id + " has finished")
	}
	calls, err := s.client.PendingOfRecord(ctx, rec)
	if err != nil {
		return nil, http.StatusBadGateway, err
	}
	i := slices.IndexFunc(calls, func(c bus.PendingCall) bool { return c.ToolCallID == callID })
	if i < 0 {
		return nil, http.StatusConflict, errors.New("tool call " + strconv.Quote(clip(callID)) + " of run " + id +
			" does not wait for an answer (answered, timed out, or not asked)")
	}
	return &calls[i], 0, nil
}

// checkEdit validates edited arguments against the tool's schema as the
// worker will (agent.Tool.ValidateArguments), when the request carried the
// schema; "" when they pass (or there is nothing to check them with).
func checkEdit(call *bus.PendingCall, args map[string]any) string {
	if len(call.Parameters) == 0 || !localRefsOnly(call.Parameters) {
		return ""
	}
	t := &agent.Tool{Name: call.ToolName, Parameters: call.Parameters}
	if _, err := t.ValidateArguments(args); err != nil {
		return err.Error()
	}
	return ""
}

// localRefsOnly reports whether a schema refers only to itself: the
// validator would load any other reference (a file) on this host.
func localRefsOnly(schema json.RawMessage) bool {
	var doc any
	if json.Unmarshal(schema, &doc) != nil {
		return false
	}
	var walk func(v any) bool
	walk = func(v any) bool {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if s, ok := e.(string); ok && (k == "$ref" || k == "$dynamicRef") && !strings.HasPrefix(s, "#") {
					return false
				}
				if k == "$id" || k == "$schema" && !isStandardSchema(e) {
					return false
				}
				if !walk(e) {
					return false
				}
			}
		case []any:
			for _, e := range x {
				if !walk(e) {
					return false
				}
			}
		}
		return true
	}
	return walk(doc)
}

// isStandardSchema: a $schema the validator knows without loading it.
func isStandardSchema(v any) bool {
	s, _ := v.(string)
	return strings.HasPrefix(s, "http://json-schema.org/") || strings.HasPrefix(s, "https://json-schema.org/")
}

// answerInfo is an approval answer as stored, for GET
// /api/runs/{id}/answers/{seq}: the page shows the arguments an approver
// edited as what ran.
type answerInfo struct {
	ToolCallID string `json:"toolCallId"`
	Decision   string `json:"decision"`
	By         string `json:"by,omitempty"`
	Reason     string `json:"reason,omitempty"`
	// Raw: an edit to no arguments, {}, is kept.
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

func (s *server) getAnswer(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := bus.CheckID(id); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		writeError(w, http.StatusBadRequest, "%q is not a control sequence", r.PathValue("seq"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	names := s.client.Names()
	st, err := s.client.Stream(ctx, names.ControlStream())
	if err != nil {
		writeError(w, http.StatusBadGateway, "%v", err)
		return
	}
	m, err := st.GetMsg(ctx, seq)
	// Only an answer of this run: the sequence is the page's to choose.
	if errors.Is(err, jetstream.ErrMsgNotFound) || err == nil && m.Subject != names.Control(id, bus.KindApprove) {
		writeError(w, http.StatusNotFound, "no approval answer %d for run %s", seq, id)
		return
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, "%v", err)
		return
	}
	var a answerInfo
	if err := json.Unmarshal(m.Data, &a); err != nil {
		writeError(w, http.StatusBadGateway, "answer %d: %v", seq, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}

// clipTo cuts s to at most n bytes, at a rune's start.
func clipTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
