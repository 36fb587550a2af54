// Package callkey renames a model's tool call ids to keys unique within
// its run (since protocol 1.8): see the invariants below.
package callkey

import (
	"context"
	"iter"
	"slices"
	"strconv"

	"github.com/agentfleet/agentfleet/agent"
)

// Tool call keys (since protocol 1.8).
//
// A model's tool call ids need not be unique: faux scripts, hostile
// endpoints and some OpenAI-compatible servers repeat them ("c1" in every
// turn). An approval answer names a call, so a repeated id let an answer
// meant for one call approve another. The worker therefore renames each
// call, where the assistant message enters it (Stream wraps the model's
// stream), to a key; the agent, the events, the tool results, the approval
// answers and the next model request all know the call by its key only.
//
// Invariants:
//
//  1. A key differs from every tool call id of the context the model is
//     called with (every earlier assistant message of the run: restored,
//     continued from, or given in the request's messages) and from the
//     other keys of its message; keys of earlier messages are keys
//     themselves, so keys are unique within the run.
//  2. The key is the provider's id when that is a valid key (1..128
//     visible ASCII bytes) that invariant 1 allows. Otherwise it is
//     <base>-t<turn>-<pos>: base the id with every byte that is not
//     visible ASCII as '_', at most 64 bytes ("call" when empty), turn
//     the message's number among the context's assistant messages
//     (counting it), pos the call's number among its message's calls,
//     both from 1; while that is taken too, "-<n>" is added (n = 2, 3, ...).
//  3. A key is a function of the context and the message alone. The
//     stored message carries its keys, so a resumed attempt has them; a
//     message it asks the model for again is keyed from the same restored
//     context.
//  4. Keys are visible ASCII: valid in JSON, in a NATS header
//     (Agentfleet-Tool-Call) and as an answer's toolCallId (1..256
//     printable bytes); the openai provider adapts any id to what its
//     endpoint accepts, as it always did.
//
// The streamed toolcall_start and toolcall_end carry the key as known
// then; the message at done (or error) is keyed afresh by invariant 2,
// and it is what the transcript keeps.

// Bounds of call keys.
const (
	maxKeptCallID = 128
	maxKeyBase    = 64
)

// Stream renames the tool call ids of the model's messages to the run's
// call keys.
func Stream(fn agent.StreamFn) agent.StreamFn {
	return func(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			k := newCallKeys(llm.Messages)
			for ev := range fn(ctx, model, llm, opts) {
				switch ev.Type {
				case agent.StreamToolCallStart:
					ev.ID = k.streamed(ev.ContentIndex, ev.ID)
				case agent.StreamToolCallEnd:
					if ev.ToolCall != nil {
						c := *ev.ToolCall
						c.ID = k.streamed(ev.ContentIndex, c.ID)
						ev.ToolCall = &c
					}
				case agent.StreamDone, agent.StreamError:
					if ev.Message != nil {
						ev.Message = k.keyMessage(ev.Message)
					}
				}
				if !yield(ev) {
					return
				}
			}
		}
	}
}

// callKeys keys the calls of one assistant message.
type callKeys struct {
	msgs  []agent.Message // the context
	taken map[string]bool // its call ids, read at the first call
	turn  int
	// The streamed calls: by content index, the provider's id, its key
	// and its position.
	streamedAt map[int]streamedCall
	inMessage  map[string]bool // keys given to streamed calls
}

type streamedCall struct {
	id, key string
	pos     int
}

func newCallKeys(msgs []agent.Message) *callKeys { return &callKeys{msgs: msgs} }

// read takes the context's call ids and turns, once: a message without
// calls (most) costs nothing.
func (k *callKeys) read() {
	if k.taken != nil {
		return
	}
	k.taken, k.turn = map[string]bool{}, 1
	for i := range k.msgs {
		if k.msgs[i].Role != agent.RoleAssistant {
			continue
		}
		k.turn++
		for _, c := range k.msgs[i].Content {
			if c.Type == agent.ContentToolCall {
				k.taken[c.ID] = true
			}
		}
	}
}

// streamed returns the key of a streamed call (toolcall_start, and again
// at its toolcall_end).
func (k *callKeys) streamed(index int, id string) string {
	if k.streamedAt == nil {
		k.streamedAt = map[int]streamedCall{}
		k.inMessage = map[string]bool{}
	}
	s, ok := k.streamedAt[index]
	if ok && s.id == id {
		return s.key
	}
	if !ok {
		s.pos = len(k.streamedAt) + 1
	} else {
		delete(k.inMessage, s.key) // its id changed: keyed again
	}
	s.id = id
	s.key = k.key(id, s.pos, k.inMessage)
	k.streamedAt[index] = s
	k.inMessage[s.key] = true
	return s.key
}

// keyMessage returns the final message with its calls keyed (a copy when
// a key differs from its id: the provider's message is not touched).
func (k *callKeys) keyMessage(m *agent.Message) *agent.Message {
	var content []agent.Content
	var mine map[string]bool
	pos := 0
	for i, c := range m.Content {
		if c.Type != agent.ContentToolCall {
			continue
		}
		if mine == nil {
			mine = map[string]bool{}
		}
		pos++
		key := k.key(c.ID, pos, mine)
		mine[key] = true
		if key == c.ID {
			continue
		}
		if content == nil {
			content = slices.Clone(m.Content)
		}
		content[i].ID = key
	}
	if content == nil {
		return m
	}
	out := *m
	out.Content = content
	return &out
}

// key is invariant 2: the key of the call at pos (from 1) with the
// provider's id, given the keys of its message's earlier calls.
func (k *callKeys) key(id string, pos int, mine map[string]bool) string {
	k.read()
	free := func(s string) bool { return !k.taken[s] && !mine[s] }
	if validKeptID(id) && free(id) {
		return id
	}
	key := keyBase(id) + "-t" + strconv.Itoa(k.turn) + "-" + strconv.Itoa(pos)
	for n := 2; !free(key); n++ {
		key = keyBase(id) + "-t" + strconv.Itoa(k.turn) + "-" + strconv.Itoa(pos) + "-" + strconv.Itoa(n)
	}
	return key
}

// validKeptID reports whether a provider's id may be a key as it is.
func validKeptID(id string) bool {
	if id == "" || len(id) > maxKeptCallID {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

// keyBase is the id as a key's base: visible ASCII, bounded, not empty.
func keyBase(id string) string {
	b := []byte(id[:min(len(id), maxKeyBase)])
	for i, c := range b {
		if c <= ' ' || c > '~' {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "call"
	}
	return string(b)
}
