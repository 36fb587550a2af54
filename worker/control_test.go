package worker

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// testGate is a tool that blocks until the test opens it.
type testGate struct {
	started chan string
	release chan struct{}
}

func newTestGate() *testGate {
	return &testGate{started: make(chan string, 10), release: make(chan struct{}, 10)}
}

func (g *testGate) tool() *agent.Tool {
	return agent.NewTool("gate", "waits until the test opens it", func(ctx context.Context, a struct {
		Name string `json:"name"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		g.started <- a.Name
		select {
		case <-g.release:
			return agent.TextResult("opened " + a.Name), nil
		case <-ctx.Done():
			return agent.ToolResult{}, ctx.Err()
		}
	})
}

func gateScript(name string, texts ...string) *bus.FauxScript {
	s := &bus.FauxScript{Responses: []agent.ScriptedResponse{{
		Content:    []agent.Content{agent.ToolCall("g-"+name, "gate", map[string]any{"name": name})},
		StopReason: agent.StopReasonToolUse}}}
	for _, t := range texts {
		s.Responses = append(s.Responses, agent.ScriptedResponse{Content: []agent.Content{agent.Text(t)}})
	}
	return s
}

func within[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %s", what, d)
		var zero T
		return zero
	}
}

func userTexts(tr *bus.Transcript) []string {
	var out []string
	for _, m := range tr.Messages {
		if m.Role == agent.RoleUser {
			out = append(out, m.TextOf())
		}
	}
	return out
}

// One run's control owner stuck in a read of the control stream does not
// hold up another run's control messages (nor the NATS callback).
func TestStalledCatchUpDoesNotStallOtherRuns(t *testing.T) {
	t.Parallel()
	const stalled = "stalled-run"
	reached, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once
	g := newTestGate()
	o := ctlObs{got: make(chan string, 10)}
	// Heartbeats (which also read the control stream) far apart: B gets
	// its steer from the live path or not at all.
	_, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, Concurrency: 4, AckWait: 2 * time.Minute,
		HeartbeatInterval: time.Minute, Observer: o}, func(w *Worker) {
		beforeControlRead(w, func(id string) {
			if id == stalled {
				once.Do(func() { close(reached) })
				<-unblock
			}
		})
	})
	released := sync.OnceFunc(func() { close(unblock) })
	defer released()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	model := &bus.ModelRef{Provider: "faux", ID: "s"}

	b, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "b", Tools: []string{"gate"}, Model: model, Faux: gateScript("b", "b done")})
	if err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "run B's tool")
	if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: stalled, Prompt: "a", Model: model, Faux: fauxTexts("a1", "a2")}); err != nil {
		t.Fatal(err)
	}
	within(t, reached, 20*time.Second, "run A's catch-up read")
	if _, err := c.Steer(ctx, stalled, "to a"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Steer(ctx, b.ID, "to b"); err != nil {
		t.Fatal(err)
	}
	// Only B can take a control message now.
	within(t, o.got, 10*time.Second, "run B's steer while run A's read is stalled")
	g.release <- struct{}{}
	trB, err := c.LoadTranscript(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(userTexts(trB)); got != "[b to b]" || trB.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("run B: user messages %s, %+v", got, trB.Finished)
	}
	released()
	trA, err := c.LoadTranscript(ctx, stalled)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(userTexts(trA)); got != "[a to a]" || trA.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("run A: user messages %s, %+v", got, trA.Finished)
	}
}

func fauxTexts(texts ...string) *bus.FauxScript {
	s := &bus.FauxScript{}
	for _, t := range texts {
		s.Responses = append(s.Responses, agent.ScriptedResponse{Content: []agent.Content{agent.Text(t)}})
	}
	return s
}

// A flood of control messages to one run, while its owner is stuck in a
// read: the inbox stays bounded (the overflow is dropped and read from the
// stream later), and every message is delivered exactly once, in order.
func TestControlFloodIsBoundedAndExactlyOnce(t *testing.T) {
	t.Parallel()
	const id, n = "flooded", 300
	var block sync.Mutex
	blocking := false
	reached, unblock := make(chan struct{}, 1), make(chan struct{})
	g := newTestGate()
	o := ctlObs{got: make(chan string, n)}
	w, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, AckWait: 30 * time.Second,
		HeartbeatInterval: 100 * time.Millisecond, Observer: o}, func(w *Worker) {
		beforeControlRead(w, func(run string) {
			block.Lock()
			b := blocking
			blocking = false
			block.Unlock()
			if b && run == id {
				reached <- struct{}{}
				<-unblock
			}
		})
	})
	// Only a guard against a hang: 300 steers, each read back, took over
	// a minute on a loaded machine under -race.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "go", Tools: []string{"gate"}, SteeringMode: agent.QueueAll,
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: gateScript("x", "done")}); err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "the tool")
	// The next heartbeat's read blocks the owner.
	block.Lock()
	blocking = true
	block.Unlock()
	within(t, reached, 20*time.Second, "the owner's read")
	var seqs []uint64
	for i := range n {
		if i == n/2 {
			close(unblock)
		}
		s, err := c.Steer(ctx, id, fmt.Sprintf("s%d", i))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	w.mu.Lock()
	r := w.runs[id]
	w.mu.Unlock()
	if r == nil {
		t.Fatal("the run is not running")
	}
	if d := r.ctl.dropped.Load(); d == 0 {
		t.Fatalf("no live message dropped: the flood did not overflow the inbox of %d", controlInbox)
	}
	// Every steer in the agent's queue, then the tool ends: one turn
	// takes them all.
	for i := range n {
		within(t, o.got, 20*time.Second, fmt.Sprintf("steer %d in the agent's queue", i))
	}
	g.release <- struct{}{}
	tr, err := c.LoadTranscript(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	got := userTexts(tr)
	if len(got) != n+1 || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("%d user messages, want %d; %+v", len(got), n+1, tr.Finished)
	}
	for i := range n {
		if got[i+1] != fmt.Sprintf("s%d", i) {
			t.Fatalf("user message %d is %q", i+1, got[i+1])
		}
	}
	if cs := tr.ControlSeqs(); fmt.Sprint(cs) != fmt.Sprint(seqs) {
		t.Fatalf("control seqs %v\nwant %v", cs, seqs)
	}
	t.Logf("%d steers: %d live messages dropped and read from the stream instead", n, r.ctl.dropped.Load())
}

// queueObs checks, when a steer is reported, that it is in the agent's
// queue: tests that wait for the report then rely on it.
type queueObs struct {
	NopObserver
	w      **Worker
	queued chan bool
}

func (o queueObs) ControlReceived(string) {
	w := *o.w
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.runs {
		o.queued <- r.agent.HasQueuedMessages()
	}
}

func TestControlReportedOnceQueued(t *testing.T) {
	t.Parallel()
	var wp *Worker
	o := queueObs{w: &wp, queued: make(chan bool, 10)}
	g := newTestGate()
	_, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, Observer: o}, func(w *Worker) { wp = w })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"},
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: gateScript("x", "done")})
	if err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "the tool")
	if _, err := c.Steer(ctx, res.ID, "steer"); err != nil {
		t.Fatal(err)
	}
	if !within(t, o.queued, 20*time.Second, "the steer reported") {
		t.Fatal("the steer was reported before it was in the agent's queue")
	}
	g.release <- struct{}{}
	if _, err := c.LoadTranscript(ctx, res.ID); err != nil {
		t.Fatal(err)
	}
}

// A run waiting in its tool keeps no control owner goroutine: a steer
// starts one, which queues it and stops again, and the steer still runs.
func TestWaitingRunKeepsNoControlOwner(t *testing.T) {
	// Not parallel: it counts the process's control owners.
	g := newTestGate()
	o := ctlObs{got: make(chan string, 10)}
	_, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, Concurrency: 2, AckWait: 2 * time.Minute,
		HeartbeatInterval: time.Minute, Observer: o}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "p", Tools: []string{"gate"},
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: gateScript("x", "done")})
	if err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "the tool")
	waitControlOwners(t, "while the tool runs")
	if _, err := c.Steer(ctx, run.ID, "meanwhile"); err != nil {
		t.Fatal(err)
	}
	within(t, o.got, 10*time.Second, "the steer")
	waitControlOwners(t, "after the steer was queued")
	g.release <- struct{}{}
	tr, err := c.LoadTranscript(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(userTexts(tr)); got != "[p meanwhile]" || tr.Finished.Status != bus.StatusSucceeded {
		t.Fatalf("user messages %s, %+v", got, tr.Finished)
	}
}

// waitControlOwners waits until no goroutine is a control owner.
func waitControlOwners(t *testing.T, when string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n == len(buf) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		owners := strings.Count(string(buf[:n]), ".(*controls).own(")
		if owners == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d control owner goroutines, want none", when, owners)
		}
		time.Sleep(5 * time.Millisecond) // polls the state itself
	}
}

// A steer or follow-up with an invalid body tells its sender why it was
// not taken, on the run's events (control_rejected, since 1.8), and the
// run goes on without it.
func TestInvalidControlIsRejectedOnTheRun(t *testing.T) {
	t.Parallel()
	g := newTestGate()
	_, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"},
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: gateScript("x", "done")})
	if err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "the tool")
	n := c.Names()
	sent := map[uint64]string{}
	for kind, body := range map[string]string{bus.KindSteer: `{"txt":"typo"}`, bus.KindFollowUp: `{"message":{"role":"assistant","content":"x"}}`} {
		ack, err := c.JetStream().Publish(ctx, n.Control(res.ID, kind), []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		sent[ack.Sequence] = kind
	}
	got := map[uint64]string{}
	for env, err := range c.Follow(ctx, res.ID) {
		if err != nil {
			t.Fatal(err)
		}
		ev, err := env.Decode()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Control != nil {
			cr := ev.Control
			if cr.Reason == "" || cr.Kind != sent[cr.ControlSeq] {
				t.Errorf("control_rejected %+v, sent %v", cr, sent)
			}
			got[cr.ControlSeq] = cr.Kind
			if len(got) == len(sent) {
				g.release <- struct{}{}
			}
		}
	}
	if len(got) != len(sent) {
		t.Fatalf("rejected %v, sent %v", got, sent)
	}
	tr, err := c.LoadTranscript(ctx, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Finished.Status != bus.StatusSucceeded || fmt.Sprint(userTexts(tr)) != "[go]" {
		t.Fatalf("finished %+v, user messages %q", tr.Finished, userTexts(tr))
	}
}

// Junk steers cost a run at most maxControlRejections control_rejected
// events (anyone who may steer may steer any run, and each event counts
// toward the run's event budget); an abort sent after them ends the run.
func TestInvalidControlRejectionsAreCapped(t *testing.T) {
	t.Parallel()
	g := newTestGate()
	_, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"},
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: gateScript("x", "done")})
	if err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "the tool")
	subj := c.Names().Control(res.ID, bus.KindSteer)
	const junk = maxControlRejections + 9
	for i := range junk {
		if _, err := c.JetStream().Publish(ctx, subj, fmt.Appendf(nil, `{"txt":"junk %d"}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Abort(ctx, res.ID, "enough"); err != nil {
		t.Fatal(err)
	}
	rejected := 0
	var fin *bus.RunFinished
	for env, err := range c.Follow(ctx, res.ID) {
		if err != nil {
			t.Fatal(err)
		}
		ev, err := env.Decode()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Control != nil {
			rejected++
		}
		if ev.RunFinished != nil {
			fin = ev.RunFinished
		}
	}
	if rejected != maxControlRejections || fin == nil || fin.Status != bus.StatusAborted {
		t.Fatalf("%d control_rejected for %d junk steers (want %d), finished %+v (want aborted)", rejected, junk, maxControlRejections, fin)
	}
}

// An abort behind junk steers is taken while their control_rejected events
// cannot be published (the run's events are not going out): the control
// owner does not wait for the publish window on junk.
func TestAbortIsNotHeldUpByRejections(t *testing.T) {
	t.Parallel()
	stopped := make(chan struct{})
	started := make(chan struct{}, 1)
	gate := agent.NewTool("gate", "waits until the run stops", func(ctx context.Context, _ struct {
		Name string `json:"name"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		started <- struct{}{}
		<-ctx.Done()
		close(stopped)
		return agent.ToolResult{}, ctx.Err()
	})
	var hold atomic.Bool
	held := make(chan struct{})
	_, c := startInternal(t, Config{Tools: []*agent.Tool{gate}}, func(w *Worker) {
		wrapSends(w, sends{beforeEvent: func(*bus.Envelope) {
			if hold.Load() {
				<-held
			}
		}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "go", Tools: []string{"gate"},
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: gateScript("x", "done")})
	if err != nil {
		t.Fatal(err)
	}
	within(t, started, 20*time.Second, "the tool")
	hold.Store(true) // the run's events go out no more
	if _, err := c.JetStream().Publish(ctx, c.Names().Control(res.ID, bus.KindSteer), []byte(`{"txt":"junk"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Abort(ctx, res.ID, "enough"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		close(held)
		t.Fatal("the abort was not taken while the junk steer's rejection waited to be published")
	}
	hold.Store(false)
	close(held)
	tr, err := c.LoadTranscript(ctx, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Finished == nil || tr.Finished.Status != bus.StatusAborted {
		t.Fatalf("finished %+v, want aborted", tr.Finished)
	}
}

// Each read of the control stream starts after what the last one saw: a
// run that took many control messages does not read them all again at
// every heartbeat.
func TestCatchUpReadsOnlyWhatIsNew(t *testing.T) {
	t.Parallel()
	const id, n = "many", 100
	var reads atomic.Int64
	g := newTestGate()
	o := ctlObs{got: make(chan string, n)}
	w, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, AckWait: time.Minute,
		HeartbeatInterval: time.Minute, Observer: o}, func(w *Worker) {
		beforeControlRead(w, func(run string) {
			if run == id {
				reads.Add(1)
			}
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "go", Tools: []string{"gate"}, SteeringMode: agent.QueueAll,
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: gateScript("x", "done")}); err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "the tool")
	for i := range n {
		if _, err := c.Steer(ctx, id, fmt.Sprintf("s%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		within(t, o.got, 20*time.Second, "steer")
	}
	w.mu.Lock()
	r := w.runs[id]
	w.mu.Unlock()
	// The wake channel holds one request: a send goes through once the
	// owner (kicked after each) has taken the one before, so after the
	// third send the first read is complete.
	for range 3 {
		r.ctl.wake <- struct{}{}
		r.ctl.kick()
	}
	before := reads.Load()
	for range 3 {
		r.ctl.wake <- struct{}{}
		r.ctl.kick()
	}
	if got := reads.Load() - before; got > 6 {
		t.Errorf("3 catch-ups with nothing new read the stream %d times (the run holds %d control messages)", got, n)
	}
	g.release <- struct{}{}
	if _, err := c.LoadTranscript(ctx, id); err != nil {
		t.Fatal(err)
	}
}

type ctlObs struct {
	NopObserver
	got chan string
}

func (o ctlObs) ControlReceived(kind string) { o.got <- kind }
