package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
)

// Answer checks an approval answer and publishes it for a run through
// JetStream (stored in AGENTS_CONTROL even while no worker holds the run);
// it returns the control stream sequence. A finished run gives
// ErrRunFinished and nothing is sent. It does not check that the call is
// pending: see PendingOf.
func (c *Client) Answer(ctx context.Context, runID string, a ApprovalAnswer, opts ...ControlOption) (uint64, error) {
	if err := CheckID(runID); err != nil {
		return 0, err
	}
	if p := a.Problems(); len(p) > 0 {
		return 0, fmt.Errorf("approval answer: %s", strings.Join(p, "; "))
	}
	return c.publishControl(ctx, runID, KindApprove, a, opts...)
}

// PendingCall is a gated tool call waiting for an answer.
type PendingCall struct {
	Run   string `json:"run"`
	Queue string `json:"queue,omitempty"`
	// Title is the run's record's title (PendingApprovals).
	Title      string `json:"title,omitempty"`
	ToolCallID string `json:"toolCallId"`
	ToolName   string `json:"toolName"`
	// Args are the arguments the model chose, from the call's
	// tool_approval_requested event.
	Args json.RawMessage `json:"args,omitempty"`
	// Parameters is the tool's JSON Schema from the same event (since
	// 1.8; absent from older workers' events and for large schemas).
	Parameters json.RawMessage `json:"parameters,omitempty"`
	// RequestedAt is when the request was published; WaitingSince when
	// the run started waiting (its record's waiting.since, else
	// RequestedAt).
	RequestedAt  time.Time `json:"requestedAt"`
	WaitingSince time.Time `json:"waitingSince"`
	ExpiresAt    time.Time `json:"expiresAt,omitzero"`
}

// approvalEvent is the part of the approval events (and of
// tool_execution_end) that PendingOf reads.
type approvalEvent struct {
	Type       string          `json:"type"`
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	Args       json.RawMessage `json:"args"`
	ExpiresAt  int64           `json:"expiresAt"`
	Parameters json.RawMessage `json:"parameters"`
}

// PendingCalls folds a run's envelopes (in stream order) into its pending
// gated calls, the oldest first: a call with tool_approval_requested and neither
// tool_approval_resolved nor tool_execution_end (in any attempt: a resumed
// attempt keeps waiting without asking again); none once the run has
// finished. A result or resolution settles the oldest unsettled call with
// its id (a model may reuse ids across turns).
func PendingCalls(envs []*Envelope) []PendingCall {
	var out []PendingCall
	settle := func(id string) {
		for i := range out {
			if out[i].ToolCallID == id {
				out = append(out[:i], out[i+1:]...)
				return
			}
		}
	}
	last := map[int]uint64{} // an attempt's last seq taken: a stored copy is skipped
	for _, env := range envs {
		if env.Seq != 0 && env.Seq <= last[env.Attempt] {
			continue
		}
		last[env.Attempt] = env.Seq
		switch env.Type {
		case EventRunFinished:
			return nil
		case EventToolApprovalRequested, EventToolApprovalResolved, string(agent.EventToolExecutionEnd):
		default:
			continue
		}
		var ev approvalEvent
		if json.Unmarshal(env.Event, &ev) != nil || ev.ToolCallID == "" {
			continue
		}
		if env.Type != EventToolApprovalRequested {
			settle(ev.ToolCallID)
			continue
		}
		p := PendingCall{Run: env.Run, ToolCallID: ev.ToolCallID, ToolName: ev.ToolName,
			Args: ev.Args, Parameters: ev.Parameters, RequestedAt: time.UnixMilli(env.TS)}
		if ev.ExpiresAt > 0 {
			p.ExpiresAt = time.UnixMilli(ev.ExpiresAt)
		}
		p.WaitingSince = p.RequestedAt
		out = append(out, p)
	}
	return out
}

// PendingOf returns a run's pending gated calls, read from its events as
// stored now (answers need no more than that: a call that is not pending
// yet cannot be named).
func (c *Client) PendingOf(ctx context.Context, runID string) ([]PendingCall, error) {
	envs, err := c.storedEvents(ctx, runID, time.Time{})
	if err != nil {
		return nil, err
	}
	return PendingCalls(envs), nil
}

// requestSlack is how much earlier than a record's requestedAt (the
// worker's clock) a read of the requests starts (the stream's clock).
const requestSlack = time.Minute

// PendingOfRecord is PendingOf for a run whose record lists its waiting
// calls: it reads the events from shortly before the oldest request (a
// long run has many), and all of them if a listed request is not there.
func (c *Client) PendingOfRecord(ctx context.Context, r *RunRecord) ([]PendingCall, error) {
	if r.Waiting == nil {
		return c.PendingOf(ctx, r.ID)
	}
	if len(r.Waiting.Approvals) == 0 {
		return c.PendingOf(ctx, r.ID)
	}
	oldest := r.Waiting.Approvals[0].RequestedAt
	for _, a := range r.Waiting.Approvals {
		oldest = min(oldest, a.RequestedAt)
	}
	envs, err := c.storedEvents(ctx, r.ID, time.UnixMilli(oldest).Add(-requestSlack))
	if err != nil {
		return nil, err
	}
	asked := map[string]bool{}
	for _, env := range envs {
		if env.Type == EventToolApprovalRequested {
			var ev approvalEvent
			if json.Unmarshal(env.Event, &ev) == nil {
				asked[ev.ToolCallID] = true
			}
		}
	}
	for _, a := range r.Waiting.Approvals {
		if !asked[a.ToolCallID] {
			return c.PendingOf(ctx, r.ID) // clocks apart more than the slack
		}
	}
	return PendingCalls(envs), nil
}

// storedEvents reads a run's envelopes stored now (those stored since a
// time, unless zero) with an ordered consumer (the reads every client role
// has), stopping when none is pending. It keeps only the envelopes
// PendingCalls folds: a run's transcript may be large (a hostile or
// clock-skewed record makes the read start at its first event), and what
// is kept is bounded by its tool calls.
func (c *Client) storedEvents(ctx context.Context, runID string, since time.Time) ([]*Envelope, error) {
	if err := CheckID(runID); err != nil {
		return nil, err
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{c.names.Events(runID)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
	if !since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, release, err := c.OrderedEvents(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", runID, err)
	}
	defer release()
	// The create's answer says what is pending: no info request (an
	// approvals page reads 100 runs this way, each round trip counts).
	info := cons.CachedInfo()
	if info == nil {
		if info, err = cons.Info(ctx); err != nil {
			return nil, fmt.Errorf("events of %s: %w", runID, err)
		}
	}
	if info.NumPending == 0 {
		return nil, nil
	}
	out, err := readEvents(ctx, runID, cons, func(md *jetstream.MsgMetadata, data []byte) (keep, more bool) {
		return folded(data), md.NumPending > 0
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// foldedTypes are the event types PendingCalls reads.
var foldedTypes = [][]byte{[]byte(`"` + EventRunFinished + `"`), []byte(`"` + EventToolApprovalRequested + `"`),
	[]byte(`"` + EventToolApprovalResolved + `"`), []byte(`"` + string(agent.EventToolExecutionEnd) + `"`)}

// folded reports whether an envelope may be one PendingCalls reads: its
// JSON holds one of their quoted types (a cheap look before decoding; a
// text that quotes one is decoded and then dropped by its type).
func folded(data []byte) bool {
	for _, t := range foldedTypes {
		if bytes.Contains(data, t) {
			return true
		}
	}
	return false
}

// ApprovalsOptions filter PendingApprovals.
type ApprovalsOptions struct {
	Queue string // "" for every queue
	// Limit bounds the runs a page lists (a run may wait for more than
	// one call); 0 for no bound.
	Limit int
	// Cursor is a page's NextCursor: where the next page starts.
	Cursor string
	// MaxScan bounds the records read to find waiting runs
	// [DefaultListScan]; -1 for no bound.
	MaxScan int
}

// PendingApprovals lists the pending approvals across the fleet: the
// running records waiting for approval, each run's pending calls read from
// its events since shortly before its oldest waiting request (with the
// arguments the model chose).
func (c *Client) PendingApprovals(ctx context.Context, o ApprovalsOptions) ([]PendingCall, error) {
	p, err := c.PendingApprovalsPage(ctx, o)
	if err != nil {
		return nil, err
	}
	return p.Calls, nil
}

// ApprovalsPage is one page of PendingApprovals.
type ApprovalsPage struct {
	Calls []PendingCall
	// NextCursor is the Cursor of the next page; "" at the end.
	NextCursor string
	// Scanned of Stored: the records read, of the bucket's; Truncated:
	// MaxScan stopped the scan, so older waiting runs may be left out
	// (NextCursor goes on from there).
	Scanned   int
	Stored    uint64
	Truncated bool
}

// pendingReads bounds the runs whose events a page reads at once.
const pendingReads = 16

// PendingApprovalsPage is a page of PendingApprovals: the records waiting
// for approval in listing order (the most recently written first, as
// ListPage), at most Limit of them, each run's pending calls read from its
// events, pendingReads runs at a time; within the page the oldest request
// comes first. Its cost is the records ListPage reads plus one read of
// each listed run's events since its oldest request, never the other
// waiting runs.
func (c *Client) PendingApprovalsPage(ctx context.Context, o ApprovalsOptions) (*ApprovalsPage, error) {
	page, err := c.ListPage(ctx, ListOptions{State: StateWaiting, WaitingFor: WaitingApproval, Queue: o.Queue,
		Limit: o.Limit, Cursor: o.Cursor, MaxScan: o.MaxScan})
	if err != nil {
		return nil, err
	}
	recs := page.Records
	calls := make([][]PendingCall, len(recs))
	errs := make([]error, len(recs))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, pendingReads)
	var wg sync.WaitGroup
	for i := range recs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			calls[i], errs[i] = c.PendingOfRecord(ctx, &recs[i])
			if errs[i] != nil {
				cancel() // the page fails: the other reads stop
			}
		})
	}
	wg.Wait()
	if err := firstError(errs); err != nil {
		return nil, err
	}
	var out []PendingCall
	for i := range recs {
		r := &recs[i]
		for _, p := range calls[i] {
			p.Queue, p.Title = r.Queue, r.Title
			if !r.Waiting.Since.IsZero() {
				p.WaitingSince = r.Waiting.Since
			}
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].RequestedAt.Equal(out[j].RequestedAt) {
			return out[i].RequestedAt.Before(out[j].RequestedAt)
		}
		return out[i].Run < out[j].Run
	})
	return &ApprovalsPage{Calls: out, NextCursor: page.NextCursor, Scanned: page.Scanned, Stored: page.Stored, Truncated: page.Truncated}, nil
}

// firstError is the first error that is not the cancellation another
// read's failure caused.
func firstError(errs []error) error {
	var first error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if !errors.Is(err, context.Canceled) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}
