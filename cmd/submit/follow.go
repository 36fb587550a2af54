package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// followOptions shape how a run is followed.
type followOptions struct {
	run   string
	queue string // for the no-worker notice; "" looks it up
	json  bool   // raw envelopes as NDJSON
	// interactive: read steering from stdin (a terminal).
	interactive      bool
	abortOnInterrupt bool
	hideThinking     bool
	showPrompt       bool
	noColor          bool
	// noticeAfter: say so when no worker has picked the run up by then.
	noticeAfter time.Duration
}

type followItem struct {
	env *bus.Envelope
	err error
}

// ctlResult is the outcome of a control message sent from the terminal.
type ctlResult struct {
	kind string
	seq  uint64
	err  error
}

// follow prints a run's events until its run_finished and returns the exit
// code of its status; Ctrl-C detaches (130) or aborts.
func follow(ctx context.Context, e *env, c *bus.Client, o followOptions) int {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// A panic in one of the goroutines below is panicked again by the
	// loop, so that the deferred calls (the terminal's mode) run.
	gp := &goPanics{ch: make(chan panicked), done: make(chan struct{})}
	defer close(gp.done)

	items := make(chan followItem, 1024)
	wg.Go(func() {
		defer gp.catch()
		defer close(items)
		for env, err := range c.Follow(fctx, o.run) {
			select {
			case items <- followItem{env, err}:
			case <-fctx.Done():
				return
			}
		}
	})

	r := newRenderer(e.stdout, style{on: e.color(o.noColor)})
	r.hideThinking, r.showPrompt = o.hideThinking, o.showPrompt
	r.live = e.stdoutTTY && !o.json
	if r.live {
		r.scr.width = e.termWidth()
	}
	r.interactive = o.interactive
	defer r.end()
	var enc *json.Encoder
	if o.json {
		enc = json.NewEncoder(e.stdout)
	}
	// say prints a line of submit's own to stderr; on a terminal it takes
	// its place among the output.
	say := func(s string) {
		if r.live && e.stderrTTY {
			r.lineTo(e.stderr, s)
			return
		}
		r.closeBlock()
		r.clearStatus()
		fmt.Fprintln(e.stderr, s)
	}

	// Steering typed on the terminal: keys, drawn in the bottom row by
	// submit itself (cbreak mode, termui.go), or lines the terminal
	// echoes where that mode is not to be had.
	var lines <-chan string
	var keys <-chan []byte
	var typed lineInput
	var mode *termMode
	var jobs <-chan os.Signal
	if o.interactive {
		if m, err := e.keyMode(); err == nil {
			mode = m
			defer func() { _ = m.restore() }() // a panic too
			jobs = m.signals()
			keys = readKeys(e.stdin, gp)
		} else {
			lines = readLines(e.stdin, gp)
		}
		r.note("type a line to steer · /followup TEXT queues a follow-up · /abort aborts · /approve [CALL], /deny [CALL] REASON answer an approval · Ctrl-C detaches")
	}
	results := make(chan ctlResult, 8)
	inflight := 0 // controls sent whose result is not shown yet
	send := func(kind, text string) {
		inflight++
		wg.Go(func() {
			defer gp.catch()
			sctx, scancel := context.WithTimeout(fctx, 10*time.Second)
			defer scancel()
			var seq uint64
			var err error
			switch kind {
			case bus.KindSteer:
				seq, err = c.Steer(sctx, o.run, text)
			case bus.KindFollowUp:
				seq, err = c.FollowUp(sctx, o.run, text)
			case bus.KindAbort:
				seq, err = c.Abort(sctx, o.run, text)
			}
			select {
			case results <- ctlResult{kind, seq, err}:
			case <-fctx.Done():
			}
		})
	}
	sendAnswer := func(a bus.ApprovalAnswer) {
		a.By = e.getenv("USER")
		inflight++
		wg.Go(func() {
			defer gp.catch()
			sctx, scancel := context.WithTimeout(fctx, 10*time.Second)
			defer scancel()
			seq, err := c.Answer(sctx, o.run, a)
			select {
			case results <- ctlResult{a.Decision, seq, err}:
			case <-fctx.Done():
			}
		})
	}

	showResult := func(res ctlResult) {
		inflight--
		switch {
		case errors.Is(res.err, bus.ErrRunFinished):
			r.note(fmt.Sprintf("the run has finished; %s not sent", kindName(res.kind)))
		case res.err != nil:
			r.note(fmt.Sprintf("%s failed: %v", kindName(res.kind), res.err))
		default:
			r.note(fmt.Sprintf("→ %s sent", kindName(res.kind)))
		}
	}

	// handleLine acts on a line typed: an answer to an approval, steering,
	// a follow-up or an abort.
	handleLine := func(line string) {
		if a, ok, err := parseApprovalInput(line, r.approvals); ok {
			if err != nil {
				r.note(err.Error())
			} else {
				sendAnswer(*a)
			}
			return
		}
		kind, text, err := parseInput(line)
		if err != nil {
			r.note(err.Error())
			return
		}
		if kind == "" {
			return
		}
		if kind == bus.KindAbort {
			text = "aborted from the terminal"
		}
		send(kind, text)
	}

	started := false
	begin := time.Now()
	var notice <-chan time.Time
	if o.noticeAfter > 0 {
		t := time.NewTimer(o.noticeAfter)
		defer t.Stop()
		notice = t.C
	}
	var tick <-chan time.Time
	if r.live {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		tick = t.C
	}
	aborting := false
	var finished *bus.RunFinished

	for {
		select {
		case it, ok := <-items:
			if !ok {
				// The run may end before a control's ack comes back (an
				// abort): say what happened to each before returning.
				for inflight > 0 && fctx.Err() == nil {
					select {
					case res := <-results:
						showResult(res)
					case <-fctx.Done():
					}
				}
				if finished == nil {
					return exitFailed
				}
				return statusCode(finished.Status)
			}
			if it.err != nil {
				if bus.IsFatalFollowError(it.err) {
					if ctx.Err() != nil {
						return exitDetached
					}
					if errors.Is(it.err, bus.ErrEventsGone) {
						say(fmt.Sprintf("submit: %v; its record remains: submit status %s", it.err, o.run))
						return exitFailed
					}
					say(fmt.Sprintf("submit: %v", it.err))
					return exitFailed
				}
				say(fmt.Sprintf("submit: warning: %v", it.err))
				continue
			}
			if it.env.Type == bus.EventRunStarted {
				started = true
			}
			if it.env.Type == bus.EventRunFinished {
				finished, _ = decodeFinished(it.env)
			}
			if enc != nil {
				if err := enc.Encode(it.env); err != nil {
					return fail(e, err)
				}
				continue
			}
			if err := r.Render(it.env); err != nil {
				say(fmt.Sprintf("submit: warning: %v", err))
			}
		case <-notice:
			if !started {
				say(r.st.yellow(noWorkerNotice(fctx, c, o.run, o.queue, time.Since(begin))))
			}
		case p := <-gp.ch:
			panic(p)
		case <-e.resize:
			r.resize(e.termWidth())
		case sig := <-jobs:
			// Ctrl-Z: the terminal goes back to the shell as it was; fg
			// (SIGCONT) takes it again, the bottom row on a line of its
			// own below what the shell printed.
			switch {
			case mode.isStop(sig):
				r.suspend()
				mode.stop()
			case mode.isCont(sig):
				if err := mode.resume(); err != nil {
					say(fmt.Sprintf("submit: warning: the terminal's mode: %v", err))
				}
				r.resumed()
			}
		case b, ok := <-keys:
			if !ok {
				keys = nil
				continue
			}
			done, eof := typed.feed(b)
			r.setInput(typed.text())
			for _, line := range done {
				handleLine(line)
			}
			if eof {
				keys = nil
			}
		case <-tick:
			if !started {
				r.setStatus(fmt.Sprintf("waiting for a worker · %s", time.Since(begin).Round(time.Second)))
			} else if finished == nil && time.Since(r.lastEvent) > 500*time.Millisecond {
				what := "working"
				if len(r.approvals) > 0 {
					what = "waiting for approval"
				} else if r.toolRun != "" {
					what = "running " + r.toolRun
				}
				r.setStatus(fmt.Sprintf("%s · turn %d · %s", what, max(r.turns, 1), time.Since(begin).Round(time.Second)))
			}
		case line, ok := <-lines:
			if !ok {
				lines = nil
				continue
			}
			handleLine(line)
		case res := <-results:
			showResult(res)
		case <-e.interrupts:
			if o.abortOnInterrupt && !aborting {
				aborting = true
				say(fmt.Sprintf("aborting run %s… (Ctrl-C again to detach)", o.run))
				send(bus.KindAbort, "interrupted (Ctrl-C)")
				continue
			}
			r.end()
			fmt.Fprintf(e.stderr, "\ndetached from run %s; it goes on.\n  re-attach: submit follow %s\n  abort:     submit abort %s\n", o.run, o.run, o.run)
			return exitDetached
		}
	}
}

func kindName(kind string) string {
	switch kind {
	case bus.KindSteer:
		return "steering"
	case bus.KindFollowUp:
		return "follow-up"
	}
	return kind
}

// parseInput reads a line typed while following: text steers, /followup
// TEXT queues a follow-up, /abort aborts.
func parseInput(line string) (kind, text string, err error) {
	line = strings.TrimSpace(line)
	switch {
	case line == "":
		return "", "", nil
	case line == "/abort":
		return bus.KindAbort, "", nil
	case strings.HasPrefix(line, "/followup"):
		text = strings.TrimSpace(strings.TrimPrefix(line, "/followup"))
		if text == "" {
			return "", "", errors.New("usage: /followup TEXT")
		}
		return bus.KindFollowUp, text, nil
	case strings.HasPrefix(line, "//"):
		return bus.KindSteer, line[1:], nil // "//x" steers with "/x"
	case strings.HasPrefix(line, "/"):
		return "", "", fmt.Errorf("unknown command %q: type text to steer, /followup TEXT, /abort (//text steers with /text)", cut(line, 40))
	}
	return bus.KindSteer, line, nil
}

// readKeys reads what is typed, as it comes, in a goroutine; like
// readLines it may stay blocked reading until the process exits.
func readKeys(r io.Reader, gp *goPanics) <-chan []byte {
	ch := make(chan []byte)
	go func() {
		defer gp.catch()
		defer close(ch)
		buf := make([]byte, 1024)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				ch <- bytes.Clone(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// readLines reads lines in a goroutine. It ends with the input; on a
// terminal the process exits while it is blocked reading, which is fine.
func readLines(r io.Reader, gp *goPanics) <-chan string {
	ch := make(chan string)
	go func() {
		defer gp.catch()
		defer close(ch)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), bus.MaxControlBytes)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}

// goPanics carries a panic of a goroutine of follow to its loop.
type goPanics struct {
	ch   chan panicked
	done chan struct{} // follow returned: a panic goes on where it is
}

// panicked is a goroutine's panic, with that goroutine's stack.
type panicked struct {
	v     any
	stack []byte
}

func (p panicked) String() string {
	return fmt.Sprintf("%v [in a goroutine of follow]\n\n%s", p.v, p.stack)
}

// catch, deferred, hands a panic to the loop.
func (gp *goPanics) catch() {
	v := recover()
	if v == nil {
		return
	}
	p := panicked{v, debug.Stack()}
	select {
	case gp.ch <- p:
	case <-gp.done:
		panic(p)
	}
}

func decodeFinished(env *bus.Envelope) (*bus.RunFinished, error) {
	ev, err := env.Decode()
	if err != nil {
		return nil, err
	}
	return ev.RunFinished, nil
}

func statusCode(status string) int {
	switch status {
	case bus.StatusSucceeded:
		return exitOK
	case bus.StatusAborted:
		return exitAborted
	}
	return exitFailed
}

// noWorkerNotice says why a run has not been picked up: which queue, and
// whether any worker is connected to it. It reads the queue consumer's
// info: pull requests waiting (idle workers), requests in progress (busy
// workers) and requests pending.
func noWorkerNotice(ctx context.Context, c *bus.Client, run, queue string, waited time.Duration) string {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if queue == "" {
		if rec, err := c.Status(ctx, run); err == nil {
			queue = rec.Queue
		}
	}
	if queue == "" {
		queue = bus.DefaultQueue
	}
	head := fmt.Sprintf("no worker has picked up run %s after %s (queue %q)", run, waited.Round(100*time.Millisecond), queue)
	n := c.Names()
	cons, err := c.JetStream().Consumer(ctx, n.RunsStream(), n.Consumer(queue))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return head + fmt.Sprintf(": no worker has ever served this queue (no consumer %s).\n"+
			"  Start one: worker --queue %s; still waiting (Ctrl-C detaches, the run stays queued)", n.Consumer(queue), queue)
	}
	if err != nil {
		return head + fmt.Sprintf(" (cannot read the queue: %v); still waiting", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return head + fmt.Sprintf(" (cannot read the queue: %v); still waiting", err)
	}
	switch {
	case info.NumWaiting > 0:
		return head + fmt.Sprintf(": %d idle worker pull(s) are waiting on the queue, %d request(s) pending; still waiting", info.NumWaiting, info.NumPending)
	case info.NumAckPending > 0:
		return head + fmt.Sprintf(": the workers are busy (%d run(s) in progress, %d request(s) queued); still waiting", info.NumAckPending, info.NumPending)
	}
	return head + fmt.Sprintf(": no worker is connected to this queue (%d request(s) queued).\n"+
		"  Start one: worker --queue %s; still waiting (Ctrl-C detaches, the run stays queued)", info.NumPending, queue)
}
