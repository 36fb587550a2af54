package worker

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// readsOf counts each run's reads of the control stream.
type readsOf struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *readsOf) hook(run string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[run]++
}

func (r *readsOf) of(run string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[run]
}

// A run submitted to a running worker, with no control message, starts
// without reading the control stream; a steer then still comes live.
func TestFirstAttemptSkipsThePickupRead(t *testing.T) {
	t.Parallel()
	var reads readsOf
	g := newTestGate()
	o := ctlObs{got: make(chan string, 10)}
	_, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, HeartbeatInterval: time.Minute, Observer: o},
		func(w *Worker) { beforeControlRead(w, reads.hook) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "a", Tools: []string{"gate"},
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: gateScript("a", "done")})
	if err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "the run's tool")
	if n := reads.of(run.ID); n != 0 {
		t.Fatalf("%d reads of the control stream before the run's tool", n)
	}
	if _, err := c.Steer(ctx, run.ID, "steered"); err != nil {
		t.Fatal(err)
	}
	within(t, o.got, 10*time.Second, "the steer, live")
	g.release <- struct{}{}
	tr, err := c.LoadTranscript(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(userTexts(tr)); got != "[a steered]" || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("user messages %s, %+v", got, tr.Finished)
	}
}

// Control messages stored while their run waits in the queue of a running
// worker reach it at pickup (the coverage noted them), before its first
// model call: the steer is in the first turn, the abort stops it before any.
func TestControlsWhileQueuedAreTakenAtPickup(t *testing.T) {
	t.Parallel()
	g := newTestGate()
	_, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, Concurrency: 1, HeartbeatInterval: time.Minute}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	model := &bus.ModelRef{Provider: "faux", ID: "s"}
	holder, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "h", Tools: []string{"gate"}, Model: model, Faux: gateScript("h", "h done")})
	if err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "the slot holder's tool")
	steered, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "first", Model: model, Faux: fauxTexts("one", "two")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Steer(ctx, steered.ID, "also this"); err != nil {
		t.Fatal(err)
	}
	abortQueued(t, ctx, c, g)
	tr, err := c.LoadTranscript(ctx, steered.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(userTexts(tr)); got != "[first also this]" || len(tr.Messages) != 3 {
		t.Fatalf("steered: user messages %s, %d messages", got, len(tr.Messages))
	}
	if _, err := c.LoadTranscript(ctx, holder.ID); err != nil {
		t.Fatal(err)
	}
}

// A control message that comes live between the run's registration and
// its control owner's start reaches the agent before its first model
// call, also when the pickup read is skipped: an abort there means no call.
func TestLiveControlBeforeStartIsAppliedFirst(t *testing.T) {
	t.Parallel()
	var reads readsOf
	var c *bus.Client
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id = "aborted-at-registration"
	// Whether the run's control owner applied the abort before it let the
	// run go on: on its start-up drain (controls.own calls live), not once
	// serving (controls.serve calls it). Read on the owner's goroutine, as
	// it applies the abort.
	appliedAtStart := make(chan bool, 1)
	obs := abortObs{applied: func() {
		b := make([]byte, 64<<10)
		var calls []string // innermost first
		for l := range strings.SplitSeq(string(b[:runtime.Stack(b, false)]), "\n") {
			if l != "" && !strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, "goroutine ") {
				calls = append(calls, l)
			}
		}
		i := slices.IndexFunc(calls, func(c string) bool { return strings.Contains(c, "worker.(*controls).live(") })
		appliedAtStart <- i >= 0 && i+1 < len(calls) && strings.Contains(calls[i+1], "worker.(*controls).own(")
	}}
	_, c = startInternal(t, Config{HeartbeatInterval: time.Minute, Observer: obs}, func(w *Worker) {
		beforeControlRead(w, reads.hook)
		// Registered (it takes control messages), its owner not started:
		// an abort comes live.
		wrapSends(w, sends{beforeEvent: func(e *bus.Envelope) {
			if e.Run != id || e.Type != bus.EventRunStarted {
				return
			}
			if _, err := c.Abort(ctx, id, "at once"); err != nil {
				t.Error(err)
				return
			}
			w.mu.Lock()
			r := w.runs[id]
			w.mu.Unlock()
			for len(r.ctl.inbox) == 0 && ctx.Err() == nil {
				time.Sleep(time.Millisecond) // polls the inbox itself
			}
		}})
	})
	if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "p", Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: fauxTexts("never")}); err != nil {
		t.Fatal(err)
	}
	tr, err := c.LoadTranscript(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Finished.Status != bus.StatusAborted || len(tr.Messages) != 0 {
		t.Fatalf("%+v, %d messages", tr.Finished, len(tr.Messages))
	}
	if n := reads.of(id); n != 0 {
		t.Fatalf("%d reads: the pickup read was not skipped, the test proves nothing", n)
	}
	if !<-appliedAtStart {
		t.Fatal("the abort was not applied before the control owner let the run go on")
	}
}

// abortObs calls applied once an abort was applied.
type abortObs struct {
	NopObserver
	applied func()
}

func (o abortObs) ControlReceived(kind string) {
	if kind == bus.KindAbort {
		o.applied()
	}
}

// Republishing turned off while the worker runs: within an audit, first
// attempts read at pickup again, so an abort stored while a run is queued
// still stops it before any model call.
func TestRepublishTurnedOffIsNoticed(t *testing.T) {
	t.Parallel()
	g := newTestGate()
	w, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, Concurrency: 1, HeartbeatInterval: time.Minute},
		func(w *Worker) { w.coverageAudit = 50 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	model := &bus.ModelRef{Provider: "faux", ID: "s"}
	if _, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "h", Tools: []string{"gate"}, Model: model, Faux: gateScript("h", "h done")}); err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "the slot holder's tool")
	st, err := c.JetStream().Stream(ctx, c.Names().ControlStream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.RePublish = nil
	if _, err := c.JetStream().UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for off := false; !off; {
		w.mu.Lock()
		off = w.cover.Off()
		w.mu.Unlock()
		if ctx.Err() != nil {
			t.Fatal("the coverage did not notice")
		}
		time.Sleep(5 * time.Millisecond) // polls the coverage itself
	}
	abortQueued(t, ctx, c, g)
}

// abortQueued submits a run behind the one the gate holds, aborts it while
// it is queued, opens the gate and checks that the run ended without a
// model call.
func abortQueued(t *testing.T, ctx context.Context, c *bus.Client, g *testGate) {
	t.Helper()
	aborted, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "never", Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: fauxTexts("nope")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Abort(ctx, aborted.ID, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	g.release <- struct{}{}
	tr, err := c.LoadTranscript(ctx, aborted.ID)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Finished.Status != bus.StatusAborted || len(tr.Messages) != 0 {
		t.Fatalf("aborted: %+v, %d messages", tr.Finished, len(tr.Messages))
	}
}

// A publisher's own Nats-Sequence header (the server appends its own
// after it) neither breaks the coverage nor reaches a run as the
// message's sequence.
func TestSpoofedSequenceHeaderIsIgnored(t *testing.T) {
	t.Parallel()
	g := newTestGate()
	o := ctlObs{got: make(chan string, 10)}
	w, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, HeartbeatInterval: time.Minute, Observer: o}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "a", Tools: []string{"gate"},
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: gateScript("a", "done")})
	if err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "the run's tool")
	m := nats.NewMsg(c.Names().Control(run.ID, bus.KindSteer))
	m.Data = []byte(`{"text":"spoofed"}`)
	m.Header.Set("Nats-Sequence", "777")
	m.Header.Set("Nats-Last-Sequence", "0")
	ack, err := c.JetStream().PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	within(t, o.got, 10*time.Second, "the steer, live")
	w.mu.Lock()
	valid, last := w.cover.Valid()
	w.mu.Unlock()
	if !valid || last != ack.Sequence {
		t.Fatalf("coverage valid %v, last %d; the stored sequence is %d", valid, last, ack.Sequence)
	}
	g.release <- struct{}{}
	tr, err := c.LoadTranscript(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Finished.LastControlSeq != ack.Sequence {
		t.Fatalf("lastControlSeq %d, want %d", tr.Finished.LastControlSeq, ack.Sequence)
	}
}

// A run with no control message asks the control stream once, at its idle
// check: one wildcard read from sequence 1, which the server answers from
// its subject index, instead of a read of each of the five kinds.
func TestIdleCheckWithoutControlsIsOneRead(t *testing.T) {
	t.Parallel()
	_, c := startInternal(t, Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id = "no-controls"
	var mu sync.Mutex
	var reads []string
	sub, err := c.Conn().Subscribe("$JS.API.STREAM.MSG.GET."+c.Names().ControlStream(), func(m *nats.Msg) {
		if strings.Contains(string(m.Data), "."+id+".") {
			mu.Lock()
			reads = append(reads, string(m.Data))
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "a", Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: fauxTexts("done")}); err != nil {
		t.Fatal(err)
	}
	for e, err := range c.Follow(ctx, id) {
		if err != nil {
			t.Fatal(err)
		}
		if e.Type == bus.EventRunFinished {
			break
		}
	}
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reads) != 1 || !strings.Contains(reads[0], `"seq":1,`) || !strings.Contains(reads[0], "."+id+".*") {
		t.Fatalf("control reads %q, want one of %s.* from sequence 1", reads, id)
	}
}

// A run's controls make no room for rejections until one comes: most runs
// have none, and ten thousand waiting runs held 7.5 MB of it
// (docs/benchmarks/2026-12.md, issue 60).
func TestControlsHoldNoRejectionRoomUntilARejection(t *testing.T) {
	c := newControls(&run{})
	if c.rejects != nil {
		t.Fatalf("a new run's controls hold room for %d rejections", cap(c.rejects))
	}
}
