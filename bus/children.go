package bus

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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
	if c.Depth < 1 || c.Depth > MaxChildDepthLimit {
		p = append(p, fmt.Sprintf("%s.depth %d is not in 1..%d", prefix, c.Depth, MaxChildDepthLimit))
	}
	return p
}

// ChildRunID is the run id of the child that call key callKey of run
// parent starts: a function of the two alone, so a resumed parent finds
// the child it started instead of starting it again. "c" and 40 hex
// digits: a valid run id.
func ChildRunID(parent, callKey string) string {
	h := sha256.New()
	h.Write([]byte(parent))
	h.Write([]byte{0})
	h.Write([]byte(callKey))
	return "c" + hex.EncodeToString(h.Sum(nil))[:40]
}
