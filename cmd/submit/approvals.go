package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

func cmdApprovals(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "approvals", "submit approvals [--queue Q] [--limit N] [--before @CURSOR] [--json]")
	var cf conn
	var queue, before string
	var limit int
	var asJSON bool
	cf.register(fs.FlagSet, e)
	fs.StringVar(&queue, "queue", "", "only runs of this queue")
	fs.IntVar(&limit, "limit", 100, "at most this many runs (a page; 0: all)")
	fs.StringVar(&before, "before", "", "the next page: @CURSOR as the page before printed it")
	fs.BoolVar(&asJSON, "json", false, "print a JSON array of pending approvals")
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	var problems []string
	if len(pos) > 0 {
		problems = append(problems, fmt.Sprintf("approvals takes no arguments (got %q); to submit the prompt %q: submit -- %s", pos[0], "approvals", "approvals"))
	}
	if queue != "" {
		if err := bus.CheckQueue(queue); err != nil {
			problems = append(problems, fmt.Sprintf("--queue: %v", err))
		}
	}
	if limit < 0 {
		problems = append(problems, "--limit must not be negative")
	}
	cursor, hasAt := strings.CutPrefix(before, "@")
	if before != "" && (!hasAt || bus.CheckListCursor(cursor) != nil) {
		problems = append(problems, fmt.Sprintf("--before %q: use @CURSOR, as a page printed it", cut(before, 80)))
	}
	if len(problems) > 0 {
		return fail(e, usagef("%s", strings.Join(problems, "; ")))
	}
	ctx, cancel := interruptible(ctx, e)
	defer cancel()
	c, err := cf.connect(ctx, e)
	if err != nil {
		return fail(e, err)
	}
	defer c.Close()
	page, err := c.PendingApprovalsPage(ctx, bus.ApprovalsOptions{Queue: queue, Limit: limit, Cursor: cursor})
	if err != nil {
		return fail(e, fleetError(c, err))
	}
	ps := page.Calls
	if page.NextCursor != "" {
		// On stderr: stdout stays the page (a table or JSON).
		more := "more"
		if page.Truncated {
			more = fmt.Sprintf("stopped after reading %d records; more", page.Scanned)
		}
		fmt.Fprintf(e.stderr, "%s: submit approvals%s --limit %d --before @%s\n", more, queueFlag(queue), limit, page.NextCursor)
	}
	if asJSON {
		return writeJSON(e, orEmpty(ps))
	}
	if len(ps) == 0 {
		fmt.Fprintln(e.stderr, "no pending approvals")
		return exitOK
	}
	now := time.Now()
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tCALL\tTOOL\tARGUMENTS\tWAITING\tEXPIRES")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Run, field(cut(p.ToolCallID, 40)), field(cut(p.ToolName, 40)),
			cut(field(string(p.Args)), 60), roughDuration(now.Sub(p.WaitingSince)), expiresIn(now, p.ExpiresAt))
	}
	_ = tw.Flush()
	return exitOK
}

// queueFlag is " --queue Q" for a next-page hint, "" without a queue.
func queueFlag(q string) string {
	if q == "" {
		return ""
	}
	return " --queue " + q
}

// expiresIn says when an approval expires, relative to now.
func expiresIn(now, t time.Time) string {
	switch {
	case t.IsZero():
		return "-"
	case !t.After(now):
		return "now"
	}
	return "in " + roughDuration(t.Sub(now))
}

// clockTime is a local time of day, with the date when not today.
func clockTime(t time.Time) string {
	t = t.Local()
	if y, m, d := t.Date(); time.Now().Local().Format("2006-01-02") != fmt.Sprintf("%04d-%02d-%02d", y, m, d) {
		return t.Format("2006-01-02 15:04")
	}
	return t.Format("15:04:05")
}

// roughDuration is a wait as a person reads it: 45s, 12m, 23h59m, 6d.
func roughDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func cmdApprove(ctx context.Context, e *env, args []string) int {
	return answer(ctx, e, args, bus.DecisionApprove)
}

func cmdDeny(ctx context.Context, e *env, args []string) int {
	return answer(ctx, e, args, bus.DecisionDeny)
}

// answer sends an approval answer after checking the call is pending.
func answer(ctx context.Context, e *env, args []string, decision string) int {
	usage := "submit approve RUN CALL [--args JSON] [--by NAME] [--wait D]"
	if decision == bus.DecisionDeny {
		usage = "submit deny RUN CALL --reason TEXT [--by NAME] [--wait D]"
	}
	fs := newFlagSet(e, decision, usage)
	var cf conn
	var argsJSON, by, reason string
	var wait time.Duration
	cf.register(fs.FlagSet, e)
	fs.DurationVar(&wait, "wait", 0, "wait this long for the run to ask for an approval (for scripts that submit and answer)")
	fs.StringVar(&by, "by", e.getenv("USER"), "who answers, shown in the run's events (display text, at most 128 bytes) [USER]")
	if decision == bus.DecisionApprove {
		fs.StringVar(&argsJSON, "args", "", "replace the call's arguments with this JSON object (the worker checks it against the tool's schema)")
		fs.StringVar(&reason, "reason", "", "why (optional)")
	} else {
		fs.StringVar(&reason, "reason", "", "why (the model sees it in the call's error result)")
	}
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 2 {
		return fail(e, usagef("%s takes a run id and a tool call id: %s (submit approvals lists them)", decision, usage))
	}
	if decision == bus.DecisionDeny && strings.TrimSpace(reason) == "" {
		return fail(e, usagef("deny needs --reason TEXT (the model sees it)"))
	}
	a := bus.ApprovalAnswer{ToolCallID: pos[1], Decision: decision, Reason: reason, By: by}
	if argsJSON != "" {
		if err := json.Unmarshal([]byte(argsJSON), &a.Arguments); err != nil || a.Arguments == nil {
			return fail(e, usagef("--args must be a JSON object (the call's new arguments)"))
		}
	}
	if p := a.Problems(); len(p) > 0 {
		return fail(e, usagef("%s", strings.Join(p, "; ")))
	}
	id := pos[0]
	ctx, endTrace := cf.traceCommand(ctx, e, "agentfleet."+decision) // trace.go
	defer endTrace()
	ctx, c, rec, release, err := openRun(ctx, e, &cf, id)
	if err != nil {
		return fail(e, err)
	}
	defer release()
	if rec.Finished() {
		return fail(e, fmt.Errorf("run %s is %s: nothing to %s", id, rec.State, decision))
	}
	pending, err := c.PendingOf(ctx, id)
	if err == nil && len(pending) == 0 && wait > 0 {
		pending, err = waitAsked(ctx, c, id, wait)
	}
	if err != nil {
		return fail(e, fleetError(c, err))
	}
	if !hasCall(pending, a.ToolCallID) {
		return fail(e, notPending(id, a.ToolCallID, pending))
	}
	seq, err := c.Answer(ctx, id, a)
	if err != nil {
		return fail(e, finishedError(err, decision))
	}
	fmt.Fprintf(e.stdout, "%s sent for call %s of run %s (control sequence %d)\n", decision, field(a.ToolCallID), id, seq)
	return exitOK
}

// waitAsked follows a run until a call of it waits for approval or it
// finishes, at most d, and returns its pending calls then.
func waitAsked(ctx context.Context, c *bus.Client, run string, d time.Duration) ([]bus.PendingCall, error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var envs []*bus.Envelope
	for env, err := range c.Follow(wctx, run) {
		if err != nil {
			if bus.IsFatalFollowError(err) {
				break
			}
			continue
		}
		envs = append(envs, env)
		if env.Type == bus.EventRunFinished || env.Type == bus.EventToolApprovalRequested && len(bus.PendingCalls(envs)) > 0 {
			break
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return c.PendingOf(ctx, run)
}

func hasCall(ps []bus.PendingCall, id string) bool {
	for _, p := range ps {
		if p.ToolCallID == id {
			return true
		}
	}
	return false
}

// notPending is the error for a call that waits for no answer.
func notPending(run, call string, ps []bus.PendingCall) error {
	if len(ps) == 0 {
		return fmt.Errorf("call %s of run %s is not pending: the run waits for no approval", field(cut(call, 80)), run)
	}
	return fmt.Errorf("call %s of run %s is not pending; pending: %s", field(cut(call, 80)), run, callList(ps))
}

// callList names pending calls: "c1 (deploy), c2 (pay)".
func callList(ps []bus.PendingCall) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = field(cut(p.ToolCallID, 40)) + " (" + field(cut(p.ToolName, 40)) + ")"
	}
	return strings.Join(parts, ", ")
}

// approvalPromptWords: approvals, approve and deny are commands only when
// nothing but their own flags comes before them (see promptWords).
func approvalPromptWords(name string) func(e *env) *flag.FlagSet {
	return func(e *env) *flag.FlagSet {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		var cf conn
		cf.register(fs, e)
		switch name {
		case "approvals":
			fs.String("queue", "", "")
			fs.Bool("json", false, "")
		default:
			fs.String("by", "", "")
			fs.String("reason", "", "")
			fs.String("args", "", "")
			fs.Duration("wait", 0, "")
		}
		return fs
	}
}

// pendingCall is a gated call the followed run waits on.
type pendingCall struct {
	id, tool string
}

// approvalEvent renders the approval events of a followed run and keeps
// the pending calls for /approve and /deny.
func (r *renderer) approvalEvent(env *bus.Envelope, typ string) {
	var ev struct {
		ToolCallID string          `json:"toolCallId"`
		ToolName   string          `json:"toolName"`
		Args       json.RawMessage `json:"args"`
		ExpiresAt  int64           `json:"expiresAt"`
		Decision   string          `json:"decision"`
		By         string          `json:"by"`
		Reason     string          `json:"reason"`
		Arguments  json.RawMessage `json:"arguments"`
	}
	if json.Unmarshal(env.Event, &ev) != nil {
		return
	}
	call := field(cut(ev.ToolCallID, 40))
	by := ""
	if ev.By != "" {
		by = " by " + field(cut(ev.By, 128))
	}
	reason := ""
	if ev.Reason != "" {
		reason = ": " + cut(field(oneLine(ev.Reason)), 300)
	}
	switch typ {
	case bus.EventToolApprovalRequested:
		r.approvals = append(r.approvals, pendingCall{ev.ToolCallID, ev.ToolName})
		line := "⏸ approval needed: " + field(cut(ev.ToolName, 60)) + " " + call + " " + cut(field(string(ev.Args)), r.room(30, 2))
		if ev.ExpiresAt > 0 {
			exp := time.UnixMilli(ev.ExpiresAt)
			line += " · expires " + clockTime(exp) + " (" + expiresIn(time.Now(), exp) + ")"
		}
		r.println(r.st.yellow(line))
		if r.interactive {
			r.note(fmt.Sprintf("/approve %s approves · /deny %s REASON denies", call, call))
		}
	case bus.EventToolApprovalResolved:
		r.settle(ev.ToolCallID)
		switch ev.Decision {
		case bus.DecisionApprove:
			edit := ""
			if len(ev.Arguments) > 0 {
				edit = " with " + cut(field(string(ev.Arguments)), r.room(30, 2))
			}
			r.println(r.st.green("✓ approved " + call + by + edit))
		case bus.DecisionDeny:
			r.println(r.st.red("✗ denied " + call + by + reason))
		default:
			r.println(r.st.red("✗ " + field(cut(ev.Decision, 20)) + " " + call + reason))
		}
	case bus.EventToolApprovalRejected:
		// An invalid answer or edit for a waiting call, or (since 1.8) an
		// answer too early or for a call already resolved.
		line := "! an answer for " + call + " was not applied" + reason
		for _, p := range r.approvals {
			if p.id == ev.ToolCallID {
				line += "; still waiting"
				break
			}
		}
		r.println(r.st.yellow(line))
	}
}

// settle drops the oldest pending call with this id.
func (r *renderer) settle(id string) {
	for i, p := range r.approvals {
		if p.id == id {
			r.approvals = append(r.approvals[:i], r.approvals[i+1:]...)
			return
		}
	}
}

// parseApprovalInput reads /approve [CALL] and /deny [CALL] REASON typed
// while following. CALL is taken only if it equals a pending call's id;
// without one the only pending call is meant. handled is false for other
// lines.
func parseApprovalInput(line string, pending []pendingCall) (a *bus.ApprovalAnswer, handled bool, err error) {
	line = strings.TrimSpace(line)
	verb, rest, _ := strings.Cut(line, " ")
	var decision string
	switch verb {
	case "/approve":
		decision = bus.DecisionApprove
	case "/deny":
		decision = bus.DecisionDeny
	default:
		return nil, false, nil
	}
	rest = strings.TrimSpace(rest)
	if len(pending) == 0 {
		return nil, true, errors.New("no call waits for approval")
	}
	first, after, _ := strings.Cut(rest, " ")
	call := ""
	for _, p := range pending {
		if first != "" && p.id == first {
			call, rest = first, strings.TrimSpace(after)
			break
		}
	}
	if call == "" {
		ids := make([]string, len(pending))
		for i, p := range pending {
			ids[i] = p.id
		}
		switch {
		case len(pending) > 1:
			return nil, true, fmt.Errorf("several calls wait: %s; name one: %s CALL", field(strings.Join(ids, ", ")), verb)
		case decision == bus.DecisionApprove && rest != "":
			return nil, true, fmt.Errorf("no pending call %q (pending: %s)", field(cut(first, 40)), field(ids[0]))
		}
		call = pending[0].id
	}
	if decision == bus.DecisionDeny && rest == "" {
		return nil, true, errors.New("usage: /deny [CALL] REASON")
	}
	a = &bus.ApprovalAnswer{ToolCallID: call, Decision: decision}
	if decision == bus.DecisionDeny {
		a.Reason = rest
	}
	return a, true, nil
}

// waitingNote marks a listed run that waits: " (waiting: approval)".
func waitingNote(w *bus.Waiting) string {
	if w == nil {
		return ""
	}
	if w.Key != "" { // since 1.10: its concurrency key is full
		return " (waiting: key " + field(cut(w.Key, 40)) + ")"
	}
	return " (waiting: " + field(cut(w.For, 20)) + ")"
}

// writeWaiting adds what a running run waits for to its status rows.
func writeWaiting(row func(k, v string), w *bus.Waiting) {
	if w == nil {
		return
	}
	v := field(cut(w.For, 20))
	if w.Key != "" {
		v += " " + field(cut(w.Key, 80)) + " (its concurrency key is full; a run of the key that ends wakes it)"
	}
	if !w.Since.IsZero() {
		v += " since " + w.Since.Local().Format("2006-01-02 15:04:05") + " (" + ago(time.Since(w.Since)) + ")"
	}
	row("waiting", v)
	now := time.Now()
	for _, a := range w.Approvals {
		row("  call "+field(cut(a.ToolCallID, 40)), field(cut(a.ToolName, 40))+" · expires "+
			clockTime(time.UnixMilli(a.ExpiresAt))+" ("+expiresIn(now, time.UnixMilli(a.ExpiresAt))+")")
	}
}
