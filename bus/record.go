package bus

import (
	"time"

	"github.com/agentfleet/agentfleet/agent"
)

// RunRecord is the value of a run's key in the KV bucket agents_runs.
type RunRecord struct {
	ID     string `json:"id"`
	Queue  string `json:"queue"`
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Attempt is the delivery count of the request being run.
	Attempt int    `json:"attempt"`
	Worker  string `json:"worker,omitempty"`
	// RequestSeq is the AGENTS_RUNS sequence of the request: a redelivery
	// has the same, a new request reusing the id has another.
	RequestSeq  uint64            `json:"requestSeq,omitempty"`
	SubmittedAt time.Time         `json:"submittedAt,omitzero"`
	StartedAt   time.Time         `json:"startedAt,omitzero"`
	FinishedAt  time.Time         `json:"finishedAt,omitzero"`
	HeartbeatAt time.Time         `json:"heartbeatAt,omitzero"`
	Model       string            `json:"model,omitempty"`
	Turns       int               `json:"turns"`
	Usage       agent.Usage       `json:"usage"`
	Cost        float64           `json:"cost"`
	Error       string            `json:"error,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	// Stale is set by Status and List (never stored) on a running record
	// whose heartbeat is older than the client's stale bound: its worker
	// is gone or cut off and no one has taken the run over (yet).
	Stale bool `json:"stale,omitempty"`
	// Revision is the KV revision the record was read at (not stored).
	Revision uint64 `json:"-"`
}

// Finished reports whether the record's state is final.
func (r *RunRecord) Finished() bool {
	switch r.State {
	case StatusSucceeded, StatusFailed, StatusAborted:
		return true
	}
	return false
}
