package worker

import (
	"testing"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/worker/internal/lease"
	"github.com/agentfleet/agentfleet/worker/internal/park"
)

// Only a run that may park (a gated tool, a run_agent call) keeps its
// envelopes for a parked state: every other run of a parking worker
// would hold up to parkStateKeep for nothing (10,000 runs in flight:
// up to 640 MiB).
func TestOnlyRunsThatMayParkKeepTheirEvents(t *testing.T) {
	w := &Worker{parking: &park.Env{}, cfg: Config{ParkAfter: 30e9}}
	for _, c := range []struct {
		name  string
		req   *bus.RunRequest
		extra []string // the worker's --approve-tools
		keeps bool
	}{
		{"plain", &bus.RunRequest{Tools: []string{"calculator"}}, nil, false},
		{"gated by the request", &bus.RunRequest{Tools: []string{"calculator"}, Approval: &bus.Approval{Tools: []string{"calculator"}}}, nil, true},
		{"gated by the worker", &bus.RunRequest{Tools: []string{"calculator"}}, []string{"calculator"}, true},
		{"run_agent", &bus.RunRequest{Tools: []string{bus.ToolRunAgent}}, nil, true},
	} {
		w.cfg.ApproveTools = c.extra
		r := &run{w: w, runPlan: runPlan{req: c.req}, attempt: 1, lease: &lease.Hold{}}
		if got := r.keepsState(); got != c.keeps {
			t.Errorf("%s: keepsState %v, want %v", c.name, got, c.keeps)
		}
	}
}
