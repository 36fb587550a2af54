package bus

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
)

// Child runs (since 1.10): a run's built-in tool run_agent submits another
// run, its child, and waits for its answer (docs/protocol.md, child runs).

// ToolRunAgent is the built-in tool that starts a child run.
const ToolRunAgent = "run_agent"

// Children bounds the tree of runs below a run (request field
// "children"). Zero fields take the worker's ceilings.
type Children struct {
	// MaxDepth is how many levels of children may follow the run (1: its
	// children may not start their own).
	MaxDepth int `json:"maxDepth,omitempty"`
	// Max is how many children the run may start.
	Max int `json:"max,omitempty"`
}

// ChildOf links a child run to its parent (request field "child", set by
// the worker that submits it; record and run_started carry the same).
type ChildOf struct {
	ParentRunID string `json:"parentRunId"`
	RootRunID   string `json:"rootRunId"`
	Depth       int    `json:"depth"`
	// TreeMaxCostUsd is the root's limits.maxCostUsd: the budget every
	// run of the tree charges (0: none).
	TreeMaxCostUsd float64 `json:"treeMaxCostUsd,omitempty"`
	// Proof is the worker's seal on the child's request (ChildKey.Seal):
	// only a worker can make a link a worker accepts. Requests only: the
	// worker that takes the request drops it from the record and events.
	Proof string `json:"proof,omitempty"`
}

// MaxChildrenLimit bounds children.max; MaxChildDepthLimit children.maxDepth.
const (
	MaxChildrenLimit   = 10_000
	MaxChildDepthLimit = 32
)

// Problems lists what is wrong with the bounds.
func (c *Children) Problems(prefix string) []string {
	var p []string
	if c.MaxDepth < 0 || c.MaxDepth > MaxChildDepthLimit {
		p = append(p, fmt.Sprintf("%s.maxDepth %d is not in 0..%d", prefix, c.MaxDepth, MaxChildDepthLimit))
	}
	if c.Max < 0 || c.Max > MaxChildrenLimit {
		p = append(p, fmt.Sprintf("%s.max %d is not in 0..%d", prefix, c.Max, MaxChildrenLimit))
	}
	return p
}

// Problems lists what is wrong with the link of run id.
func (c *ChildOf) Problems(prefix, id string) []string {
	var p []string
	if !ValidID(c.ParentRunID) {
		p = append(p, fmt.Sprintf("%s.parentRunId %q is not a valid run id", prefix, truncate(c.ParentRunID, 80)))
	} else if c.ParentRunID == id {
		p = append(p, prefix+".parentRunId names the run itself")
	}
	if !ValidID(c.RootRunID) {
		p = append(p, fmt.Sprintf("%s.rootRunId %q is not a valid run id", prefix, truncate(c.RootRunID, 80)))
	}
	if c.TreeMaxCostUsd < 0 {
		p = append(p, prefix+".treeMaxCostUsd must not be negative")
	}
	if !validProof(c.Proof) {
		p = append(p, prefix+".proof is missing or not 64 hex digits: a child link is made only by a worker")
	}
	if c.Depth < 1 || c.Depth > MaxChildDepthLimit {
		p = append(p, fmt.Sprintf("%s.depth %d is not in 1..%d", prefix, c.Depth, MaxChildDepthLimit))
	}
	return p
}

// The child key (since 1.10): the fleet's secret that binds a child to
// its parent. Invariants:
//
//  1. One key per fleet: the entry childKeyEntry of agents_keys, a
//     bucket only the worker role may read or write, created once by the
//     first worker that needs it with a create-only write and never
//     changed, so every worker names a call's child alike (exactly once
//     across a parent's redeliveries).
//  2. A child's id is an HMAC of the parent's id and the call's key: no
//     submitter can compute it before the worker has stored the child's
//     request, so none can take the id first.
//  3. A child's request carries child.proof, an HMAC of its queue and its
//     whole body (Seal): a worker accepts a request's child link only when the proof
//     is the key's for those bytes, so no submitter can link a run of
//     its own to another's parent or tree (its budget account), nor
//     alter a worker's child request and keep the link.

// childKeyEntry is the child key's entry in the keys bucket (concurrency
// keys' entries are k<32 hex>: no clash).
const childKeyEntry = "childkey"

// ChildKey is the fleet's child key: 32 bytes.
type ChildKey []byte

// ChildKey reads the fleet's child key from agents_keys, creating it if
// no worker has (invariant 1). Only the worker role may read it.
func (c *Client) ChildKey(ctx context.Context) (ChildKey, error) {
	kv, err := c.js.KeyValue(ctx, c.names.KeysBucket())
	if err != nil {
		return nil, fmt.Errorf("child key: kv bucket %s: %w", c.names.KeysBucket(), err)
	}
	for range 3 {
		e, err := kv.Get(ctx, childKeyEntry)
		if err == nil {
			k, derr := hex.DecodeString(string(e.Value()))
			if derr != nil || len(k) != 32 {
				return nil, fmt.Errorf("child key: the entry %s/%s is not 64 hex digits", c.names.KeysBucket(), childKeyEntry)
			}
			return ChildKey(k), nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("child key: %w", err)
		}
		k := make([]byte, 32)
		_, _ = rand.Read(k)
		_, err = kv.Create(ctx, childKeyEntry, []byte(hex.EncodeToString(k)))
		if err == nil {
			return ChildKey(k), nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("child key: %w", err)
		}
		// Another worker created it first: read theirs.
	}
	return nil, errors.New("child key: the entry keeps changing")
}

// RunID is the run id of the child that call key callKey of run parent
// starts: a function of the two (and the fleet's key) alone, so a resumed
// parent finds the child it started instead of starting it again. "c" and
// 40 hex digits: a valid run id.
func (k ChildKey) RunID(parent, callKey string) string {
	h := hmac.New(sha256.New, k)
	h.Write([]byte("agentfleet child run id\x00"))
	h.Write([]byte(parent))
	h.Write([]byte{0})
	h.Write([]byte(callKey))
	return "c" + hex.EncodeToString(h.Sum(nil))[:40]
}

// ProofPlaceholder is child.proof while a request is sealed: Seal
// replaces it in the marshalled body.
const ProofPlaceholder = "0000000000000000000000000000000000000000000000000000000000000000"

// proofField is how child.proof appears in a body.
func proofField(proof string) []byte { return []byte(`"proof":"` + proof + `"`) }

// mac is the proof of body, on queue, whose proof field holds the
// placeholder.
func (k ChildKey) mac(queue string, body []byte) string {
	h := hmac.New(sha256.New, k)
	h.Write([]byte("agentfleet child request\x00"))
	h.Write([]byte(queue))
	h.Write([]byte{0})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// Seal returns body, a marshalled request for queue whose child.proof is
// ProofPlaceholder, with the proof in its place (invariant 3). The body
// holds the run id (which must match its subject's): a copy under another
// id or on another queue does not verify.
func (k ChildKey) Seal(queue string, body []byte) ([]byte, error) {
	ph := proofField(ProofPlaceholder)
	if bytes.Count(body, ph) != 1 {
		return nil, errors.New("seal: the request does not hold one proof placeholder")
	}
	return bytes.Replace(body, ph, proofField(k.mac(queue, body)), 1), nil
}

// Verify reports whether proof, the child.proof of body taken from queue,
// is the key's seal on them (invariant 3).
func (k ChildKey) Verify(queue string, body []byte, proof string) bool {
	if len(k) == 0 || !validProof(proof) {
		return false
	}
	f := proofField(proof)
	if bytes.Count(body, f) != 1 {
		return false
	}
	want := k.mac(queue, bytes.Replace(body, f, proofField(ProofPlaceholder), 1))
	return hmac.Equal([]byte(want), []byte(proof))
}

// validProof: 64 lowercase hex digits.
func validProof(p string) bool {
	if len(p) != 64 {
		return false
	}
	for _, c := range []byte(p) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ChildRunIDDetail is the key of a run_agent call's details (the
// tool_execution_update and result) that names the child's run id: the
// ids are not computable without the fleet's key.
const ChildRunIDDetail = "childRunId"

// ChildRunIDOf is the child run id a run_agent call's
// tool_execution_update or tool_execution_end names (its details'
// childRunId), if any.
func ChildRunIDOf(ev *AgentEvent) (string, bool) {
	if ev == nil || ev.ToolName != ToolRunAgent {
		return "", false
	}
	for _, r := range []*agent.ToolResult{ev.PartialResult, ev.Result} {
		if r == nil {
			continue
		}
		d, _ := r.Details.(map[string]any)
		if id, ok := d[ChildRunIDDetail].(string); ok && ValidID(id) {
			return id, true
		}
	}
	return "", false
}
