package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/freeport"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/natsembed"
)

// A newer attempt takes the record just as the agent goes idle: the old
// attempt learns it at its finish (through the renewal the finish waits
// for, the final write, or the check before a nak) and must then neither
// ack nor nak: the server does not tell deliveries apart, so its nak
// would reschedule the newer attempt's delivery.
func TestLeaseLostAtTheFinishIsNeverNaked(t *testing.T) {
	logs := &logbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var taken sync.Map
	_, c := startInternal(t, Config{Logger: log, AckWait: 30 * time.Second, HeartbeatInterval: time.Millisecond,
		Concurrency: 4, DrainTimeout: time.Second}, func(w *Worker) {
		w.signals.run.beforeIdleCheck = func(id string) {
			if _, again := taken.LoadOrStore(id, true); again {
				return
			}
			ctx := context.Background()
			for range 100 { // the heartbeat renews the record every millisecond
				e, err := w.kv.Get(ctx, id)
				if err != nil {
					t.Error(err)
					return
				}
				rec, _ := bus.DecodeRecord(e)
				rec.Attempt += 5
				rec.Worker = "newer"
				data, _ := json.Marshal(rec)
				if _, err := w.kv.Update(ctx, id, data, e.Revision()); err == nil {
					return
				}
			}
			t.Error("the record could not be overwritten")
		}
	})
	ctx := context.Background()
	const n = 40
	for i := range n {
		if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: fmt.Sprintf("r%d", i), Prompt: "hi",
			Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: fauxTexts("hello")}); err != nil {
			t.Fatal(err)
		}
	}
	// Every attempt has ended one way or the other.
	ended := func() (lost, naked int) {
		out := logs.String()
		return strings.Count(out, "lease lost to a newer attempt"), strings.Count(out, "handing the request back") +
			strings.Count(out, "handing the run back")
	}
	deadline := time.Now().Add(30 * time.Second)
	for lost, naked := ended(); lost+naked < n; lost, naked = ended() {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d attempts ended:\n%s", lost+naked, n, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, naked := ended(); naked > 0 {
		t.Errorf("%d attempts that lost their lease were handed back (naked)", naked)
	}
}

// A steer already in the run's inbox when the idle check's read fails (NATS
// away): intake must not close on a read that failed, and the steer is
// delivered once the stream can be read again.
func TestIdleCheckNeverClosesOnAFailedRead(t *testing.T) {
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
	w.signals.run.beforeIdleCheck = func(run string) { armed.Store(run == id && !fired.Load()) }
	w.signals.control.beforeCatchUpRead = func(run string) {
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
	}
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

// Each read of the control stream starts after what the last one saw: a
// run that took many control messages does not read them all again at
// every heartbeat.
func TestCatchUpReadsOnlyWhatIsNew(t *testing.T) {
	const id, n = "many", 100
	var reads atomic.Int64
	g := newTestGate()
	o := ctlObs{got: make(chan string, n)}
	w, c := startInternal(t, Config{Tools: []*agent.Tool{g.tool()}, AckWait: time.Minute,
		HeartbeatInterval: time.Minute, Observer: o}, func(w *Worker) {
		w.signals.control.beforeCatchUpRead = func(run string) {
			if run == id {
				reads.Add(1)
			}
		}
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

// A bad request whose metadata is what is wrong with it (a 100 KiB value)
// fails bad_request at once: its record must not carry that value, which
// would not fit in the bucket.
func TestBadRequestWithHugeMetadataFailsAtOnce(t *testing.T) {
	_, c := startInternal(t, Config{AckWait: 5 * time.Second, MaxDeliver: 2}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for id, body := range map[string]map[string]any{
		"bigmeta":  {"prompt": "hi", "metadata": map[string]string{"k": strings.Repeat("v", 100<<10)}},
		"bigmodel": {"prompt": "hi", "model": "openai/" + strings.Repeat("m", 70_000)},
	} {
		data, _ := json.Marshal(body)
		if _, err := c.SubmitRaw(ctx, "", id, data); err != nil {
			t.Fatal(err)
		}
		tr, err := c.LoadTranscript(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Finished.Reason != bus.ReasonBadRequest || tr.Attempt != 1 {
			t.Errorf("%s: %s/%s on attempt %d, want failed/bad_request on attempt 1", id, tr.Finished.Status, tr.Finished.Reason, tr.Attempt)
		}
		rec, err := c.Status(ctx, id)
		if err != nil || rec.Reason != bus.ReasonBadRequest || len(rec.Metadata) != 0 {
			t.Errorf("%s: record %+v %v", id, rec, err)
		}
	}
}

// While the control stream stays unreadable at a run's end, the run does
// not hold its slot until its timeout: after one AckWait it is handed back.
func TestUnreadableControlsHandTheRunBack(t *testing.T) {
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
	w, err := New(Config{Client: c, PollWait: 200 * time.Millisecond, AckWait: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	const id = "no-controls"
	var down atomic.Bool
	w.signals.run.beforeIdleCheck = func(run string) {
		if run == id && down.CompareAndSwap(false, true) {
			srv.Shutdown() // and it stays down
		}
	}
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
