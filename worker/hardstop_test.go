package worker

import (
	"context"
	"encoding/json"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/logbuf"
)

// A run whose event waits its turn (its run_started unanswered) when the
// hard stop comes is handed back as a run at a hard stop is, at once and
// with "worker stopping", not as events the stream would not store, and
// no failed publish is counted; an aborted run too, whose end cannot be
// published now (the next attempt ends it).
func TestARunCutShortByTheHardStopIsHandedBackAsOne(t *testing.T) {
	t.Parallel()
	t.Run("running", func(t *testing.T) { hardStopDuringATurn(t, false) })
	t.Run("aborted", func(t *testing.T) { hardStopDuringATurn(t, true) })
}

func hardStopDuringATurn(t *testing.T, abort bool) {
	logs := &logbuf.Buffer{}
	o := &publishFailures{}
	w, c := startInternal(t, Config{Concurrency: 1, PublishAckTimeout: time.Hour, Observer: o,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}, nil)
	routeAcks(t, w, func(m *nats.Msg) *nats.Msg {
		if strings.HasSuffix(m.Subject, ".1") {
			return nil // run_started's ack never comes
		}
		return m
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const id = "hardstop1"
	if _, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "hi",
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: fauxTexts("hello")}); err != nil {
		t.Fatal(err)
	}
	run := func() *run {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.runs[id]
	}
	until := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			if ctx.Err() != nil {
				t.Fatalf("%s: not within 30 s\n%s", what, logs.String())
			}
			runtime.Gosched()
		}
	}
	until("an event waiting its turn", func() bool {
		r := run()
		if r == nil || r.pub == nil {
			return false
		}
		return r.pub.WaitingTurn()
	})
	if abort {
		if _, err := c.Abort(ctx, id, "stop it"); err != nil {
			t.Fatal(err)
		}
		until("the abort taken", func() bool { return run().tally.Aborted() })
	}
	w.hardCancel()
	until("the run handed back", func() bool {
		out := logs.String()
		return strings.Contains(out, "handed back") || strings.Contains(out, "handing")
	})
	out := logs.String()
	if !strings.Contains(out, "worker stopping: run stopped and handed back") || strings.Contains(out, "could not be stored") ||
		strings.Contains(out, "not stored") {
		t.Fatalf("the run was not handed back as one at a hard stop:\n%s", out)
	}
	if n := o.n.Load(); n != 0 {
		t.Errorf("%d failed publishes counted at a hard stop", n)
	}
}

// A drain that times out while a later attempt reads its run's events to
// resume: the read ends (context canceled) and the attempt is handed back
// as a run at a hard stop is, not as events that could not be stored.
func TestAHardStopDuringAResumeHandsTheRunBackAsOne(t *testing.T) {
	t.Parallel()
	c, _ := startTestServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	// A record its first attempt may take but did not read (a consumer
	// recreated): attempt 1 hands the request back, attempt 2 resumes.
	const id = "resume-at-stop"
	sub, err := c.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "one", Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: fauxTexts("first")})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(bus.RunRecord{ID: id, Queue: "default", State: bus.StateRunning, Attempt: 1, RequestSeq: sub.Seq,
		Worker: "gone", HeartbeatAt: time.Now()})
	if _, err := kv.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	logs := &logbuf.Buffer{}
	w, err := New(Config{Client: c, PollWait: 200 * time.Millisecond, DrainTimeout: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	resuming := make(chan struct{})
	// Attempt 2 resumes once its run_started is stored: the drain times
	// out while that wait and the read are under way.
	var once sync.Once
	wrapSends(w, sends{beforeEvent: func(e *bus.Envelope) {
		if e.Type == bus.EventRunStarted && e.Attempt > 1 {
			once.Do(func() {
				close(resuming)
				<-w.hardCtx.Done()
			})
		}
	}})
	wctx, wcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	select {
	case <-resuming:
	case <-ctx.Done():
		wcancel()
		<-done
		t.Fatalf("no resume within a minute:\n%s", logs.String())
	}
	wcancel() // drain: it times out after 50 ms
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if !strings.Contains(out, "worker stopping: run stopped and handed back") || strings.Contains(out, "could not be stored") {
		t.Fatalf("the resuming attempt was not handed back as one at a hard stop:\n%s", out)
	}
}
