package worker

import (
	"context"
	"fmt"
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
	var reads readsOf
	g := newTestGate()
	o := ctlObs{got: make(chan string, 10)}
	_, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, HeartbeatInterval: time.Minute, Observer: o},
		func(w *Worker) { w.hooks.beforeCatchUpRead = reads.hook })
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

// The coverage's rules, one at a time.
func TestControlCoverage(t *testing.T) {
	t.Run("covers a later request not noted", func(t *testing.T) {
		cv := newControlCoverage()
		cv.renewed(cv.epoch, 2, 1, 5, 100)
		if !cv.covers("x", 101, 2, 1) {
			t.Fatal("not covered")
		}
		if cv.covers("x", 100, 2, 1) {
			t.Fatal("a request at the runs base is covered")
		}
	})
	t.Run("a noted run reads once", func(t *testing.T) {
		cv := newControlCoverage()
		cv.renewed(cv.epoch, 2, 1, 5, 100)
		cv.saw(6, "x", false)
		cv.saw(7, "y", true)
		if cv.covers("x", 101, 2, 1) {
			t.Fatal("a noted run is covered")
		}
		if !cv.covers("x", 102, 2, 1) || !cv.covers("y", 101, 2, 1) {
			t.Fatal("not covered")
		}
	})
	t.Run("a sequence seen again still notes its run", func(t *testing.T) {
		cv := newControlCoverage()
		cv.renewed(cv.epoch, 0, 0, 5, 100)
		cv.saw(6, "y", true) // a copy that claimed the number first
		cv.saw(6, "x", false)
		if cv.covers("x", 101, 0, 0) {
			t.Fatal("the run of the message seen second is covered")
		}
	})
	t.Run("a gap ends the epoch", func(t *testing.T) {
		cv := newControlCoverage()
		cv.renewed(cv.epoch, 0, 0, 5, 100)
		cv.saw(6, "x", true)
		cv.saw(8, "y", true)
		if cv.covers("z", 101, 0, 0) {
			t.Fatal("covered after a gap")
		}
		select {
		case <-cv.renew:
		default:
			t.Fatal("no renew due")
		}
		// A renew counts what came since the gap: 7, lost, is at or
		// below a base of 7 (its run's request at or below the runs
		// base), not below one of 6.
		epoch := cv.epoch
		cv.renewed(epoch, 0, 0, 6, 120)
		if cv.valid {
			t.Fatal("valid though 7 came after the base and was not seen")
		}
		cv.saw(9, "y", true)
		cv.renewed(cv.epoch, 0, 0, 9, 120)
		if !cv.valid || !cv.covers("z", 121, 0, 0) {
			t.Fatal("not valid after a renew above the gap")
		}
	})
	t.Run("a renew sees every message after its base", func(t *testing.T) {
		cv := newControlCoverage()
		cv.saw(9, "x", false)
		cv.renewed(cv.epoch, 0, 0, 7, 100) // 8 not seen
		if cv.valid {
			t.Fatal("valid with sequence 8 unseen")
		}
		cv = newControlCoverage()
		cv.saw(8, "x", false)
		cv.saw(9, "y", false)
		cv.renewed(cv.epoch, 0, 0, 7, 100)
		if !cv.valid || cv.covers("x", 101, 0, 0) || cv.covers("y", 101, 0, 0) || !cv.covers("z", 101, 0, 0) {
			t.Fatal("messages after the base are not noted")
		}
	})
	t.Run("a gap right after an empty renew ends it", func(t *testing.T) {
		cv := newControlCoverage()
		cv.renewed(cv.epoch, 0, 0, 5, 100)
		cv.saw(8, "y", false) // 6 and 7 lost
		if cv.covers("x", 101, 0, 0) {
			t.Fatal("covered though 6 and 7 were not seen")
		}
		cv = newControlCoverage()
		cv.renewed(cv.epoch, 0, 0, 5, 100)
		cv.saw(5, "y", true) // in flight at the renew
		cv.saw(6, "z", true)
		if !cv.covers("x", 101, 0, 0) {
			t.Fatal("not covered after 5 and 6")
		}
	})
	t.Run("a sequence going back ends it", func(t *testing.T) {
		cv := newControlCoverage()
		cv.renewed(cv.epoch, 0, 0, 5, 100)
		cv.saw(6, "a", true)
		cv.saw(6, "a", true) // the same again: nothing
		if !cv.valid {
			t.Fatal("a repeated message ended it")
		}
		cv.saw(1, "x", false) // the stream was recreated
		if cv.covers("x", 101, 0, 0) || cv.valid {
			t.Fatal("covered after the sequences started again")
		}
	})
	t.Run("a renew from a lost epoch is void", func(t *testing.T) {
		cv := newControlCoverage()
		epoch := cv.epoch
		cv.saw(3, "x", true)
		cv.saw(5, "x", true)
		cv.renewed(epoch, 0, 0, 10, 100)
		if cv.valid {
			t.Fatal("a renew begun before a gap made the coverage valid")
		}
	})
	t.Run("a reconnect or a drop ends it", func(t *testing.T) {
		for _, c := range []struct {
			reconnects uint64
			dropped    int
		}{{3, 1}, {2, 2}} {
			cv := newControlCoverage()
			cv.renewed(cv.epoch, 2, 1, 5, 100)
			if cv.covers("x", 101, c.reconnects, c.dropped) || cv.valid {
				t.Fatalf("covered after %+v", c)
			}
		}
	})
	t.Run("too many runs noted end it", func(t *testing.T) {
		cv := newControlCoverage()
		cv.renewed(cv.epoch, 0, 0, 0, 100)
		for i := range maxUnclaimed + 1 {
			cv.saw(uint64(i+1), fmt.Sprint("r", i), false)
		}
		if cv.valid || len(cv.unclaimed) != 0 {
			t.Fatalf("valid %v with %d noted", cv.valid, len(cv.unclaimed))
		}
	})
}

// A control message that comes live between the run's registration and
// its control owner's start reaches the agent before its first model
// call, also when the pickup read is skipped: an abort there means no call.
func TestLiveControlBeforeStartIsAppliedFirst(t *testing.T) {
	var reads readsOf
	var c *bus.Client
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id = "aborted-at-registration"
	appliedAtStart, looked := make(chan bool, 1), make(chan struct{})
	_, c = startInternal(t, Config{HeartbeatInterval: time.Minute}, func(w *Worker) {
		w.hooks.beforeCatchUpRead = reads.hook
		// The owner waits until the run has looked: only what it applied
		// before letting the run go on counts.
		w.hooks.afterOwnerStarted = func(r *run) {
			if r.id == id {
				<-looked
			}
		}
		w.hooks.afterControlStart = func(r *run) {
			if r.id == id {
				appliedAtStart <- r.tally.stopping()
				close(looked)
			}
		}
		w.hooks.afterRegister = func(r *run) {
			if r.id != id {
				return
			}
			if _, err := c.Abort(ctx, id, "at once"); err != nil {
				t.Error(err)
				return
			}
			for len(r.ctl.inbox) == 0 && ctx.Err() == nil {
				time.Sleep(time.Millisecond) // polls the inbox itself
			}
		}
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
		t.Fatal("the abort was not applied when the control owner's start returned")
	}
}

// The audit's rules.
func TestControlCoverageAudit(t *testing.T) {
	cv := newControlCoverage()
	cv.renewed(cv.epoch, 0, 0, 5, 100)
	cv.saw(6, "a", true)
	cv.audited(true, 6)
	if !cv.valid {
		t.Fatal("ended though everything the last audit saw came")
	}
	cv.audited(true, 7) // 7 was stored an audit ago and never came
	if cv.valid || len(cv.renew) != 1 {
		t.Fatalf("valid %v, renew due %d: a message lost with nothing after it went unnoticed", cv.valid, len(cv.renew))
	}
	cv.renewed(cv.epoch, 0, 0, 9, 120)
	cv.audited(true, 7) // the renew's base is past the audit's
	if !cv.valid {
		t.Fatal("ended by an audit older than the renew")
	}
	cv.audited(false, 9)
	if cv.valid || len(cv.renew) != 0 || !cv.off {
		t.Fatalf("valid %v, renew due %d, off %v after republishing stopped", cv.valid, len(cv.renew), cv.off)
	}
	cv.audited(true, 9)
	if cv.off || len(cv.renew) != 1 {
		t.Fatalf("off %v, renew due %d after republishing came back", cv.off, len(cv.renew))
	}
}

// Republishing turned off while the worker runs: within an audit, first
// attempts read at pickup again, so an abort stored while a run is queued
// still stops it before any model call.
func TestRepublishTurnedOffIsNoticed(t *testing.T) {
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
		off = w.cover.off
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
	valid, last := w.cover.valid, w.cover.last
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
