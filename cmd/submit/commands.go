package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// runFlags are the flags of a new run (submit, run, reply).
type runFlags struct {
	queue, model, system, tools, id, thinking string
	file, request                             string
	priority, concurrencyKey                  string
	maxTurns, maxTokens, concurrencyLimit     int
	runTimeout                                time.Duration
	temperature                               float64
	images, meta                              listFlag
	detach, json                              bool
	view                                      viewFlags
}

// viewFlags shape the live view (submit, follow).
type viewFlags struct {
	hideThinking, abortOnInterrupt, noInput bool
	noticeAfter                             time.Duration
}

func (v *viewFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&v.hideThinking, "hide-thinking", false, "do not show the model's thinking")
	fs.BoolVar(&v.abortOnInterrupt, "abort-on-interrupt", false, "Ctrl-C aborts the run (instead of detaching)")
	fs.BoolVar(&v.noInput, "no-input", false, "do not read steering from the terminal")
	fs.DurationVar(&v.noticeAfter, "notice-after", 3*time.Second, "say so when no worker has picked the run up after this long (0: never)")
}

func (f *runFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&f.queue, "queue", env2(e.getenv, "AGENTS_QUEUE", bus.DefaultQueue), "queue to submit to [AGENTS_QUEUE]")
	fs.StringVar(&f.model, "model", "", "model, provider/id (e.g. openai/gpt-4o-mini); default: the worker's")
	fs.StringVar(&f.system, "system", "", "system prompt")
	fs.StringVar(&f.tools, "tools", "", "tools the run may use, comma-separated (calculator,current_time,sleep)")
	fs.StringVar(&f.id, "id", "", "run id (default: a random one); submitting an id again is dropped as a duplicate")
	fs.IntVar(&f.maxTurns, "max-turns", 0, "turn limit (worker default 50)")
	fs.DurationVar(&f.runTimeout, "run-timeout", 0, "the run fails after this long (worker default 30m)")
	fs.StringVar(&f.thinking, "thinking", "", "thinking level: off, minimal, low, medium, high, xhigh, max")
	fs.Float64Var(&f.temperature, "temperature", 0, "sampling temperature, 0..2")
	fs.IntVar(&f.maxTokens, "max-tokens", 0, "max output tokens per model call")
	fs.Var(&f.images, "image", "image `file` to attach to the prompt (repeatable)")
	fs.Var(&f.meta, "meta", "metadata `key=value` (repeatable)")
	fs.StringVar(&f.file, "file", "", "read the prompt from a `file` (- for stdin)")
	fs.StringVar(&f.request, "request", "", "a full run request (JSON `file`, - for stdin); flags override its fields")
	fs.StringVar(&f.priority, "priority", "", "high, normal or low: the run's lane (since protocol 1.10; needs a 1.10 worker)")
	fs.StringVar(&f.concurrencyKey, "concurrency-key", "", "concurrency key: across the fleet at most --concurrency-limit runs with it run at once (since 1.10)")
	fs.IntVar(&f.concurrencyLimit, "concurrency-limit", 0, "the limit of --concurrency-key (0: the workers' default for the key)")
	fs.BoolVar(&f.detach, "detach", false, "print the run id and exit without following")
	fs.BoolVar(&f.json, "json", false, "print the run's event envelopes as NDJSON")
	f.view.register(fs)
}

// build makes the run request from the flags and the prompt arguments.
func (f *runFlags) build(e *env, fs *flag.FlagSet, args []string) (*bus.RunRequest, error) {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	req := &bus.RunRequest{}
	if f.request != "" {
		data, err := readFileOrStdin(e, f.request)
		if err != nil {
			return nil, usagef("--request: %v", err)
		}
		// Decoded strictly (unknown fields are errors, as for the worker)
		// but validated only once the flags are applied: the file may
		// leave the prompt to the arguments.
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(req); err != nil {
			return nil, usagef("--request %s: %v", f.request, err)
		}
	}
	switch {
	case f.file != "" && len(args) > 0:
		return nil, usagef("give the prompt as arguments or with --file, not both")
	case f.file != "":
		b, err := readFileOrStdin(e, f.file)
		if err != nil {
			return nil, usagef("--file: %v", err)
		}
		req.Prompt = strings.TrimRight(string(b), "\n")
	case len(args) > 0:
		p, err := readText(e, args)
		if err != nil {
			return nil, err
		}
		req.Prompt = p
	}
	if req.Prompt == "" && len(req.Messages) == 0 {
		return nil, usagef(`no prompt: submit "your prompt" (or --file F, or - for stdin)`)
	}
	if set["id"] {
		req.ID = f.id
	}
	if f.model != "" {
		m, err := bus.ParseModelRef(f.model)
		if err != nil {
			return nil, usagef("--model: %v", err)
		}
		req.Model = &m
		if m.Provider != "faux" {
			req.Faux = nil
		}
	}
	if set["system"] {
		req.SystemPrompt = f.system
	}
	if set["tools"] {
		req.Tools = nil
		for _, t := range strings.Split(f.tools, ",") {
			if t = strings.TrimSpace(t); t != "" {
				req.Tools = append(req.Tools, t)
			}
		}
	}
	if set["thinking"] {
		req.ThinkingLevel = agent.ThinkingLevel(f.thinking)
	}
	if set["max-turns"] || set["run-timeout"] {
		if req.Limits == nil {
			req.Limits = &bus.Limits{}
		}
		if set["max-turns"] {
			if f.maxTurns < 1 {
				return nil, usagef("--max-turns must be at least 1")
			}
			req.Limits.MaxTurns = f.maxTurns
		}
		if set["run-timeout"] {
			if f.runTimeout <= 0 {
				return nil, usagef("--run-timeout must be positive")
			}
			req.Limits.TimeoutSeconds = int(math.Ceil(f.runTimeout.Seconds()))
		}
	}
	if set["temperature"] {
		t := f.temperature
		req.Temperature = &t
	}
	if set["max-tokens"] {
		req.MaxTokens = f.maxTokens
	}
	for _, name := range f.images {
		data, err := os.ReadFile(name)
		if err != nil {
			return nil, usagef("--image: %v", err)
		}
		mt := mime.TypeByExtension(strings.ToLower(filepath.Ext(name)))
		if mt == "" || !strings.HasPrefix(mt, "image/") {
			mt = http.DetectContentType(data)
		}
		if !strings.HasPrefix(mt, "image/") {
			return nil, usagef("--image %s: not an image (%s)", name, mt)
		}
		if i := strings.IndexByte(mt, ';'); i >= 0 {
			mt = mt[:i]
		}
		req.Images = append(req.Images, agent.Image(base64.StdEncoding.EncodeToString(data), mt))
	}
	for _, kv := range f.meta {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("--meta %q: use key=value", kv)
		}
		if req.Metadata == nil {
			req.Metadata = map[string]string{}
		}
		req.Metadata[k] = v
	}
	if req.ID == "" {
		req.ID = bus.NewRunID()
	}
	if set["priority"] {
		req.Priority = f.priority
	}
	if set["concurrency-key"] || set["concurrency-limit"] {
		if f.concurrencyKey == "" {
			return nil, usagef("--concurrency-limit needs --concurrency-key")
		}
		req.Concurrency = &bus.Concurrency{Key: f.concurrencyKey, Limit: f.concurrencyLimit}
	}
	if err := req.Validate(""); err != nil {
		return nil, usagef("%v", err)
	}
	if err := bus.CheckQueue(f.queue); err != nil {
		return nil, usagef("--queue: %v", err)
	}
	return req, nil
}

func cmdRun(ctx context.Context, e *env, args []string) int {
	return submitAndFollow(ctx, e, args, "", `submit [run] [flags] "prompt"`)
}

func cmdReply(ctx context.Context, e *env, args []string) int {
	return submitAndFollow(ctx, e, args, "reply", `submit reply RUN [flags] "text"`)
}

// submitAndFollow submits a run (a reply when mode is "reply": the first
// argument is the run to continue) and follows it.
func submitAndFollow(ctx context.Context, e *env, args []string, mode, usage string) int {
	fs := newFlagSet(e, map[string]string{"": "run", "reply": "reply"}[mode], usage)
	var cf conn
	var rf runFlags
	cf.register(fs.FlagSet, e)
	rf.register(fs.FlagSet, e)
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	var from string
	if mode == "reply" {
		if len(pos) < 1 {
			return fail(e, usagef("reply needs a run id: %s", usage))
		}
		from, pos = pos[0], pos[1:]
		if err := bus.CheckID(from); err != nil {
			return fail(e, usagef("%v", err))
		}
	}
	req, err := rf.build(e, fs.FlagSet, pos)
	if err != nil {
		return fail(e, err)
	}
	ctx, endTrace := cf.traceCommand(ctx, e, "agentfleet.submit") // trace.go
	defer endTrace()
	ictx, icancel := context.WithCancel(ctx)
	defer icancel()
	c, err := cf.connect(ictx, e)
	if err != nil {
		return fail(e, err)
	}
	defer c.Close()

	if mode == "reply" {
		if err := prepareReply(ictx, c, from, req, fs.FlagSet); err != nil {
			return fail(e, err)
		}
	}
	sctx, scancel := context.WithTimeout(ictx, 30*time.Second)
	res, err := c.Submit(sctx, rf.queue, req)
	scancel()
	if err != nil {
		return fail(e, fleetError(c, err))
	}
	traceRun(ctx, res.ID, res.Queue)
	if rf.detach {
		fmt.Fprintln(e.stdout, res.ID)
		if res.Duplicate {
			fmt.Fprintf(e.stderr, "submit: run %s was already submitted; this request was dropped as a duplicate\n", res.ID)
		}
		return exitOK
	}
	if res.Duplicate {
		fmt.Fprintf(e.stderr, "submit: run %s was already submitted; this request was dropped as a duplicate. Following the existing run.\n", res.ID)
	}
	return follow(ctx, e, c, followOptions{
		run: res.ID, queue: res.Queue, json: rf.json,
		interactive:      e.stdinTTY && e.stdoutTTY && !rf.json && !rf.view.noInput && rf.file != "-" && rf.request != "-",
		abortOnInterrupt: rf.view.abortOnInterrupt, hideThinking: rf.view.hideThinking,
		noColor: cf.noColor, noticeAfter: rf.view.noticeAfter,
	})
}

// prepareReply points req at the run it continues and, unless flags say
// otherwise, reuses that run's model and tools.
func prepareReply(ctx context.Context, c *bus.Client, from string, req *bus.RunRequest, fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	rec, err := c.Status(ctx, from)
	if err != nil {
		return fleetError(c, err)
	}
	if !rec.Finished() {
		return fmt.Errorf("run %s is %s: reply once it has finished (or send it a follow-up: submit followup %s TEXT)", from, rec.State, from)
	}
	req.ContinueFrom = from
	if req.Model == nil && req.Faux == nil || len(req.Tools) == 0 && !set["tools"] {
		// The run's model and tools are in its run_started.
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for env, err := range c.Follow(fctx, from) {
			if err != nil {
				if bus.IsFatalFollowError(err) {
					return err
				}
				continue
			}
			ev, err := env.Decode()
			if err == nil && ev.RunStarted != nil {
				if req.Model == nil && req.Faux == nil && ev.RunStarted.Model != nil {
					m := *ev.RunStarted.Model
					req.Model = &m
				}
				if len(req.Tools) == 0 && !set["tools"] {
					req.Tools = ev.RunStarted.Tools
				}
			}
			break
		}
	}
	return req.Validate("")
}

func cmdFollow(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "follow", "submit follow RUN [--json] [--tree]")
	var cf conn
	var vf viewFlags
	var asJSON, tree bool
	cf.register(fs.FlagSet, e)
	vf.register(fs.FlagSet)
	fs.BoolVar(&asJSON, "json", false, "print the event envelopes as NDJSON")
	fs.BoolVar(&tree, "tree", false, "also follow the child runs below it (run_agent), each line prefixed by its run id; no steering")
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return fail(e, usagef("follow takes one run id"))
	}
	if tree && asJSON {
		return fail(e, usagef("follow --tree prints lines, not --json (follow each run with --json instead)"))
	}
	id := pos[0]
	if err := bus.CheckID(id); err != nil {
		return fail(e, usagef("%v", err))
	}
	c, err := cf.connect(ctx, e)
	if err != nil {
		return fail(e, err)
	}
	defer c.Close()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	rec, err := existingRun(sctx, c, id)
	cancel()
	if err != nil {
		return fail(e, err)
	}
	if tree {
		return followTree(ctx, e, c, id, cf.noColor) // followtree.go
	}
	return follow(ctx, e, c, followOptions{
		run: id, queue: rec.Queue, json: asJSON, showPrompt: true,
		interactive:      e.stdinTTY && e.stdoutTTY && !asJSON && !vf.noInput && !rec.Finished(),
		abortOnInterrupt: vf.abortOnInterrupt, hideThinking: vf.hideThinking,
		noColor: cf.noColor, noticeAfter: vf.noticeAfter,
	})
}

func cmdSteer(ctx context.Context, e *env, args []string) int {
	return control(ctx, e, args, bus.KindSteer)
}

func cmdFollowUp(ctx context.Context, e *env, args []string) int {
	return control(ctx, e, args, bus.KindFollowUp)
}

// control sends a steering message or a follow-up.
func control(ctx context.Context, e *env, args []string, kind string) int {
	name := map[string]string{bus.KindSteer: "steer", bus.KindFollowUp: "followup"}[kind]
	fs := newFlagSet(e, name, "submit "+name+` RUN "text" (or - for stdin)`)
	var cf conn
	cf.register(fs.FlagSet, e)
	key := fs.String("key", "", "idempotency key: the same command run again with the same key within 2 minutes (a retry after an error) does not send the text a second time")
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) < 2 {
		return fail(e, usagef(`%s takes a run id and a text: submit %s RUN "text"`, name, name))
	}
	id := pos[0]
	if err := bus.CheckID(id); err != nil {
		return fail(e, usagef("%v", err))
	}
	text, err := readText(e, pos[1:])
	if err != nil {
		return fail(e, err)
	}
	if strings.TrimSpace(text) == "" {
		return fail(e, usagef("empty %s text", kindName(kind)))
	}
	ctx, endTrace := cf.traceCommand(ctx, e, "agentfleet."+name) // trace.go
	defer endTrace()
	ctx, c, _, release, err := openRun(ctx, e, &cf, id)
	if err != nil {
		return fail(e, err)
	}
	defer release()
	var opts []bus.ControlOption
	if *key != "" {
		opts = append(opts, bus.WithControlID(*key))
	}
	seq, err := c.SendControl(ctx, id, kind, bus.Control{Text: text}, opts...)
	if err != nil {
		return fail(e, finishedError(err, kind))
	}
	fmt.Fprintf(e.stdout, "%s sent to run %s (control sequence %d)\n", kindName(kind), id, seq)
	return exitOK
}

// cmdCompact sends a compact control message (protocol §16): the run
// summarises its context at its next model call, focused by the
// instructions.
func cmdCompact(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "compact", "submit compact RUN [--instructions TEXT]")
	var cf conn
	cf.register(fs.FlagSet, e)
	instructions := fs.String("instructions", "", "what the summary should focus on (at most 4 KiB)")
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return fail(e, usagef("compact takes a run id: submit compact RUN [--instructions TEXT]"))
	}
	id := pos[0]
	if err := bus.CheckID(id); err != nil {
		return fail(e, usagef("%v", err))
	}
	if len(*instructions) > bus.MaxCompactionInstructions {
		return fail(e, usagef("--instructions is %d bytes, at most %d", len(*instructions), bus.MaxCompactionInstructions))
	}
	ctx, endTrace := cf.traceCommand(ctx, e, "agentfleet.compact") // trace.go
	defer endTrace()
	ctx, c, _, release, err := openRun(ctx, e, &cf, id)
	if err != nil {
		return fail(e, err)
	}
	defer release()
	seq, err := c.Compact(ctx, id, *instructions)
	if err != nil {
		return fail(e, finishedError(err, bus.KindCompact))
	}
	fmt.Fprintf(e.stdout, "compact sent to run %s (control sequence %d): it compacts at its next model call\n", id, seq)
	return exitOK
}

func finishedError(err error, kind string) error {
	if errors.Is(err, bus.ErrRunFinished) {
		return fmt.Errorf("%v: the %s was not sent", err, kindName(kind))
	}
	return err
}

// openRun checks a run id, connects and reads the run's record: how every
// command on one existing run starts. release undoes what it took; it is
// nil when the error is not nil.
func openRun(ctx context.Context, e *env, cf *conn, id string) (context.Context, *bus.Client, *bus.RunRecord, func(), error) {
	if err := bus.CheckID(id); err != nil {
		return nil, nil, nil, nil, usagef("%v", err)
	}
	ctx, cancel := interruptible(ctx, e)
	c, err := cf.connect(ctx, e)
	if err != nil {
		cancel()
		return nil, nil, nil, nil, err
	}
	release := func() { c.Close(); cancel() }
	rec, err := existingRun(ctx, c, id)
	if err != nil {
		release()
		return nil, nil, nil, nil, err
	}
	return ctx, c, rec, release, nil
}

// existingRun returns a run's record, or an error saying there is no such
// run.
func existingRun(ctx context.Context, c *bus.Client, id string) (*bus.RunRecord, error) {
	rec, err := c.Status(ctx, id)
	if errors.Is(err, bus.ErrRunNotFound) {
		return nil, fmt.Errorf("no such run: %s", id)
	}
	return rec, fleetError(c, err)
}

func cmdAbort(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "abort", "submit abort RUN [--reason R]")
	var cf conn
	var reason string
	var wait time.Duration
	cf.register(fs.FlagSet, e)
	fs.StringVar(&reason, "reason", "", "why (shown in the run's run_finished)")
	fs.DurationVar(&wait, "wait", 5*time.Second, "wait this long for the run to end and print its closing line (0: do not wait)")
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return fail(e, usagef("abort takes one run id"))
	}
	id := pos[0]
	ctx, endTrace := cf.traceCommand(ctx, e, "agentfleet.abort") // trace.go
	defer endTrace()
	ctx, c, rec, release, err := openRun(ctx, e, &cf, id)
	if err != nil {
		return fail(e, err)
	}
	defer release()
	if _, err := c.Abort(ctx, id, reason); err != nil {
		return fail(e, finishedError(err, bus.KindAbort))
	}
	fmt.Fprintf(e.stdout, "abort sent to run %s\n", id)
	if wait <= 0 {
		return exitOK
	}
	wctx, wcancel := context.WithTimeout(ctx, wait)
	defer wcancel()
	for env, err := range c.Follow(wctx, id) {
		if err != nil {
			if bus.IsFatalFollowError(err) {
				break
			}
			continue
		}
		if env.Type == bus.EventRunFinished {
			if f, err := decodeFinished(env); err == nil {
				fmt.Fprintln(e.stdout, closingLine(style{on: e.color(cf.noColor)}, f))
			}
			return exitOK
		}
	}
	if ctx.Err() != nil {
		return exitDetached
	}
	if rec.State == bus.StateQueued {
		fmt.Fprintf(e.stdout, "run %s is still queued: it ends as aborted when a worker picks it up\n", id)
	} else {
		fmt.Fprintf(e.stdout, "run %s has not finished yet after %s; the abort is stored and its worker will apply it\n", id, wait)
	}
	return exitOK
}

func cmdStatus(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "status", "submit status RUN [--json] [--tree]")
	var cf conn
	var asJSON, tree bool
	cf.register(fs.FlagSet, e)
	fs.BoolVar(&asJSON, "json", false, "print the record as JSON")
	fs.BoolVar(&tree, "tree", false, "also list the child runs below it (run_agent), each with its state and cost; reads its events")
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return fail(e, usagef("status takes one run id"))
	}
	ctx, c, rec, release, err := openRun(ctx, e, &cf, pos[0])
	if err != nil {
		return fail(e, err)
	}
	defer release()
	if asJSON {
		return writeJSON(e, rec)
	}
	st := style{on: e.color(cf.noColor)}
	writeRecord(e, st, rec)
	if !tree || rec.StartedAt.IsZero() {
		return exitOK
	}
	// The child runs below it (protocol 1.10), from its run_agent calls.
	n := 0
	writeTree(ctx, e, st, c, rec, 0, &n)
	return exitOK
}

func stateColor(st style, state string) string {
	switch state {
	case bus.StatusSucceeded:
		return st.green(state)
	case bus.StatusFailed:
		return st.red(state)
	case bus.StatusAborted:
		return st.yellow(state)
	}
	return st.cyan(state)
}

func writeRecord(e *env, st style, r *bus.RunRecord) {
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	ts := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.Local().Format("2006-01-02 15:04:05.000") + " (" + ago(time.Since(t)) + ")"
	}
	row("run", r.ID)
	state := stateColor(st, r.State)
	if r.Reason != "" {
		state += " (" + r.Reason + ")"
	}
	if r.Stale {
		state += " " + st.red("(stale: no heartbeat since "+ago(time.Since(r.HeartbeatAt))+"; its worker may be gone)")
	}
	row("state", state)
	writeWaiting(row, r.Waiting) // approvals.go
	row("queue", field(r.Queue))
	if r.Priority != "" { // since 1.10
		row("priority", field(r.Priority))
	}
	if r.Tenant != "" {
		row("tenant", field(cut(r.Tenant, 80)))
	}
	row("model", field(r.Model))
	row("worker", field(r.Worker))
	if r.Attempt > 1 {
		row("attempt", fmt.Sprint(r.Attempt))
	}
	row("submitted", ts(r.SubmittedAt))
	row("started", ts(r.StartedAt))
	row("finished", ts(r.FinishedAt))
	if r.State == bus.StateRunning {
		row("heartbeat", ts(r.HeartbeatAt))
	}
	if !r.StartedAt.IsZero() {
		end := r.FinishedAt
		if end.IsZero() {
			end = time.Now()
		}
		row("duration", fmtDuration(end.Sub(r.StartedAt)))
		row("turns", fmt.Sprint(r.Turns))
		row("tokens", fmt.Sprintf("%s (%s in, %s out)", thousands(r.Usage.TotalTokens), thousands(r.Usage.Input), thousands(r.Usage.Output)))
		row("cost", money(r.Cost))
	}
	row("error", field(r.Error))
	if c := r.Child; c != nil {
		row("parent", fmt.Sprintf("%s (depth %d, root %s)", field(c.ParentRunID), c.Depth, field(c.RootRunID)))
	}
	for k, v := range r.Metadata {
		row("meta "+field(k), field(v))
	}
	_ = tw.Flush()
}

func ago(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

var listStates = []string{bus.StateQueued, bus.StateRunning, bus.StateWaiting, bus.StateStale, bus.StatusSucceeded, bus.StatusFailed, bus.StatusAborted}

func cmdList(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "list", "submit list [--state S] [--queue Q] [--limit N] [--before TIME|RUN] [--since TIME] [--json]")
	var cf conn
	var state, queue, before, since string
	var limit int
	var asJSON bool
	cf.register(fs.FlagSet, e)
	fs.StringVar(&state, "state", "", "only runs in this state: "+strings.Join(listStates, ", "))
	fs.StringVar(&queue, "queue", "", "only runs of this queue")
	fs.IntVar(&limit, "limit", 20, "at most this many runs, the newest first (0: all)")
	fs.BoolVar(&asJSON, "json", false, "print a JSON array of run records")
	fs.StringVar(&before, "before", "", "only runs last written before this: a time (RFC 3339, or a duration ago such as 2h), a run id (the page after it), or @CURSOR (the next page, as a page printed it)")
	fs.StringVar(&since, "since", "", "only runs last written since this: a duration ago (1h) or an RFC 3339 time")
	var schedule string
	fs.StringVar(&schedule, "schedule", "", "only the runs of this schedule (metadata schedule=NAME)")
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return fail(e, usagef("list takes no arguments (got %q)", pos[0]))
	}
	opts := bus.ListOptions{State: state, Queue: queue, Limit: limit}
	if schedule != "" {
		opts.Metadata = map[string]string{bus.MetaSchedule: schedule}
	}
	var beforeRun string
	if cur, ok := strings.CutPrefix(before, "@q."); ok && bus.CheckListCursor("q."+cur) == nil {
		opts.Cursor = "q." + cur // a place in the queued runs
	} else if cur, ok := strings.CutPrefix(before, "@w."); ok && bus.CheckListCursor("w."+cur) == nil {
		opts.Cursor = "w." + cur // a place in the waiting index (--state waiting)
	} else if before != "" {
		t, seq, run, err := parseListBound(before, true)
		if err != nil {
			return fail(e, usagef("--before %q: %v", before, err))
		}
		opts.Before, opts.BeforeSeq, beforeRun = t, seq, run
	}
	if since != "" {
		t, _, _, err := parseListBound(since, false)
		if err != nil {
			return fail(e, usagef("--since %q: %v", since, err))
		}
		opts.Since = t
	}
	if state != "" && !contains(listStates, state) {
		return fail(e, usagef("--state %q: use one of %s", state, strings.Join(listStates, ", ")))
	}
	if limit < 0 {
		return fail(e, usagef("--limit must not be negative"))
	}
	ctx, cancel := interruptible(ctx, e)
	defer cancel()
	c, err := cf.connect(ctx, e)
	if err != nil {
		return fail(e, err)
	}
	defer c.Close()
	if beforeRun != "" {
		rec, err := c.Status(ctx, beforeRun)
		if err != nil {
			return fail(e, fleetError(c, err))
		}
		if rec.Revision == 0 {
			return fail(e, fmt.Errorf("--before %s: the run is queued (it has no record yet)", beforeRun))
		}
		opts.BeforeSeq = rec.Revision
	}
	page, err := c.ListPage(ctx, opts)
	if err != nil {
		return fail(e, fleetError(c, err))
	}
	recs := page.Records
	switch {
	case page.Truncated && page.NextCursor != "":
		fmt.Fprintf(e.stderr, "stopped after reading %d records; older ones: submit list --before @%s\n", page.Scanned, page.NextCursor)
	case limit > 0 && len(recs) == limit && page.NextCursor != "":
		// On stderr: stdout stays the page (a table or JSON).
		fmt.Fprintf(e.stderr, "more: submit list%s --before @%s\n", listFlags(state, queue, since, limit), page.NextCursor)
	}
	if asJSON {
		return writeJSON(e, orEmpty(recs))
	}
	if len(recs) == 0 {
		fmt.Fprintln(e.stderr, "no runs")
		return exitOK
	}
	writeList(e, recs)
	return exitOK
}

// listFlags are the filters of a next-page hint.
func listFlags(state, queue, since string, limit int) string {
	out := " --limit " + strconv.Itoa(limit)
	if since != "" {
		out += " --since " + since
	}
	if state != "" {
		out += " --state " + state
	}
	if queue != "" {
		out += " --queue " + queue
	}
	return out
}

// parseListBound reads a --before or --since value: an RFC 3339 time, a
// duration ago, and for --before also @SEQ (a page cursor) or a run id.
func parseListBound(v string, allowRun bool) (time.Time, uint64, string, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, 0, "", nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return time.Time{}, 0, "", errors.New("a duration ago must not be negative")
		}
		return time.Now().Add(-d), 0, "", nil
	}
	if !allowRun {
		return time.Time{}, 0, "", errors.New("use a duration ago (1h) or an RFC 3339 time")
	}
	if seq, ok := strings.CutPrefix(v, "@"); ok {
		n, err := strconv.ParseUint(seq, 10, 64)
		if err != nil || n == 0 {
			return time.Time{}, 0, "", errors.New("@SEQ takes a positive sequence")
		}
		return time.Time{}, n, "", nil
	}
	if err := bus.CheckID(v); err != nil {
		return time.Time{}, 0, "", errors.New("use an RFC 3339 time, a duration ago (2h), a run id or @SEQ")
	}
	return time.Time{}, 0, v, nil
}

// writeList prints records as a table (plain: tabwriter would count colour
// escapes as width).
func writeList(e *env, recs []bus.RunRecord) {
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATE\tQUEUE\tMODEL\tTURNS\tTOKENS\tCOST\tSUBMITTED\tDURATION")
	for _, r := range recs {
		state := r.State
		if r.Reason != "" && r.State == bus.StatusFailed {
			state += "/" + r.Reason
		}
		if r.Stale {
			state += " (stale)"
		}
		state += waitingNote(r.Waiting)
		if r.Priority != "" { // since 1.10
			state += " [" + r.Priority + "]"
		}
		submitted := "-"
		if t := r.SubmittedAt; !t.IsZero() {
			submitted = ago(time.Since(t))
		}
		dur := "-"
		if !r.StartedAt.IsZero() {
			end := r.FinishedAt
			if end.IsZero() {
				end = time.Now()
			}
			dur = fmtDuration(end.Sub(r.StartedAt))
		}
		model := field(r.Model)
		if model == "" {
			model = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.ID, state, field(r.Queue), model, r.Turns,
			thousands(r.Usage.TotalTokens), money(r.Cost), submitted, dur)
	}
	_ = tw.Flush()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func cmdResult(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "result", "submit result RUN [--transcript] [--json]")
	var cf conn
	var transcript, asJSON, noWait bool
	cf.register(fs.FlagSet, e)
	fs.BoolVar(&transcript, "transcript", false, "print the whole transcript, not only the final answer")
	fs.BoolVar(&asJSON, "json", false, "with --transcript: the messages as a JSON array; else {\"status\",\"text\",...}")
	fs.BoolVar(&noWait, "no-wait", false, "fail at once if the run has not finished (default: wait for it)")
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return fail(e, usagef("result takes one run id"))
	}
	id := pos[0]
	ctx, c, rec, release, err := openRun(ctx, e, &cf, id)
	if err != nil {
		return fail(e, err)
	}
	defer release()
	if noWait && !rec.Finished() {
		return fail(e, fmt.Errorf("run %s is %s", id, rec.State))
	}
	t, err := c.LoadTranscript(ctx, id)
	if err != nil {
		if ctx.Err() != nil {
			return exitDetached
		}
		return fail(e, err)
	}
	if t.Finished == nil {
		return fail(e, fmt.Errorf("run %s has no run_finished", id))
	}
	st := style{on: e.color(cf.noColor)}
	missing := 0
	if transcript {
		missing = wholeContext(ctx, e, c, t)
	}
	switch {
	case transcript && asJSON:
		if code := writeJSON(e, orEmpty(t.Messages)); code != exitOK {
			return code
		}
	case transcript:
		writeTranscript(e, st, t, missing)
	case asJSON:
		_ = json.NewEncoder(e.stdout).Encode(map[string]any{
			"run": id, "status": t.Finished.Status, "reason": t.Finished.Reason, "error": t.Finished.Error,
			"text": t.FinalText(), "turns": t.Finished.Turns, "usage": t.Finished.Usage, "cost": t.Finished.Cost,
		})
	default:
		if text := t.FinalText(); text != "" {
			fmt.Fprintln(e.stdout, sanitize(text))
		}
		if t.Finished.Status != bus.StatusSucceeded {
			fmt.Fprintln(e.stderr, closingLine(style{}, t.Finished))
		}
	}
	return statusCode(t.Finished.Status)
}

// wholeContext puts the messages a continuation restored by reference
// (transcript_restored, since 1.9) before its own, from the continued run's
// snapshot; without one it says what is left out and returns how many
// messages that is (a compaction's firstKeptIndex counts them).
func wholeContext(ctx context.Context, e *env, c *bus.Client, t *bus.Transcript) int {
	ref := t.Restored
	if ref == nil || ref.Messages <= 0 {
		return 0
	}
	prior, _, err := c.LoadSnapshot(ctx, ref.From, 0, 0)
	if err == nil && len(prior) < ref.Messages {
		err = fmt.Errorf("it has %d messages", len(prior))
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "continued from %s (%d messages), which are left out: %v\n", ref.From, ref.Messages, err)
		return ref.Messages
	}
	t.Messages = append(prior[:ref.Messages:ref.Messages], t.Messages...)
	return 0
}

// writeTranscript prints a run's messages, one block per message.
// missing messages of the whole transcript (a continuation's prior ones
// without a snapshot) are not in t.Messages.
func writeTranscript(e *env, st style, t *bus.Transcript, missing int) {
	// Where each compaction cut (since 1.10): the model was sent its
	// summary and the messages from there on; the events hold them all.
	// firstKeptIndex counts the whole transcript: a cut in the missing
	// messages is drawn before the first shown.
	// Only the cuts a resume would use (bus.CompactionFits): not a failed
	// one, nor one past the transcript or on a tool result; a cut after the
	// last message is drawn after it.
	cuts := map[int][]*bus.CompactionEnd{}
	for _, c := range t.Compactions {
		i := c.FirstKeptIndex - missing
		if c.Error != "" || c.FirstKeptIndex <= 0 || i > len(t.Messages) || (i >= 0 && i < len(t.Messages) && t.Messages[i].Role == agent.RoleToolResult) {
			continue
		}
		cuts[max(i, 0)] = append(cuts[max(i, 0)], c)
	}
	drawCuts := func(i int) {
		for _, c := range cuts[i] {
			fmt.Fprintln(e.stdout, st.yellow(fmt.Sprintf("── context compacted here (%s, %d → %d tokens): from now on the model was sent this summary and the messages below ──",
				sanitize(c.Reason), c.TokensBefore, c.TokensAfter)))
			for _, l := range strings.Split(sanitize(c.Summary), "\n") {
				fmt.Fprintln(e.stdout, st.dim("   │ "+l))
			}
		}
	}
	for i, m := range t.Messages {
		drawCuts(i)
		switch m.Role {
		case agent.RoleUser:
			fmt.Fprintln(e.stdout, st.bold("» user: ")+sanitize(m.TextOf()))
		case agent.RoleAssistant:
			if th := m.ThinkingOf(); th != "" {
				fmt.Fprintln(e.stdout, st.dim("[thinking] "+sanitize(th)))
			}
			if text := m.TextOf(); text != "" {
				fmt.Fprintln(e.stdout, st.bold("assistant: ")+sanitize(text))
			}
			for _, tc := range m.ToolCalls() {
				args, _ := json.Marshal(tc.Arguments)
				fmt.Fprintln(e.stdout, st.cyan("⚙ "+sanitize(tc.Name))+" "+sanitize(string(args)))
			}
			if m.StopReason == agent.StopReasonError {
				fmt.Fprintln(e.stdout, st.red("✗ model error: "+sanitize(m.ErrorMessage)))
			}
		case agent.RoleToolResult:
			outcome := st.green("ok")
			if m.IsError {
				outcome = st.red("error")
			}
			fmt.Fprintln(e.stdout, st.cyan("  ↳ "+sanitize(m.ToolName))+" → "+outcome+": "+cut(sanitize(oneLine(m.TextOf())), 200))
		default:
			fmt.Fprintf(e.stdout, "%s: %s\n", sanitize(m.Role), sanitize(m.TextOf()))
		}
	}
	drawCuts(len(t.Messages))
	fmt.Fprintln(e.stdout, closingLine(st, t.Finished))
}
