package worker

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/freeport"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/natsembed"
)

// A steer already in the run's inbox when the idle check's read fails (NATS
// away): intake must not close on a read that failed, and the steer is
// delivered once the stream can be read again.
func TestIdleCheckNeverClosesOnAFailedRead(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	port := freeport.Pick(t) // restarted on: see freeport
	srv, err := natsembed.Start(natsembed.Options{Port: port, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	restarted := make(chan *natsembed.Server, 1)
	t.Cleanup(func() {
		select {
		case s := <-restarted:
			s.Shutdown()
		case <-time.After(20 * time.Second):
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	logs := &logbuf.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	w, err := New(Config{Client: c, PollWait: 200 * time.Millisecond, AckWait: time.Minute,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	const id = "idle-fail"
	var armed, fired atomic.Bool
	// Armed once the agent's last event went out (the run goes idle next):
	// the next read is the idle check's.
	wrapSends(w, sends{afterEvent: func(e *bus.Envelope) {
		if e.Type == string(agent.EventAgentEnd) {
			armed.Store(e.Run == id && !fired.Load())
		}
	}})
	beforeControlRead(w, func(run string) {
		if run != id || !armed.CompareAndSwap(true, false) {
			return
		}
		fired.Store(true)
		if _, err := c.Steer(ctx, id, "late"); err != nil {
			t.Error(err)
			return
		}
		// The steer's live copy reaches the inbox, then NATS goes away
		// for longer than a read may take.
		w.mu.Lock()
		r := w.runs[id]
		w.mu.Unlock()
		for deadline := time.Now().Add(5 * time.Second); len(r.ctl.inbox) == 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		srv.Shutdown()
		go func() {
			time.Sleep(6 * time.Second) // the outage
			s, err := natsembed.Start(natsembed.Options{Port: port, StoreDir: dir})
			if err != nil {
				t.Error(err)
				return
			}
			restarted <- s
		}()
	})
	wctx, wcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { wcancel(); <-done }()
	<-w.Ready()
	if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "one", Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: fauxTexts("first", "second")}); err != nil {
		t.Fatal(err)
	}
	// Where everything waits, should the follow not end in time.
	stacks := make(chan []byte, 1)
	dump := time.AfterFunc(50*time.Second, func() {
		b := make([]byte, 1<<20)
		stacks <- b[:runtime.Stack(b, true)]
	})
	defer dump.Stop()
	tr, err := c.LoadTranscript(ctx, id)
	if err != nil {
		select {
		case b := <-stacks:
			t.Logf("goroutines 10 s before the deadline:\n%s", b)
		default:
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		evs, rerr := c.ReadEvents(dctx, id, 0)
		for _, e := range evs {
			t.Logf("stored: seq %d %s", e.Seq, e.Type)
		}
		t.Fatal(err, rerr)
	}
	if got := fmt.Sprint(userTexts(tr)); got != "[one late]" || tr.Finished.LastControlSeq == 0 {
		t.Fatalf("the steer stored before the idle check was lost: users %s, lastControlSeq %d", got, tr.Finished.LastControlSeq)
	}
}

// While the control stream stays unreadable at a run's end, the run does
// not hold its slot until its timeout: after one AckWait it is handed back.
func TestUnreadableControlsHandTheRunBack(t *testing.T) {
	t.Parallel()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	logs := &logbuf.Buffer{}
	w, err := New(Config{Client: c, PollWait: 200 * time.Millisecond, AckWait: 2 * time.Second, DrainTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	const id = "no-controls"
	var idle, down atomic.Bool
	wrapSends(w, sends{afterEvent: func(e *bus.Envelope) {
		// The agent's last event went out: the run goes idle next.
		if e.Type == string(agent.EventAgentEnd) && e.Run == id {
			idle.Store(true)
		}
	}})
	// The idle check reads the control stream: NATS goes away once the
	// run's events are stored (only the controls are unreadable).
	beforeControlRead(w, func(run string) {
		if run != id || !idle.Load() || !down.CompareAndSwap(false, true) {
			return
		}
		w.mu.Lock()
		r := w.runs[id]
		w.mu.Unlock()
		if err := r.pub.Sync(ctx); err != nil {
			t.Error(err)
		}
		srv.Shutdown() // and it stays down
	})
	wctx, wcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { wcancel(); <-done }()
	<-w.Ready()
	if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "one", Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: fauxTexts("first")}); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(logs.String(), "the control stream could not be read") {
		if ctx.Err() != nil {
			t.Fatalf("the run was not handed back within a minute:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A follow-up (and a steer) that arrive after the agent's last look at its
// queues, while the run is not finished yet, still run.
func TestLateControlMessagesAreNotLost(t *testing.T) {
	t.Parallel()
	o := ctlObs{got: make(chan string, 10)}
	idle := make(chan string)
	resume := make(chan struct{})
	first := true
	_, c := startInternal(t, Config{Observer: o}, func(w *Worker) {
		// The agent's last event went out: it will not poll its queues
		// again; the run goes idle next.
		wrapSends(w, sends{afterEvent: func(e *bus.Envelope) {
			if e.Type == string(agent.EventAgentEnd) && first {
				first = false
				idle <- e.Run
				<-resume
			}
		}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	res, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "one", Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.Text("first")}},
			{Content: []agent.Content{agent.Text("second")}},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-idle: // agent_end is out; the agent will not poll again
	case <-ctx.Done():
		t.Fatal("run never went idle")
	}
	if _, err := c.FollowUp(ctx, res.ID, "late"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-o.got:
	case <-ctx.Done():
		t.Fatal("follow-up never received")
	}
	close(resume)
	tr, err := c.LoadTranscript(ctx, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, m := range tr.Messages {
		texts = append(texts, m.Role+":"+m.TextOf())
	}
	want := []string{"user:one", "assistant:first", "user:late", "assistant:second"}
	if len(texts) != len(want) {
		t.Fatalf("transcript %v", texts)
	}
	for i := range want {
		if texts[i] != want[i] {
			t.Fatalf("transcript %v, want %v", texts, want)
		}
	}
	if tr.Finished.Status != bus.StatusSucceeded || len(tr.ControlSeqs()) != 1 {
		t.Fatalf("finished %+v, control seqs %v", tr.Finished, tr.ControlSeqs())
	}
}
