package worker_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// snapshotRoles loads run id's snapshot and returns its messages' roles.
func snapshotRoles(t *testing.T, f *fleettest.Fleet, id string) (string, bus.SnapshotHeader) {
	t.Helper()
	msgs, h, err := f.Client.LoadSnapshot(fleettest.Context(t), id, 0, 0)
	if err != nil {
		t.Fatalf("snapshot of %s: %v", id, err)
	}
	return roles(msgs), h
}

// messageEnds counts the run's message_end events.
func messageEnds(envs []*bus.Envelope) int {
	n := 0
	for _, e := range envs {
		if e.Type == string(agent.EventMessageEnd) {
			n++
		}
	}
	return n
}

// A continuation names the run it continues (transcript_restored) instead
// of publishing its messages again; its snapshot holds the whole context,
// so a continuation of it is one read again; without a snapshot the
// events (and the reference in them) still give the whole context.
func TestContinuationRestoresByReference(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{})
	first := f.Submit("", fleettest.FauxRun("hello", fleettest.Text("first answer")))
	if fin := f.WaitFinished(first); fin.Status != bus.StatusSucceeded {
		t.Fatalf("first: %+v", fin)
	}
	if got, h := snapshotRoles(t, f, first); got != "user:hello | assistant:first answer" || h.Attempt != 1 || h.From != "" || h.Messages != 2 {
		t.Fatalf("first's snapshot %s %+v", got, h)
	}

	second := f.Submit("", &bus.RunRequest{Prompt: "and again", ContinueFrom: first, Model: fleettest.FauxModel(), Faux: fleettest.Texts("second answer")})
	envs := f.Follow(second)
	tr := checkRun(t, second, envs)
	if r := tr.Restored; r == nil || r.From != first || r.Messages != 2 || r.Bytes <= 0 {
		t.Fatalf("transcript_restored %+v\n%s", r, fleettest.Dump(envs))
	}
	if got := roles(tr.Messages); got != "user:and again | assistant:second answer" || messageEnds(envs) != 2 {
		t.Fatalf("second's own messages %s\n%s", got, fleettest.Dump(envs))
	}
	if got, h := snapshotRoles(t, f, second); got != "user:hello | assistant:first answer | user:and again | assistant:second answer" || h.From != first {
		t.Fatalf("second's snapshot %s %+v", got, h)
	}

	third := f.Submit("", &bus.RunRequest{Prompt: "once more", ContinueFrom: second, Model: fleettest.FauxModel(), Faux: fleettest.Texts("third answer")})
	tr = checkRun(t, third, f.Follow(third))
	if r := tr.Restored; r == nil || r.From != second || r.Messages != 4 {
		t.Fatalf("third's transcript_restored %+v", r)
	}
	want := "user:hello | assistant:first answer | user:and again | assistant:second answer | user:once more | assistant:third answer"
	if got, _ := snapshotRoles(t, f, third); got != want {
		t.Fatalf("third's snapshot %s", got)
	}

	// Without second's snapshot (a run whose snapshot was not stored), its
	// events and the reference in them give the same context.
	obs, err := f.Client.JetStream().ObjectStore(fleettest.Context(t), f.Client.Names().TranscriptsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Delete(fleettest.Context(t), second); err != nil {
		t.Fatal(err)
	}
	fourth := f.Submit("", &bus.RunRequest{Prompt: "once more", ContinueFrom: second, Model: fleettest.FauxModel(), Faux: fleettest.Texts("third answer")})
	tr = checkRun(t, fourth, f.Follow(fourth))
	if r := tr.Restored; r == nil || r.From != second || r.Messages != 4 {
		t.Fatalf("fourth's transcript_restored %+v", r)
	}
	if got, _ := snapshotRoles(t, f, fourth); got != want {
		t.Fatalf("fourth's snapshot (from the events) %s", got)
	}
}

func checkRun(t *testing.T, id string, envs []*bus.Envelope) *bus.Transcript {
	t.Helper()
	if fin := checkEnvelopes(t, id, envs); fin.Status != bus.StatusSucceeded {
		t.Fatalf("%s: %+v\n%s", id, fin, fleettest.Dump(envs))
	}
	return transcriptOf(t, envs)
}

// A snapshot larger than the whole load budget fails the continuation
// at once, naming both sizes; it never waits.
func TestContinuationLargerThanLoadBudget(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.StartWorker(worker.Config{LoadBudget: 4 << 10})
	first := f.Submit("", fleettest.FauxRun("hello", fleettest.Text(strings.Repeat("x", 8<<10))))
	if fin := f.WaitFinished(first); fin.Status != bus.StatusSucceeded {
		t.Fatalf("first: %+v", fin)
	}
	h, err := f.Client.SnapshotInfo(fleettest.Context(t), first)
	if err != nil {
		t.Fatal(err)
	}
	next := f.Submit("", &bus.RunRequest{Prompt: "go on", ContinueFrom: first, Model: fleettest.FauxModel(), Faux: fleettest.Texts("ok")})
	fin := f.WaitFinished(next)
	if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonTranscriptTooLarge ||
		!strings.Contains(fin.Error, "--load-budget") || !strings.Contains(fin.Error, "4096 bytes") || !strings.Contains(fin.Error, strconv.FormatInt(h.Bytes, 10)+" bytes") {
		t.Fatalf("continuation past the load budget: %s/%s: %s", fin.Status, fin.Reason, fin.Error)
	}
}

// A continuation that does not fit the free load budget waits for it
// without a concurrency slot: another run takes the slot meanwhile.
func TestContinuationWaitsForLoadBudgetWithoutSlot(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newGate()
	// One snapshot of ~10 KB fits, two do not.
	f.StartWorker(worker.Config{Concurrency: 2, LoadBudget: 15_000, Tools: []*agent.Tool{g.tool()}})
	first := f.Submit("", fleettest.FauxRun("hello", fleettest.Text(strings.Repeat("x", 10_000))))
	if fin := f.WaitFinished(first); fin.Status != bus.StatusSucceeded {
		t.Fatalf("first: %+v", fin)
	}
	holder := f.Submit("", &bus.RunRequest{Prompt: "hold", ContinueFrom: first, Tools: []string{"gate"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.ToolCall("g", "gate", map[string]any{"name": "hold"}), fleettest.Text("held")}}})
	g.waitStarted(t) // holder has its budget and one slot
	waiter := f.Submit("", &bus.RunRequest{Prompt: "wait", ContinueFrom: first, Model: fleettest.FauxModel(), Faux: fleettest.Texts("waited")})
	// The other slot is free for a plain run while waiter waits.
	plain := f.Submit("", fleettest.FauxRun("plain", fleettest.Text("plain answer")))
	if fin := f.WaitFinished(plain); fin.Status != bus.StatusSucceeded {
		t.Fatalf("plain run while a continuation waits for the load budget: %+v", fin)
	}
	if rec, err := f.Client.Status(fleettest.Context(t), waiter); err == nil && rec.Finished() {
		t.Fatalf("waiter finished before the holder let its budget go: %+v", rec)
	}
	g.release <- struct{}{}
	for _, id := range []string{holder, waiter} {
		if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
			t.Fatalf("%s: %+v", id, fin)
		}
	}
}

// A continuation whose worker died resumes in its next attempt from the
// same reference: the prior messages are not in its events, and the
// restored transcript, the model's context and the snapshot have them.
func TestContinuationResumesByReference(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	g := newCancelGate()
	cfg := worker.Config{Tools: []*agent.Tool{g.tool()}, AckWait: time.Second, HeartbeatInterval: 250 * time.Millisecond}
	kill := killable(f, cfg)
	first := f.Submit("", fleettest.FauxRun("hello", fleettest.Text("first answer")))
	if fin := f.WaitFinished(first); fin.Status != bus.StatusSucceeded {
		t.Fatalf("first: %+v", fin)
	}
	next := f.Submit("", &bus.RunRequest{Prompt: "go on", ContinueFrom: first, Tools: []string{"gate"}, Model: fleettest.FauxModel(),
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{fleettest.ToolCall("c1", "gate", map[string]any{"name": "x"}), fleettest.Text("done")}}})
	waitFor(t, g.started, "gate x")
	kill()
	waitFor(t, g.cancelled, "gate x cancelled")
	f.StartWorker(cfg)
	envs := f.Follow(next)
	tr := transcriptOf(t, envs)
	if tr.Finished == nil || tr.Finished.Status != bus.StatusSucceeded || tr.Attempt != 2 || tr.Resumed == nil || tr.Resumed.MessagesRestored != 2 {
		t.Fatalf("resumed continuation %+v\n%s", tr.Finished, fleettest.Dump(envs))
	}
	if r := tr.Restored; r == nil || r.From != first || r.Messages != 2 {
		t.Fatalf("transcript_restored %+v", r)
	}
	for _, e := range envs {
		if e.Type == string(agent.EventMessageEnd) && strings.Contains(string(e.Event), "first answer") {
			t.Fatalf("a prior message was published again:\n%s", fleettest.Dump(envs))
		}
	}
	if got := roles(tr.Messages); got != "user:go on | assistant:call:gate | toolResult | assistant:done" {
		t.Fatalf("the run's own messages %s", got)
	}
	if got, _ := snapshotRoles(t, f, next); got != "user:hello | assistant:first answer | user:go on | assistant:call:gate | toolResult | assistant:done" {
		t.Fatalf("snapshot %s", got)
	}
	if tr.Finished.Turns != 2 {
		t.Fatalf("turns %d, want 2 (the prior run's are not this run's)", tr.Finished.Turns)
	}
}

// A finished run's snapshot is written beside its events' flush, not after
// it (one round trip fewer at every run's end): the flush waits here until
// the snapshot is stored, which only a snapshot written beside it can be.
func TestSnapshotIsWrittenBesideTheEventsFlush(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	seen := make(chan bool, 1)
	f.StartWorker(worker.WithBeforeEventsSync(worker.Config{}, func(ctx context.Context, run string) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		obs, err := f.Client.JetStream().ObjectStore(ctx, f.Client.Names().TranscriptsBucket())
		if err != nil {
			seen <- false
			return
		}
		wt, err := obs.Watch(ctx)
		if err != nil {
			seen <- false
			return
		}
		defer func() { _ = wt.Stop() }()
		for {
			select {
			case info := <-wt.Updates():
				if info != nil && info.Name == run && !info.Deleted {
					seen <- true
					return
				}
			case <-ctx.Done():
				seen <- false
				return
			}
		}
	}))
	id := f.Submit("", fleettest.FauxRun("hello", fleettest.Text("an answer")))
	if fin := f.WaitFinished(id); fin.Status != bus.StatusSucceeded {
		t.Fatalf("run: %+v", fin)
	}
	if !<-seen {
		t.Fatal("the snapshot was not stored while the events' flush waited")
	}
	if got, h := snapshotRoles(t, f, id); got != "user:hello | assistant:an answer" || h.Attempt != 1 {
		t.Fatalf("snapshot %s %+v", got, h)
	}
}
