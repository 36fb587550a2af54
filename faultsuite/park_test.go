//go:build fault && linux

package faultsuite

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// recorder is a NATS tool service (rec__deploy) that counts its calls per
// target; it lives in the test process, so a worker killed after calling
// it cannot lose the count.
type recorder struct {
	mu    sync.Mutex
	calls map[string]int
}

func startRecorder(t *testing.T, f *fleet) *recorder {
	t.Helper()
	rc := &recorder{calls: map[string]int{}}
	c := f.nats.client()
	t.Cleanup(c.Close)
	svc, err := micro.AddService(c.Conn(), micro.Config{Name: "rec", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	err = svc.AddGroup(c.Names().Prefix()+".tools.rec").AddEndpoint("deploy", micro.HandlerFunc(func(r micro.Request) {
		var args struct {
			Target string `json:"target"`
		}
		_ = json.Unmarshal(r.Data(), &args)
		rc.mu.Lock()
		rc.calls[args.Target]++
		rc.mu.Unlock()
		_ = r.RespondJSON(map[string]any{"content": []map[string]any{{"type": "text", "text": "deployed " + args.Target}}})
	}), micro.WithEndpointMetadata(map[string]string{"description": "Deploys and records it.",
		"schema": `{"type":"object","properties":{"target":{"type":"string"}},"required":["target"]}`}))
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

func (rc *recorder) count(target string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.calls[target]
}

// gatedDeploy is a run whose one call, rec__deploy (target: the run id),
// waits for approval.
func gatedDeploy(id string) *bus.RunRequest {
	return &bus.RunRequest{ID: id, Prompt: "deploy", Tools: []string{"rec__deploy"},
		Model:    &bus.ModelRef{Provider: "faux", ID: "scripted"},
		Approval: &bus.Approval{Tools: []string{"rec__deploy"}},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			toolCall("c1", "rec__deploy", map[string]any{"target": id}),
			{Content: []agent.Content{agent.Text("done")}},
		}}}
}

// Parking and waking survive kill -9 at each step, and the answer is
// applied once: the approved call runs exactly once when the worker dies
// before the wake's attempt asks the tool, at most once when that attempt
// dies (a call cut off after it ran gets an error result, as any call a
// dead worker left). Steps: as the run starts to park (before run_parked
// and the record), once it is parked (after the ack), right after the
// answer (the wake being published), and the woken attempt at its pickup.
// Then a run parked longer than twice AckWait completes once.
func TestParkingSurvivesKill9(t *testing.T) {
	start := time.Now()
	dir := workDir(t)
	nc := startNATS(t, dir, 1, "")
	f := newFleet(t, dir, nc)
	f.extraArgs = []string{"--park-after", "1s", "--tool-services", "rec"}
	// The streams (and the service's subjects) exist before the service.
	w := f.startWorker("park0")
	rec := startRecorder(t, f)
	w.kill()
	gen := 0
	next := func() *proc {
		gen++
		return f.startWorker(fmt.Sprintf("park%d", gen))
	}
	ctx, cancel := f.ctx(10 * time.Minute)
	defer cancel()
	parked := func(id string, minAttempt int) *bus.RunRecord {
		t.Helper()
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			r, err := f.c.Status(ctx, id)
			if err == nil && r.Parked != nil && r.Attempt >= minAttempt {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never parked (attempt >= %d): %v %+v", id, minAttempt, err, r)
			}
		}
	}
	approve := func(id string) {
		t.Helper()
		if _, err := f.c.Answer(ctx, id, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove, By: "fault"}); err != nil {
			t.Fatal(err)
		}
	}
	// check: the run finished succeeded, one approve resolved in its
	// transcript, and the tool ran once (exactly, or at most).
	check := func(step, id string, exactly bool) {
		t.Helper()
		tr, err := f.c.LoadTranscript(ctx, id)
		if err != nil || tr.Finished == nil || tr.Finished.Status != bus.StatusSucceeded {
			t.Fatalf("%s: %v finished %+v", step, err, tr)
		}
		raw, err := rawEvents(ctx, f.c, id)
		if err != nil {
			t.Fatal(err)
		}
		resolved := map[int]int{} // by attempt
		last := 0
		for _, e := range raw {
			last = max(last, e.Attempt)
			if ev, err := e.Decode(); err == nil && ev.Approval != nil && ev.Type == bus.EventToolApprovalResolved {
				resolved[e.Attempt]++
			}
		}
		n := rec.count(id)
		if n > 1 || (exactly && n != 1) {
			t.Fatalf("%s: rec__deploy ran %d times (exactly once: %v)", step, n, exactly)
		}
		t.Logf("%s: succeeded on attempt %d, tool ran %d time(s), resolved per attempt %v", step, last, n, resolved)
	}
	runLine := func(id, msg string) string { return `"msg":"` + regexp.QuoteMeta(msg) + `".*"run":"` + id + `"` }

	// 1. Killed as the run starts to park.
	w = next()
	id := "park-k1"
	if _, err := f.c.Submit(ctx, "default", gatedDeploy(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.waitLine(runLine(id, "run parks: it waited off its slot for approvals"), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	w.kill()
	w = next()
	parked(id, 2)
	approve(id)
	check("killed while parking", id, true)

	// 2. Killed once parked (after the ack).
	id = "park-k2"
	if _, err := f.c.Submit(ctx, "default", gatedDeploy(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.waitLine(runLine(id, "run parked"), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	w.kill()
	w = next()
	parked(id, 1)
	approve(id)
	check("killed once parked", id, true)

	// 3. Killed right after the answer: the wake may be mid-publish.
	id = "park-k3"
	if _, err := f.c.Submit(ctx, "default", gatedDeploy(id)); err != nil {
		t.Fatal(err)
	}
	parked(id, 1)
	approve(id)
	w.kill()
	w = next()
	check("killed during the wake", id, true)

	// 4. The woken attempt killed at its pickup.
	id = "park-k4"
	if _, err := f.c.Submit(ctx, "default", gatedDeploy(id)); err != nil {
		t.Fatal(err)
	}
	parked(id, 1)
	approve(id)
	if _, err := w.waitLine(`"msg":"redelivered request: resuming the run".*"run":"`+id+`"`, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	w.kill()
	w = next()
	check("woken attempt killed", id, false)

	// 5. Parked longer than twice AckWait, then answered: done once, on
	// the woken attempt (no redelivery of the parked request).
	id = "park-long"
	if _, err := f.c.Submit(ctx, "default", gatedDeploy(id)); err != nil {
		t.Fatal(err)
	}
	p := parked(id, 1)
	time.Sleep(2*f.ackWait + time.Second) // the scenario is the wait itself
	if r, err := f.c.Status(ctx, id); err != nil || r.Parked == nil || r.Revision != p.Revision {
		t.Fatalf("parked record moved while parked: %v %+v", err, r)
	}
	approve(id)
	check("parked past 2 x AckWait", id, true)
	if r, err := f.c.Status(ctx, id); err != nil || r.Attempt != 2 {
		t.Fatalf("long-parked run finished on attempt %d, want 2 (%v)", r.Attempt, err)
	}
	t.Logf("scenario took %s (AckWait %s)", time.Since(start).Round(time.Second), f.ackWait)
}
