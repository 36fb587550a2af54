package worker

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
)

// controls delivers a run's control messages to its Agent, each exactly
// once and in stream order per kind. Two paths feed it: the worker's
// wildcard subscription to the control stream's republished messages (the
// live path, which carries each message's stream sequence and the previous
// sequence of its subject), and a catch-up read of the control stream (at
// pickup, on a sequence gap, and before finishing). Sequences per kind
// make both paths idempotent.
type controls struct {
	r *run

	mu     sync.Mutex
	closed bool
	// started: the pickup catch-up ran. Live messages wait for it, so a
	// resumed attempt knows what earlier attempts delivered (skip) before
	// it takes anything; the catch-up reads whatever came meanwhile.
	started bool
	last    map[string]uint64 // highest sequence taken, per kind
	max     uint64            // highest sequence taken
	queued  []queuedControl   // handed to the agent, not yet in the transcript
	// delivered are control sequences an earlier attempt put into the
	// transcript (restored by resume): taken, not delivered again.
	delivered map[uint64]bool
}

type queuedControl struct {
	first *agent.Content // identity of the message: its content array
	seq   uint64
}

func newControls(r *run) *controls {
	return &controls{r: r, last: map[string]uint64{}}
}

// live handles a republished control message.
func (c *controls) live(kind string, m *nats.Msg) {
	seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
	if err != nil {
		return
	}
	prev, _ := strconv.ParseUint(m.Header.Get("Nats-Last-Sequence"), 10, 64)
	stored := time.Now()
	if ts := m.Header.Get("Nats-Time-Stamp"); ts != "" {
		if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			stored = t
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.r.log.Debug("control message for a finishing run ignored", "kind", kind, "controlSeq", seq)
		return
	}
	if !c.started {
		return // the pickup catch-up will read it from the stream
	}
	if seq <= c.last[kind] {
		return // already taken through the catch-up read
	}
	if prev == c.last[kind] {
		c.take(kind, seq, m.Data, stored)
		return
	}
	// A gap: something of this kind was not seen yet. Read the stream.
	c.catchUpLocked(c.r.w.hardCtx)
}

// catchUp reads control messages stored but not taken yet.
func (c *controls) catchUp(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.started = true
		c.catchUpLocked(ctx)
	}
}

func (c *controls) catchUpLocked(ctx context.Context) {
	from := c.last[bus.KindSteer]
	for _, k := range [...]string{bus.KindFollowUp, bus.KindAbort} {
		from = min(from, c.last[k])
	}
	from++
	s := c.r.w.controlStream
	subj := c.r.w.names.ControlAll(c.r.id)
	for {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := s.GetMsg(gctx, from, jetstream.WithGetMsgSubject(subj))
		cancel()
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgNotFound) {
				c.r.log.Warn("control catch-up read failed", "err", err)
			}
			return
		}
		kind := workerproto.ControlKind(m.Subject)
		if m.Sequence > c.last[kind] {
			c.take(kind, m.Sequence, m.Data, m.Time)
		}
		from = m.Sequence + 1
	}
}

// refresh reads control messages whose live copy was lost (the republish
// is plain NATS: a reconnect can drop one), so a lone abort waits at most a
// heartbeat, not until the run goes idle. Nothing before the pickup
// catch-up.
func (c *controls) refresh(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed && c.started {
		c.catchUpLocked(ctx)
	}
}

// skip marks control sequences as delivered by an earlier attempt.
func (c *controls) skip(seqs []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.delivered == nil {
		c.delivered = map[uint64]bool{}
	}
	for _, s := range seqs {
		c.delivered[s] = true
	}
}

// take delivers one control message. Caller holds mu.
func (c *controls) take(kind string, seq uint64, data []byte, stored time.Time) {
	c.last[kind] = seq
	c.max = max(c.max, seq)
	r := c.r
	if c.delivered[seq] {
		r.log.Debug("control message already in the transcript; not delivered again", "kind", kind, "controlSeq", seq)
		return
	}
	r.w.obs.ControlReceived(kind)
	switch kind {
	case bus.KindAbort:
		reason := workerproto.DecodeAbort(data)
		r.log.Info("abort received", "controlSeq", seq, "reason", reason)
		r.abort(reason)
	case bus.KindSteer, bus.KindFollowUp:
		msg, err := workerproto.DecodeUserControl(data, stored)
		if err != nil {
			r.log.Warn("control message ignored", "kind", kind, "controlSeq", seq, "err", err)
			return
		}
		c.queued = append(c.queued, queuedControl{first: &msg.Content[0], seq: seq})
		r.log.Info("control message queued", "kind", kind, "controlSeq", seq)
		if kind == bus.KindSteer {
			r.agent.Steer(msg)
		} else {
			r.agent.FollowUp(msg)
		}
	}
}

// seqOf returns the control sequence of a user message the agent emitted
// (0 for messages that did not come from a control message). At the
// message's end the entry is dropped.
func (c *controls) seqOf(m *agent.Message, end bool) uint64 {
	if m == nil || m.Role != agent.RoleUser || len(m.Content) == 0 {
		return 0
	}
	first := &m.Content[0]
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, q := range c.queued {
		if q.first == first {
			if end {
				c.queued = append(c.queued[:i:i], c.queued[i+1:]...)
			}
			return q.seq
		}
	}
	return 0
}

// finishIfIdle reads what is stored and, when the agent has nothing
// queued, closes: later control messages are ignored. It reports whether
// it closed; if not, the caller runs the agent again.
func (c *controls) finishIfIdle(ctx context.Context) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return true
	}
	c.catchUpLocked(ctx)
	if c.r.agent.HasQueuedMessages() && !c.r.stopping() {
		return false
	}
	c.closed = true
	return true
}

// close stops taking control messages and returns the highest sequence
// taken.
func (c *controls) close() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return c.max
}
