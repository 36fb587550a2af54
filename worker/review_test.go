package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A newer attempt takes the record just as the agent goes idle: the old
// attempt learns it at its finish (through the renewal the finish waits
// for, the final write, or the check before a nak) and must then neither
// ack nor nak: the server does not tell deliveries apart, so its nak
// would reschedule the newer attempt's delivery.
func TestLeaseLostAtTheFinishIsNeverNaked(t *testing.T) {
	logs := &lockedLog{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var taken sync.Map
	_, c := startInternal(t, Config{Logger: log, AckWait: 30 * time.Second, HeartbeatInterval: time.Millisecond,
		Concurrency: 4, DrainTimeout: time.Second}, func(w *Worker) {
		w.beforeIdleCheck = func(id string) {
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
