package fleettest

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// PutWaitingRun stores a run waiting for the approval of one call as a
// worker leaves it in NATS, without a worker: its tool_approval_requested
// event (args as given) and its running record listing the call. For
// listings at sizes no worker is needed for.
func PutWaitingRun(ctx context.Context, c *bus.Client, queue, run, call string, args any) error {
	now := time.Now()
	ev, err := json.Marshal(map[string]any{"type": bus.EventToolApprovalRequested, "toolCallId": call, "toolName": "deploy",
		"args": args, "expiresAt": now.Add(time.Hour).UnixMilli()})
	if err != nil {
		return err
	}
	env := fmt.Appendf(nil, `{"run":%q,"seq":1,"attempt":1,"worker":"w","ts":%d,"event":%s}`, run, now.UnixMilli(), ev)
	if _, err := c.JetStream().Publish(ctx, c.Names().Events(run), env); err != nil {
		return err
	}
	r := bus.RunRecord{ID: run, Queue: queue, State: bus.StateRunning, Attempt: 1, HeartbeatAt: now,
		Waiting: &bus.Waiting{For: bus.WaitingApproval, Since: now, Approvals: []bus.PendingApproval{{
			ToolCallID: call, ToolName: "deploy", RequestedAt: now.UnixMilli(), ExpiresAt: now.Add(time.Hour).UnixMilli()}}}}
	rec, _ := json.Marshal(r)
	kv, err := c.Records(ctx)
	if err != nil {
		return err
	}
	if _, err = kv.Put(ctx, run, rec); err != nil {
		return err
	}
	return c.PutWaiting(ctx, &r, false) // its index entry, after the record
}
