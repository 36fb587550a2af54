package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/logbuf"
)

// A newer attempt takes the record just as the agent goes idle: the old
// attempt learns it at its finish (through the renewal the finish waits
// for, the final write, or the check before a nak) and must then neither
// ack nor nak: the server does not tell deliveries apart, so its nak
// would reschedule the newer attempt's delivery.
func TestLeaseLostAtTheFinishIsNeverNaked(t *testing.T) {
	t.Parallel()
	logs := &logbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var taken sync.Map
	_, c := startInternal(t, Config{Logger: log, AckWait: 30 * time.Second, HeartbeatInterval: time.Millisecond,
		Concurrency: 4, DrainTimeout: time.Second}, func(w *Worker) {
		// The agent's last event went out: the run goes idle next.
		wrapSends(w, sends{afterEvent: func(e *bus.Envelope) {
			if e.Type != string(agent.EventAgentEnd) {
				return
			}
			id := e.Run
			if _, again := taken.LoadOrStore(id, true); again {
				return
			}
			ctx := context.Background()
			// The newer attempt's write is a plain put, not a
			// compare-and-set: the heartbeat renews the record every
			// millisecond, and on a loaded machine a get and an update
			// lost to it for 20 s in a row (12 of 40 attempts ended in
			// 3 min). What the old attempt sees is the same: a record it
			// did not write, with a newer attempt, at its next renewal or
			// final write (lease.ownWrite).
			ent, err := w.kv.Get(ctx, id)
			if err != nil {
				t.Error(err)
				return
			}
			rec, _ := bus.DecodeRecord(ent)
			rec.Attempt += 5
			rec.Worker = "newer"
			data, _ := json.Marshal(rec)
			if _, err := w.kv.Put(ctx, id, data); err != nil {
				t.Error(err)
			}
		}})
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
	// Only a guard against a hang: what matters is how they end.
	deadline := time.Now().Add(3 * time.Minute)
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

// A bad request whose metadata is what is wrong with it (a 100 KiB value)
// fails bad_request at once: its record must not carry that value, which
// would not fit in the bucket.
func TestBadRequestWithHugeMetadataFailsAtOnce(t *testing.T) {
	t.Parallel()
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
