package worker

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
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
		r.pub.mu.Lock()
		defer r.pub.mu.Unlock()
		return r.pub.turn != nil
	})
	if abort {
		if _, err := c.Abort(ctx, id, "stop it"); err != nil {
			t.Fatal(err)
		}
		until("the abort taken", func() bool { return run().tally.aborted() })
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
