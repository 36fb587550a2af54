package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/builtin"
	"github.com/agentfleet/agentfleet/worker/internal/genai"
	"github.com/agentfleet/agentfleet/worker/internal/runtrace"
)

// BuiltinTools returns the built-in tools: calculator, current_time, sleep.
func BuiltinTools() []*agent.Tool { return builtin.Tools() }

type runKey struct{}

// maxToolTimeout is a tool call's timeout that never ends it.
const maxToolTimeout = 100 * 365 * 24 * time.Hour

// wrapTool returns a copy of t whose Execute has a timeout, caps the
// result's size and reports to the observer.
func (w *Worker) wrapTool(t *agent.Tool) *agent.Tool {
	inner := t.Execute
	name := t.Name
	timeout := w.cfg.ToolTimeout
	if name == bus.ToolRunAgent {
		timeout = maxToolTimeout // a child run has its own timeout; the parent waits off its slot
	}
	maxArgs := w.cfg.MaxToolArgsBytes
	prepare := t.PrepareArguments
	return &agent.Tool{
		Name: t.Name, Label: t.Label, Description: t.Description, Parameters: t.Parameters,
		ExecutionMode: t.ExecutionMode,
		// Oversized arguments fail the call before validation and execution.
		PrepareArguments: func(args map[string]any) (map[string]any, error) {
			if raw, err := json.Marshal(args); err == nil && len(raw) > maxArgs {
				return nil, fmt.Errorf("the arguments of tool %s are %d bytes, the limit is %d", name, len(raw), maxArgs)
			}
			if prepare != nil {
				return prepare(args)
			}
			return args, nil
		},
		Execute: func(ctx context.Context, id string, args map[string]any, update agent.UpdateFunc) (agent.ToolResult, error) {
			if inner == nil {
				return agent.ToolResult{}, fmt.Errorf("tool %s has no implementation", name)
			}
			r, _ := ctx.Value(runKey{}).(*run)
			if r != nil {
				if err := r.storedBeforeTheCall(ctx); err != nil {
					return agent.ToolResult{}, fmt.Errorf("tool %s not run: %w", name, err)
				}
			}
			tctx, cancel := context.WithTimeout(ctx, timeout) // after the wait: the tool's own time
			defer cancel()
			start := time.Now()
			var endSpan func(agent.ToolResult, error)
			if r != nil && r.w.tracer != nil {
				tctx, endSpan = r.traceTool(tctx, name, id, args)
				// The agent recovers a tool's panic: end the span on that path too.
				defer runtrace.EndToolSpanOnPanic(endSpan)
			}
			res, err := inner(tctx, id, args, update)
			return w.toolCallDone(ctx, tctx, name, start, res, err, endSpan)
		},
	}
}

// storedBeforeTheCall waits until the run's events so far are stored:
// the call's tool_execution_start, the assistant message that made it,
// and for a gated call its tool_approval_resolved. A worker killed while
// the call runs then leaves them behind, and the next attempt gives the
// call the "may or may not have run" result instead of running it again
// (or asking the model again, when the message was lost too). A call
// whose run stopped, or was handed back while it waited for an approval,
// does not run. Not reported as a call (observer, span): nothing ran.
func (r *run) storedBeforeTheCall(ctx context.Context) error {
	err := r.pub.Sync(ctx)
	switch {
	case ctx.Err() != nil && r.tally.Aborted(): // also when stored as it ended
		return errors.New("the run was aborted") // not "context canceled": the model and the person see why
	case ctx.Err() != nil:
		return fmt.Errorf("its run stopped: %w", ctx.Err())
	case err != nil:
		return err
	case r.waitHandedBack.Load():
		return errors.New("its run was handed back")
	}
	return nil
}

// toolCallDone reports a tool call and bounds its result. Its own frame:
// the wrapper's stays on the stack while the tool runs.
//
//go:noinline
func (w *Worker) toolCallDone(ctx, tctx context.Context, name string, start time.Time, res agent.ToolResult, err error,
	endSpan func(agent.ToolResult, error)) (agent.ToolResult, error) {
	maxBytes := w.cfg.MaxToolResultBytes
	timedOut := false
	if err != nil && ctx.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded) {
		timedOut = true
		err = fmt.Errorf("tool %s timed out after %s", name, w.cfg.ToolTimeout)
	}
	r, _ := ctx.Value(runKey{}).(*run)
	if err != nil && ctx.Err() != nil && r != nil && r.tally.Aborted() {
		// Not "context canceled": the model and the person see why.
		err = fmt.Errorf("tool %s stopped: the run was aborted", name)
	}
	if r != nil {
		w.obs.ToolCall(r.info(), ToolCall{Tool: name, Duration: time.Since(start), Err: err, TimedOut: timedOut})
	}
	if endSpan != nil {
		endSpan(res, err)
	}
	if err != nil {
		// An error result is capped like a successful one.
		if msg := err.Error(); len(msg) > min(maxBytes, bus.MaxErrorBytes) {
			err = errors.New(clipString(msg, min(maxBytes, bus.MaxErrorBytes)))
		}
		return res, err
	}
	res.Content = capContent(res.Content, maxBytes)
	return res, nil
}

// capContent keeps at most max bytes of text and image data, cutting the
// text that crosses the limit and saying so.
func capContent(cs []agent.Content, max int) []agent.Content {
	total := 0
	for _, c := range cs {
		total += len(c.Text) + len(c.Data)
	}
	if total <= max {
		return cs
	}
	out := make([]agent.Content, 0, len(cs)+1)
	left := max
	for _, c := range cs {
		switch c.Type {
		case agent.ContentText:
			if len(c.Text) > left {
				c.Text = genai.ClipUTF8(c.Text, left)
			}
			left -= len(c.Text)
			out = append(out, c)
		case agent.ContentImage:
			if len(c.Data) <= left {
				left -= len(c.Data)
				out = append(out, c)
			}
		default:
			out = append(out, c)
		}
	}
	return append(out, agent.Text(fmt.Sprintf("\n[tool result truncated: %d bytes, the limit is %d]", total, max)))
}
