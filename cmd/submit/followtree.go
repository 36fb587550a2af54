package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// Following a run's tree (submit follow --tree; child runs, protocol
// 1.10): the root's events and those of every child run its run_agent
// calls start, and theirs, each line prefixed by its run's id. A child is
// followed from its call's tool_execution_start (its id follows from the
// call's key, bus.ChildRunID), at most maxTreeRuns runs. Each run has its
// own renderer writing into its own line buffer; whole lines go to the
// terminal under one lock, so lines of runs streaming at once never mix.
// The command ends once the root's run_finished is shown and every child's
// follow has ended (a child of a finished parent ends too: it finished,
// or its parent's end aborted it), or treeGrace after the root's end.

// treeGrace bounds the wait for the children's follows after the root's
// end (a child lost before it ran never ends).
const treeGrace = 10 * time.Second

// lineWriter writes whole lines, each after prefix, to w under mu.
type lineWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	buf    bytes.Buffer
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.buf.Write(p)
	for {
		i := bytes.IndexByte(l.buf.Bytes(), '\n')
		if i < 0 {
			return len(p), nil
		}
		line := l.buf.Next(i + 1)
		l.mu.Lock()
		_, err := fmt.Fprintf(l.w, "%s%s", l.prefix, line)
		l.mu.Unlock()
		if err != nil {
			return len(p), err
		}
	}
}

// flush writes what is left of a line.
func (l *lineWriter) flush() {
	if l.buf.Len() > 0 {
		_, _ = l.Write([]byte("\n"))
	}
}

// followTree follows root and its child runs; it returns the exit code
// of the root's status.
func followTree(ctx context.Context, e *env, c *bus.Client, root string, noColor bool) int {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out sync.Mutex
	var wg sync.WaitGroup
	var mu sync.Mutex // guards seen, rootEnd
	seen := map[string]bool{root: true}
	var rootEnd *bus.RunFinished
	rootDone := make(chan struct{})
	var followRun func(id string)
	followRun = func(id string) {
		lw := &lineWriter{mu: &out, w: e.stdout, prefix: "[" + id + "] "}
		r := newRenderer(lw, style{on: e.color(noColor)})
		r.showPrompt = true
		defer func() {
			r.end()
			lw.flush()
		}()
		for env, err := range c.Follow(fctx, id) {
			if err != nil {
				if bus.IsFatalFollowError(err) {
					if fctx.Err() == nil {
						fmt.Fprintf(lw, "follow ended: %v\n", err)
					}
					return
				}
				continue
			}
			_ = r.Render(env)
			ev, derr := env.Decode()
			if derr != nil {
				continue
			}
			// A child's id is named by its call's events once its request
			// is stored (it cannot be computed: an HMAC with the fleet's key).
			if child, ok := bus.ChildRunIDOf(ev.Agent); ok {
				mu.Lock()
				start := !seen[child] && len(seen) < maxTreeRuns
				seen[child] = true
				mu.Unlock()
				if start {
					wg.Go(func() { followRun(child) })
				}
			}
			switch {
			case ev.Type == bus.EventRunFinished:
				if id == root {
					mu.Lock()
					rootEnd = ev.RunFinished
					mu.Unlock()
				}
				return
			}
		}
	}
	go func() {
		defer close(rootDone)
		followRun(root)
	}()
	all := make(chan struct{})
	select {
	case <-rootDone:
	case <-ctx.Done():
	}
	go func() {
		<-rootDone
		wg.Wait()
		close(all)
	}()
	select {
	case <-all:
	case <-time.After(treeGrace):
	case <-ctx.Done():
	}
	cancel()
	<-all
	mu.Lock()
	defer mu.Unlock()
	if rootEnd == nil {
		return exitFailed
	}
	return statusCode(rootEnd.Status)
}
