package worker

import (
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
)

// The approvals of a run: its gated calls asking, the answers that came
// before their call asked, and the keys resolved (approval.go's
// invariants).

type answer struct {
	a      bus.ApprovalAnswer
	seq    uint64
	stored time.Time // when AGENTS_CONTROL stored it
	size   int       // its message's bytes
}

// approvals is a run's gated calls and unmatched answers.
type approvals struct {
	mu      sync.Mutex
	pending []*gatedCall // in the order they registered
	early   []answer     // in the order they came
	// earlyBytes is the size of the kept answers' messages.
	earlyBytes int
	// resolved are the keys that took their answer (or timed out, or
	// stopped waiting), with the outcome; earlier attempts' too.
	resolved map[string]string
	// rejections counts the tool_approval_rejected events published for
	// dropped answers (maxStaleRejections).
	rejections int
	// resumed are calls an earlier attempt asked for that got no answer:
	// they wait again with their original times and fence, without a new
	// request. resumedKeys keeps their keys once taken.
	resumed     map[string]workerproto.PendingCall
	resumedKeys map[string]bool
	// deferred are the calls of that batch that never started.
	deferred []agent.Content
}

type gatedCall struct {
	id, tool    string
	requestedAt time.Time
	expiresAt   time.Time
	// after is the fence (invariant 1); asked is set once it is known.
	after   uint64
	asked   bool
	answers []answer
	wake    chan struct{}
}

// restoreResolved takes the keys earlier attempts resolved (invariant 2).
func (ap *approvals) restoreResolved(keys map[string]string) {
	if len(keys) == 0 {
		return
	}
	ap.mu.Lock()
	defer ap.mu.Unlock()
	if ap.resolved == nil {
		ap.resolved = map[string]string{}
	}
	for k, d := range keys {
		ap.resolved[k] = d
	}
}

// isWaiting reports whether a call with the id waits for its answer.
func (ap *approvals) isWaiting(id string) bool {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	for _, c := range ap.pending {
		if c.id == id {
			return true
		}
	}
	return false
}

// add registers a gated call (before it asks: answers for its key are
// queued to it from now on) and gives it the answers kept for its key.
func (ap *approvals) add(c *gatedCall) {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	ap.pending = append(ap.pending, c)
	kept := ap.early[:0]
	for _, e := range ap.early {
		if e.a.ToolCallID == c.id {
			c.answers = append(c.answers, e)
			ap.earlyBytes -= e.size
		} else {
			kept = append(kept, e)
		}
	}
	clear(ap.early[len(kept):])
	ap.early = kept
}

// asked sets the call's fence once known. The kept answers it passes can
// apply to no call: a call that asks later reads a fence at least as high
// (invariant 4), except one a resumed attempt still has to register with
// its own fence. They are returned, to be dropped.
func (ap *approvals) asked(c *gatedCall, after uint64) []answer {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	c.after, c.asked = after, true
	var stale []answer
	kept := ap.early[:0]
	for _, e := range ap.early {
		if e.seq <= after && !ap.resumedKeys[e.a.ToolCallID] {
			stale = append(stale, e)
			ap.earlyBytes -= e.size
		} else {
			kept = append(kept, e)
		}
	}
	clear(ap.early[len(kept):])
	ap.early = kept
	return stale
}

func (ap *approvals) remove(c *gatedCall) {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	ap.removeLocked(c)
}

func (ap *approvals) removeLocked(c *gatedCall) {
	for i, p := range ap.pending {
		if p == c {
			ap.pending = append(ap.pending[:i:i], ap.pending[i+1:]...)
			return
		}
	}
}

// settle removes a call that has its outcome and marks its key resolved;
// it returns the answers that came meanwhile, to be dropped.
func (ap *approvals) settle(c *gatedCall, outcome string) []answer {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	ap.removeLocked(c)
	if ap.resolved == nil {
		ap.resolved = map[string]string{}
	}
	ap.resolved[c.id] = outcome
	left := c.answers
	c.answers = nil
	return left
}

// next takes the call's queued answers.
func (ap *approvals) next(c *gatedCall) []answer {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	out := c.answers
	c.answers = nil
	return out
}

func (ap *approvals) takeResumed(id string) (workerproto.PendingCall, bool) {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	p, ok := ap.resumed[id]
	if ok {
		delete(ap.resumed, id)
	}
	return p, ok
}

// gate is a run's approval of tool calls.
type gate struct {
	policy  *bus.Approval          // the run's gate; nil: none
	clamped bool                   // its timeout was lowered to MaxApprovalTimeout
	calls   approvals              // the gated calls asking, and their answers
	ungated map[string]*agent.Tool // the gated tools, unwrapped
}
