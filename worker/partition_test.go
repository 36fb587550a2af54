package worker

import (
	"context"
	"iter"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/netsplit"
)

// A control message stored while the worker's connection was cut reached
// no subscription of the worker, and nothing after it shows the gap: the
// reconnect alone must end the coverage, so the queued run it names reads
// the control stream at pickup (the audit, which would notice too, is
// kept out of the way).
func TestControlDuringAPartitionIsReadAtPickup(t *testing.T) {
	t.Parallel()
	c, srv := startTestServer(t)
	part := netsplit.Start(t, srv.NATS().Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wc := part.Connect(ctx, t)
	g := newTestGate()
	w, _ := startInternalOn(t, wc, Config{Concurrency: 1, Tools: []*agent.Tool{g.tool()}, HeartbeatInterval: time.Minute},
		func(w *Worker) { w.coverageAudit = time.Hour })
	w.mu.Lock()
	valid, _ := w.cover.Valid()
	w.mu.Unlock()
	if !valid {
		t.Fatal("no control coverage after the start")
	}
	holder, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "hold", Tools: []string{"gate"},
		Model: &bus.ModelRef{Provider: "faux", ID: "s"}, Faux: gateScript("hold", "done")})
	if err != nil {
		t.Fatal(err)
	}
	within(t, g.started, 20*time.Second, "the holding run's tool")
	queued, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "never", Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: fauxTexts("nope")})
	if err != nil {
		t.Fatal(err)
	}
	part.Cut()
	netsplit.WaitStatus(t, wc.Conn(), nats.RECONNECTING)
	if _, err := c.Abort(ctx, queued.ID, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	part.Heal()
	netsplit.WaitStatus(t, wc.Conn(), nats.CONNECTED)
	g.release <- struct{}{}
	for _, id := range []string{holder.ID, queued.ID} {
		tr, err := c.LoadTranscript(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if id == queued.ID && (tr.Finished.Status != bus.StatusAborted || len(tr.Messages) != 0) {
			t.Fatalf("the run aborted during the partition: %+v, %d messages", tr.Finished, len(tr.Messages))
		}
	}
}

// A re-send whose request the lost connection swallowed is sent again on
// the new connection: it used to wait for its answer up to the whole
// retry budget (AckWait here, under PublishAckTimeout), so the run was
// handed back and resumed as attempt 2 (seen once in 20 NATS restarts).
// Here the proxy drops the first re-send after a reconnect, then the
// connection is lost again; the run must finish in its first attempt.
func TestAReSendSwallowedByALostConnectionIsSentAgain(t *testing.T) {
	t.Parallel()
	c, srv := startTestServer(t)
	part := netsplit.Start(t, srv.NATS().Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wc := part.Connect(ctx, t)
	resending := make(chan struct{})
	var once sync.Once
	startInternalOn(t, wc, Config{AckWait: 10 * time.Second}, func(w *Worker) {
		// The first send after the reconnect goes out on a connection that
		// answers nothing: an event re-sent, or the events held during the
		// loss sent (releaseHeld).
		stall := func(*bus.Envelope) {
			if wc.Conn().Stats().Reconnects > 0 {
				once.Do(func() { part.Stall(); close(resending) })
			}
		}
		wrapSends(w, sends{beforeResend: stall, beforeEvent: stall})
	})
	text := strings.Repeat("word ", 60)
	res, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "talk", Model: fauxModel,
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{{Content: []agent.Content{agent.Text(text)}}}, TokenSize: 1, TokensPerSecond: 40}})
	if err != nil {
		t.Fatal(err)
	}
	follow := c.Follow(ctx, res.ID)
	next, stop := iter.Pull2(follow)
	defer stop()
	for range 5 { // the run streams
		if _, err, ok := next(); !ok || err != nil {
			t.Fatalf("follow: %v", err)
		}
	}
	part.Cut()
	netsplit.WaitStatus(t, wc.Conn(), nats.RECONNECTING)
	part.Heal()
	within(t, resending, 20*time.Second, "a re-send after the reconnect")
	within(t, part.Swallowed(), 20*time.Second, "the re-send swallowed")
	part.Cut()
	part.Unstall()
	part.Heal()
	for {
		e, err, ok := next()
		if !ok {
			t.Fatal("follow ended before run_finished")
		}
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
		if e.Attempt != 1 {
			t.Fatalf("event %d in attempt %d: the run was handed back", e.Seq, e.Attempt)
		}
		if e.Type == bus.EventRunFinished {
			break
		}
	}
}
