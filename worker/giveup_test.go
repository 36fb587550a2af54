package worker

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/logbuf"
)

// A give-up that fails after it took the run (here its read of the run's
// events fails) is retried with the attempt it took, not a new one each
// time: retries used to raise the attempt at every try (seen: 177 while
// reads failed) and store a run_started for each.
func TestGiveUpRetryKeepsItsAttempt(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	hang := echoTool(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	// Heartbeats never come in time: the one delivery times out.
	cfg := Config{Tools: []*agent.Tool{hang}, AckWait: 500 * time.Millisecond, HeartbeatInterval: time.Hour,
		MaxDeliver: 1, DrainTimeout: 50 * time.Millisecond}
	logs := &logbuf.Buffer{}
	failing := cfg
	failing.Logger = slog.New(slog.NewTextHandler(logs, nil))
	startInternalOn(t, c, failing, func(w *Worker) { w.reads.Timeout = time.Nanosecond })
	run := submitRun(t, c, &bus.RunRequest{Prompt: "go", Tools: []string{"echo"}, Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.ToolCall("c1", "echo", map[string]any{"text": "x"})}},
			{Content: []agent.Content{agent.Text("never")}},
		}}})
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for strings.Count(logs.String(), "give-up failed; retrying") < 3 {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("the give-up did not fail three times; log:\n%s", logs.String())
		}
	}
	startInternalOn(t, c, cfg, nil) // its reads work
	rec := waitRecord(t, c, run, "given up", func(r *bus.RunRecord) bool { return r.Finished() })
	if rec.Reason != bus.ReasonGaveUp || rec.Attempt != 2 {
		t.Fatalf("record %s/%s attempt %d, want failed/gave_up attempt 2", rec.State, rec.Reason, rec.Attempt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The final record is written before run_finished: read the events
	// once run_finished is stored, not when the record says finished.
	followToFinished(ctx, t, c, run)
	envs, err := c.ReadEvents(ctx, run, 0)
	if err != nil {
		t.Fatal(err)
	}
	started := map[int]int{}
	for _, e := range envs {
		if e.Type == bus.EventRunStarted {
			started[e.Attempt]++
		}
	}
	if len(started) != 2 || started[1] != 1 || started[2] != 1 {
		t.Fatalf("run_started per attempt %v, want one for attempt 1 and one for the give-up's attempt 2", started)
	}
	tr := &bus.Transcript{}
	for _, e := range envs {
		tr.Apply(e)
	}
	if tr.Finished == nil || tr.Finished.Reason != bus.ReasonGaveUp || tr.Attempt != 2 {
		t.Fatalf("transcript: finished %+v attempt %d", tr.Finished, tr.Attempt)
	}
}

// A run whose last delivery stored its final record but crashed before
// run_finished has no delivery left to publish it: the give-up does, from
// the record, and removes the request. Followers used to wait for ever.
func TestGiveUpPublishesAMissingRunFinished(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	picked, release, left := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	reads := 0
	cfg := Config{AckWait: 500 * time.Millisecond, HeartbeatInterval: time.Hour, MaxDeliver: 1, DrainTimeout: 50 * time.Millisecond}
	startInternalOn(t, c, cfg, func(w *Worker) {
		// The delivery stalls at its pickup read until the test ends; the
		// give-up's read waits until the crashed attempt's leftovers are
		// stored.
		beforeRecordRead(w, func(string) {
			mu.Lock()
			reads++
			n := reads
			mu.Unlock()
			switch n {
			case 1:
				close(picked)
				<-release
			case 2:
				<-left
			}
		})
	})
	stored := sync.OnceFunc(func() { close(left) })
	t.Cleanup(func() { close(release); stored() }) // before the worker stops
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.Submit(ctx, "", &bus.RunRequest{Prompt: "hi", Model: fauxModel, Faux: fauxTexts("hello")})
	if err != nil {
		t.Fatal(err)
	}
	<-picked
	// What the crashed attempt left: run_started, a steer it took (control
	// seq 5), and its final record.
	now := time.Now()
	rec := bus.RunRecord{ID: res.ID, Queue: "default", State: bus.StatusSucceeded, Attempt: 1, Worker: "gone",
		RequestSeq: res.Seq, StartedAt: now, FinishedAt: now, HeartbeatAt: now, Turns: 1, LastControlSeq: 5}
	b, _ := json.Marshal(rec)
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, res.ID, b); err != nil {
		t.Fatal(err)
	}
	started, _ := json.Marshal(bus.RunStarted{Type: bus.EventRunStarted, Queue: "default", Worker: "gone", Attempt: 1, Tools: []string{}})
	if _, err := c.JetStream().Publish(ctx, c.Names().Events(res.ID), (&bus.Envelope{Run: res.ID, Seq: 1, Attempt: 1, Worker: "gone", TS: now.UnixMilli(), Event: started}).AppendJSON(nil)); err != nil {
		t.Fatal(err)
	}
	stored()
	// The stalled delivery times out; its MAX_DELIVERIES advisory reaches
	// the give-up.
	e, fin := followToFinished(ctx, t, c, res.ID)
	if e.Seq != 2 || e.Attempt != 1 {
		t.Fatalf("run_finished at seq %d attempt %d, want 2 and 1", e.Seq, e.Attempt)
	}
	if fin.Status != bus.StatusSucceeded || fin.Turns != 1 || fin.LastControlSeq != 5 {
		t.Fatalf("run_finished from the record: %+v", fin)
	}
	runs, err := c.JetStream().Stream(ctx, c.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	// Removed right after run_finished was stored; the stream has no
	// event for a removal, so poll it.
	for {
		_, err := runs.GetMsg(ctx, res.Seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("request not removed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A give-up whose run_finished is not stored (here the events stream
// refuses every message once the final record is written) is tried again
// from the advisory: the retry finds the final record, publishes the
// run_finished the events lack, once, and removes the request.
func TestGiveUpRetriesARunFinishedNotStored(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Its own deadline: the hook runs on the worker's goroutine, which
	// may outlive the test's ctx.
	setMaxMsgSize := func(n int32) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		events, err := c.JetStream().Stream(ctx, c.Names().EventsStream())
		if err != nil {
			t.Error(err)
			return
		}
		cfg := events.CachedInfo().Config
		cfg.MaxMsgSize = n
		if _, err := c.JetStream().UpdateStream(ctx, cfg); err != nil {
			t.Error(err)
		}
	}
	hang := echoTool(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	// Heartbeats never come in time: the one delivery times out.
	cfg := Config{Tools: []*agent.Tool{hang}, AckWait: 500 * time.Millisecond, HeartbeatInterval: time.Hour,
		MaxDeliver: 1, DrainTimeout: 50 * time.Millisecond}
	logs := &logbuf.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	refused := make(chan struct{})
	startInternalOn(t, c, cfg, func(w *Worker) {
		// Only the give-up gets to run_finished in this test (attempt 1
		// hangs until its lease is lost).
		wrapSends(w, sends{beforeEvent: func(e *bus.Envelope) {
			if e.Type != bus.EventRunFinished {
				return
			}
			select {
			case <-refused:
			default:
				setMaxMsgSize(16)
				close(refused)
			}
		}})
	})
	run := submitRun(t, c, &bus.RunRequest{Prompt: "go", Tools: []string{"echo"}, Model: &bus.ModelRef{Provider: "faux", ID: "s"},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{
			{Content: []agent.Content{agent.ToolCall("c1", "echo", map[string]any{"text": "x"})}},
			{Content: []agent.Content{agent.Text("never")}},
		}}})
	select {
	case <-refused:
	case <-ctx.Done():
		t.Fatalf("no give-up got to its run_finished; log:\n%s", logs.String())
	}
	if t.Failed() {
		t.FailNow() // the stream was not changed
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(logs.String(), "run_finished not stored; to be tried again") {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("the give-up's run_finished did not fail; log:\n%s", logs.String())
		}
	}
	setMaxMsgSize(-1)
	_, fin := followToFinished(ctx, t, c, run)
	if fin.Status != bus.StatusFailed || fin.Reason != bus.ReasonGaveUp {
		t.Fatalf("run_finished: %+v, want failed/gave_up", fin)
	}
	rec := waitRecord(t, c, run, "given up", (*bus.RunRecord).Finished)
	if rec.Reason != bus.ReasonGaveUp {
		t.Fatalf("record %s/%s", rec.State, rec.Reason)
	}
	// The request is removed once run_finished is stored; the stream has
	// no event for a removal, so poll it.
	runs, err := c.JetStream().Stream(ctx, c.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := runs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for info.State.Msgs != 0 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("request not removed: %d messages in %s", info.State.Msgs, c.Names().RunsStream())
		}
		if info, err = runs.Info(ctx); err != nil {
			t.Fatal(err)
		}
	}
	envs, err := c.ReadEvents(ctx, run, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The give-up's attempt: run_started, run_resumed, run_finished, each
	// once, one seq after the other.
	var types []string
	var seqs []uint64
	for _, e := range envs {
		if e.Attempt == 2 {
			types, seqs = append(types, e.Type), append(seqs, e.Seq)
		}
	}
	want := []string{bus.EventRunStarted, bus.EventRunResumed, bus.EventRunFinished}
	if !slices.Equal(types, want) || seqs[1] != seqs[0]+1 || seqs[2] != seqs[1]+1 {
		t.Fatalf("the give-up's events %v at seqs %v, want %v one after the other", types, seqs, want)
	}
}

// followToFinished follows run until its run_finished.
func followToFinished(ctx context.Context, t *testing.T, c *bus.Client, run string) (*bus.Envelope, *bus.RunFinished) {
	t.Helper()
	for e, err := range c.Follow(ctx, run) {
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
		if e.Type == bus.EventRunFinished {
			fin := &bus.RunFinished{}
			if err := json.Unmarshal(e.Event, fin); err != nil {
				t.Fatal(err)
			}
			return e, fin
		}
	}
	t.Fatalf("follow %s ended without run_finished", run)
	return nil, nil
}
