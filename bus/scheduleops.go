package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
)

// Schedule operations (since 1.10): a user asks a worker of the queue to
// write a schedule; only workers write AGENTS_SCHEDULES (schedule.go,
// invariant 2). A core NATS request on ScheduleOp(queue, name, op), taken
// by one worker of the queue (queue group ScheduleOpsGroup); its reply is
// a ScheduleOpReply.

// Schedule operations (the subject's last token).
const (
	ScheduleOpCreate  = "create"  // body: the Schedule
	ScheduleOpReplace = "replace" // body: the Schedule; the stored one of the name is replaced
	ScheduleOpPause   = "pause"
	ScheduleOpResume  = "resume"
	ScheduleOpDelete  = "delete"
	ScheduleOpTrigger = "trigger" // the reply names the run
)

// ScheduleOpsGroup is the queue group of the workers answering schedule
// operations: one worker of the queue answers each.
const ScheduleOpsGroup = "schedops"

// Error codes of a ScheduleOpReply.
const (
	ScheduleOpInvalid   = "invalid"   // Problems lists every problem
	ScheduleOpNotFound  = "not_found" // no schedule of the name on the queue
	ScheduleOpExists    = "exists"    // create: the name is taken
	ScheduleOpAmbiguous = "ambiguous" // the name is on several queues
	ScheduleOpFailed    = "failed"    // NATS trouble: retry
)

// ScheduleOpReply answers a schedule operation.
type ScheduleOpReply struct {
	Seq      uint64   `json:"seq,omitempty"` // create, replace: the def message's sequence
	Run      string   `json:"run,omitempty"` // trigger: the run id the fire submits
	Code     string   `json:"code,omitempty"`
	Error    string   `json:"error,omitempty"`
	Problems []string `json:"problems,omitempty"`
}

func (r *ScheduleOpReply) err() error {
	switch r.Code {
	case "":
		return nil
	case ScheduleOpInvalid:
		if len(r.Problems) > 0 {
			return &RequestError{Problems: r.Problems}
		}
	case ScheduleOpNotFound:
		return fmt.Errorf("%w: %s", ErrScheduleNotFound, r.Error)
	case ScheduleOpExists:
		return fmt.Errorf("%w: %s", ErrScheduleExists, r.Error)
	case ScheduleOpAmbiguous:
		return fmt.Errorf("%w: %s", ErrScheduleAmbiguous, r.Error)
	}
	return errors.New(r.Error)
}

// CreateSchedule asks a worker of the schedule's queue to store a new
// schedule; with replace it may replace one of the same name and queue.
func (c *Client) CreateSchedule(ctx context.Context, s *Schedule, replace bool) (uint64, error) {
	if err := s.Validate(); err != nil { // the worker checks again
		return 0, err
	}
	op := ScheduleOpCreate
	if replace {
		op = ScheduleOpReplace
	}
	r, err := c.scheduleOp(ctx, s.Queue, s.Name, op, s)
	return r.Seq, err
}

// PauseSchedule keeps the definition without the server's schedule, so
// nothing fires; ResumeSchedule puts it back.
func (c *Client) PauseSchedule(ctx context.Context, name string) error {
	return c.scheduleOpByName(ctx, name, ScheduleOpPause)
}

// ResumeSchedule makes a paused schedule fire again. An @every schedule
// counts its interval from the resume.
func (c *Client) ResumeSchedule(ctx context.Context, name string) error {
	return c.scheduleOpByName(ctx, name, ScheduleOpResume)
}

// DeleteSchedule removes a schedule (a tombstone replaces it); its runs
// are left alone.
func (c *Client) DeleteSchedule(ctx context.Context, name string) error {
	return c.scheduleOpByName(ctx, name, ScheduleOpDelete)
}

// TriggerSchedule fires a schedule now, paused or not; it returns the run
// id the fire submits.
func (c *Client) TriggerSchedule(ctx context.Context, name string) (string, error) {
	cur, err := c.findSchedule(ctx, name)
	if err != nil {
		return "", err
	}
	r, err := c.scheduleOp(ctx, cur.Queue, name, ScheduleOpTrigger, nil)
	return r.Run, err
}

func (c *Client) scheduleOpByName(ctx context.Context, name, op string) error {
	cur, err := c.findSchedule(ctx, name)
	if err != nil {
		return err
	}
	_, err = c.scheduleOp(ctx, cur.Queue, name, op, nil)
	return err
}

func (c *Client) scheduleOp(ctx context.Context, queue, name, op string, body any) (ScheduleOpReply, error) {
	data := []byte("{}")
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return ScheduleOpReply{}, err
		}
		data = b
	}
	if len(data) > MaxScheduleBytes {
		return ScheduleOpReply{}, fmt.Errorf("schedule %s: %d bytes, the limit is %d", name, len(data), MaxScheduleBytes)
	}
	m, err := c.nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: c.names.ScheduleOp(queue, name, op), Data: data})
	if errors.Is(err, nats.ErrNoResponders) {
		return ScheduleOpReply{}, fmt.Errorf("schedule %s: %w: no worker of queue %q answers schedule operations (start a worker of protocol 1.10 or later with --queue %s)", name, ErrUnknownQueue, queue, queue)
	}
	if err != nil {
		return ScheduleOpReply{}, fmt.Errorf("schedule %s: %s: %w", name, op, err)
	}
	var r ScheduleOpReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return ScheduleOpReply{}, fmt.Errorf("schedule %s: %s: a worker's reply does not decode: %w", name, op, err)
	}
	if err := r.err(); err != nil {
		return r, fmt.Errorf("schedule %s: %s: %w", name, op, err)
	}
	return r, nil
}

// ApplyScheduleOp does a schedule operation a request asked for, on queue
// and name (the request's subject, which permissions checked): workers
// answer with its reply. The body of create and replace must name the
// same queue and name.
func (c *Client) ApplyScheduleOp(ctx context.Context, queue, name, op string, body []byte) ScheduleOpReply {
	fail := func(err error) ScheduleOpReply {
		var re *RequestError
		switch {
		case errors.As(err, &re):
			return ScheduleOpReply{Code: ScheduleOpInvalid, Error: err.Error(), Problems: re.Problems}
		case errors.Is(err, ErrScheduleNotFound):
			return ScheduleOpReply{Code: ScheduleOpNotFound, Error: err.Error()}
		case errors.Is(err, ErrScheduleExists):
			return ScheduleOpReply{Code: ScheduleOpExists, Error: err.Error()}
		case errors.Is(err, ErrScheduleAmbiguous):
			return ScheduleOpReply{Code: ScheduleOpAmbiguous, Error: err.Error()}
		}
		return ScheduleOpReply{Code: ScheduleOpFailed, Error: err.Error()}
	}
	var p []string
	if !ValidQueue(queue) {
		p = append(p, fmt.Sprintf("queue %q must match [A-Za-z0-9_-]{1,64}", truncate(queue, 80)))
	}
	if !ValidID(name) {
		p = append(p, fmt.Sprintf("schedule name %q must match [A-Za-z0-9_-]{1,64}", truncate(name, 80)))
	}
	ops := []string{ScheduleOpCreate, ScheduleOpReplace, ScheduleOpPause, ScheduleOpResume, ScheduleOpDelete, ScheduleOpTrigger}
	if !slices.Contains(ops, op) {
		p = append(p, fmt.Sprintf("operation %q: use %s", truncate(op, 40), strings.Join(ops, ", ")))
	}
	if len(p) > 0 {
		return fail(&RequestError{Problems: p})
	}
	switch op {
	case ScheduleOpCreate, ScheduleOpReplace:
		var s Schedule
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			return fail(&RequestError{Problems: []string{fmt.Sprintf("the body is not a schedule: %v", err)}})
		}
		// The subject is what permissions checked.
		if s.Queue != queue || s.Name != name {
			return fail(&RequestError{Problems: []string{fmt.Sprintf("the body names schedule %q on queue %q, the subject %q on queue %q",
				truncate(s.Name, 80), truncate(s.Queue, 80), name, queue)}})
		}
		seq, err := c.storeSchedule(ctx, &s, op == ScheduleOpReplace)
		if err != nil {
			return fail(err)
		}
		return ScheduleOpReply{Seq: seq}
	case ScheduleOpPause, ScheduleOpResume:
		if err := c.setPaused(ctx, queue, name, op == ScheduleOpPause); err != nil {
			return fail(err)
		}
	case ScheduleOpDelete:
		if err := c.deleteSchedule(ctx, queue, name); err != nil {
			return fail(err)
		}
	case ScheduleOpTrigger:
		run, err := c.triggerSchedule(ctx, queue, name)
		if err != nil {
			return fail(err)
		}
		return ScheduleOpReply{Run: run}
	}
	return ScheduleOpReply{}
}

// IsInbox reports whether reply is a reply inbox (_INBOX.<token>...): the
// only reply subjects a worker answers on, since it answers with its own
// publish rights (docs/security.md, Schedules).
func IsInbox(reply string) bool {
	rest, ok := strings.CutPrefix(reply, "_INBOX.")
	return ok && rest != "" && !strings.ContainsAny(rest, " \t\r\n*>") && !strings.HasPrefix(rest, ".") &&
		!strings.HasSuffix(rest, ".") && !strings.Contains(rest, "..")
}
