// Package callkey renames a model's tool call ids to keys unique within
// its run (since protocol 1.8): see the invariants below.
package callkey

import (
	"cmp"
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
//     continued from, or given in the request's messages), from every
//     key the run's stored tool events name (a resumed attempt's
//     workerproto.Recovery.UsedKeys: also events it does not restore, after
//     a gap or from an attempt that lost its lease, whose requests an
//     approver may have seen) and from the other keys of its message;
//     keys of earlier messages are keys themselves, so keys are unique
//     within the run. A compacted context (issue 58) leaves the summarised
//     messages out: their keys are in Prior.Used and their assistant
//     messages in Prior.Turns, so the run's keys stay unique after it.
//  2. The key is the provider's id when that is a valid key (1..128
//     visible ASCII bytes) that invariant 1 allows. Otherwise it is
//     <base>-t<turn>-<pos>: base the id with every byte that is not
//     visible ASCII as '_', at most 64 bytes ("call" when empty), turn
//     the message's number among the run's assistant messages (the
//     context's, Prior.Turns, and it), pos the call's number among its message's calls,
//     both from 1; while that is taken too, "-<n>" is added (n = 2, 3, ...).
//  3. A key is a function of the context, the used keys and the message
//     alone. The stored message carries its keys, so a resumed attempt
//     has them; a message it asks the model for again is keyed from the
//     same restored context.
//  4. Keys are visible ASCII: valid in JSON, in a NATS header
//     (Agentfleet-Tool-Call) and as an answer's toolCallId (1..256
//     printable bytes); the openai provider adapts any id to what its
//     endpoint accepts, as it always did.
//
// The streamed toolcall_start and toolcall_end carry the key as known
// then: the calls streamed so far up to the event's, in content-index
// order, each with its id as last streamed, keyed as keyMessage keys a
// message (a call's position and the keys before it). So the key of a
// toolcall_end is the final one when the calls before it have streamed
// with their final ids (the usual order: a call ends before the next one
// starts); an id given only after its toolcall_start changes its key and
// those of the calls after it. The message at done (or error) is keyed
// afresh by invariant 2, and it is what the transcript keeps.

// Bounds of call keys.
const (
	maxKeptCallID = 128
	maxKeyBase    = 64
)

// Prior is what a model call's keys avoid besides its context's.
type Prior struct {
	// Used are keys taken besides the context's: earlier attempts' events
	// and the messages a compaction summarised.
	Used map[string]bool
	// Turns counts the run's assistant messages the context leaves out
	// (summarised by a compaction).
	Turns int
}

// Stream renames the tool call ids of the model's messages to the run's
// call keys. prior (nil: none) is read at each model call.
func Stream(fn agent.StreamFn, prior func() Prior) agent.StreamFn {
	return func(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
		return func(yield func(agent.StreamEvent) bool) {
			k := newCallKeys(llm.Messages)
			if prior != nil {
				p := prior()
				k.used, k.prior = p.Used, p.Turns
			}
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
	used  map[string]bool // keys taken besides the context's (invariant 1)
	prior int             // assistant messages before the context's
	taken map[string]bool // its call ids and used, read at the first call
	turn  int
	// The streamed calls in content-index order; the keys of those before
	// keyedTo are valid and in inMessage.
	streamedCalls []streamedCall
	keyedTo       int
	inMessage     map[string]bool
}

type streamedCall struct {
	index   int    // content index
	id, key string // the provider's id as last streamed, its key
}

func newCallKeys(msgs []agent.Message) *callKeys { return &callKeys{msgs: msgs} }

// read takes the context's call ids and turns, once: a message without
// calls (most) costs nothing.
func (k *callKeys) read() {
	if k.taken != nil {
		return
	}
	k.taken, k.turn = map[string]bool{}, 1+k.prior
	for id := range k.used {
		k.taken[id] = true
	}
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
	if k.inMessage == nil {
		k.inMessage = map[string]bool{}
	}
	p, found := slices.BinarySearchFunc(k.streamedCalls, index, func(s streamedCall, i int) int { return cmp.Compare(s.index, i) })
	switch {
	case !found:
		k.unkeyFrom(p) // a call before those after it: their positions change
		k.streamedCalls = slices.Insert(k.streamedCalls, p, streamedCall{index: index, id: id})
	case k.streamedCalls[p].id != id:
		k.unkeyFrom(p) // its id changed: it and those after it are keyed again
		k.streamedCalls[p].id = id
	}
	// As keyMessage: in content order, each call given the keys before it.
	for ; k.keyedTo <= p; k.keyedTo++ {
		s := &k.streamedCalls[k.keyedTo]
		s.key = k.key(s.id, k.keyedTo+1, k.inMessage)
		k.inMessage[s.key] = true
	}
	return k.streamedCalls[p].key
}

// unkeyFrom drops the keys of the streamed calls from position p on.
func (k *callKeys) unkeyFrom(p int) {
	for ; k.keyedTo > p; k.keyedTo-- {
		delete(k.inMessage, k.streamedCalls[k.keyedTo-1].key)
	}
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
