package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/natsembed"
)

func snapshotClient(t *testing.T) (*Client, context.Context) {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	c, err := Connect(ctx, ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.EnsureStreams(ctx, StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	return c, ctx
}

// A snapshot is stored and read back whole, in chunks, with its header;
// a reader refuses one larger than it reserved, one of another attempt,
// and one whose body does not match its header (a forged object).
func TestSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	c, ctx := snapshotClient(t)
	if _, err := c.SnapshotInfo(ctx, "nothing"); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("no snapshot: %v", err)
	}
	big := strings.Repeat("é\"x\n", 100_000) // past one chunk, with escapes
	msgs := []agent.Message{agent.UserText("hello"), {Role: agent.RoleAssistant, Content: []agent.Content{agent.Text(big)}, Timestamp: 7}}
	h, err := c.PutSnapshot(ctx, SnapshotHeader{Run: "r1", Attempt: 2, From: "r0"}, msgs)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(msgs)
	if h.Messages != 2 || h.Bytes != int64(len(want)) {
		t.Fatalf("header %+v, want 2 messages of %d bytes", h, len(want))
	}
	if info, err := c.SnapshotInfo(ctx, "r1"); err != nil || info != h {
		t.Fatalf("info %+v %v, want %+v", info, err, h)
	}
	got, gh, err := c.LoadSnapshot(ctx, "r1", 2, h.Bytes)
	if err != nil || gh != h {
		t.Fatalf("load: %+v %v", gh, err)
	}
	if b, _ := json.Marshal(got); !bytes.Equal(b, want) {
		t.Fatalf("messages differ: %d bytes, want %d", len(b), len(want))
	}
	if _, _, err := c.LoadSnapshot(ctx, "r1", 2, h.Bytes-1); err == nil || !strings.Contains(err.Error(), "more than the") {
		t.Fatalf("larger than reserved: %v", err)
	}
	if _, _, err := c.LoadSnapshot(ctx, "r1", 1, 0); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("another attempt's: %v", err)
	}
	obs, err := c.js.ObjectStore(ctx, c.names.TranscriptsBucket())
	if err != nil {
		t.Fatal(err)
	}
	for name, forged := range map[string]struct {
		md   map[string]string
		body string
	}{
		"more messages":  {map[string]string{"run": "f1", "attempt": "1", "messages": "1"}, `[{"role":"user","content":"a","timestamp":1},{"role":"user","content":"b","timestamp":1}]`},
		"fewer messages": {map[string]string{"run": "f2", "attempt": "1", "messages": "3"}, `[{"role":"user","content":"a","timestamp":1}]`},
		"not an array":   {map[string]string{"run": "f3", "attempt": "1", "messages": "0"}, `{"role":"user"}`},
		"other run":      {map[string]string{"run": "r1", "attempt": "1", "messages": "0"}, `[]`},
		"no header":      {nil, `[]`},
	} {
		id := forged.md["run"]
		if name == "other run" || name == "no header" {
			id = "f-" + strings.ReplaceAll(name, " ", "-")
		}
		if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: id, Metadata: forged.md}, strings.NewReader(forged.body)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.LoadSnapshot(ctx, id, 0, 0); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}

// transcript_restored names what the run continues; a reader that does
// not know an event type (as a reader before 1.9 does not know this one)
// skips it and sees the run's own messages.
func TestTranscriptRestoredAndUnknownEvents(t *testing.T) {
	for _, typ := range []string{EventTranscriptRestored, "transcript_restored_from_the_future"} {
		tr := &Transcript{}
		user := agent.UserText("go on")
		for i, ev := range []any{
			RunStarted{Type: EventRunStarted, Attempt: 1, ContinueFrom: "r0"},
			map[string]any{"type": typ, "from": "r0", "messages": 12, "bytes": 4096},
			AgentEvent{Type: string(agent.EventMessageEnd), Message: &user},
			RunFinished{Type: EventRunFinished, Status: StatusSucceeded},
		} {
			if err := tr.Apply(env(t, "r1", 1, uint64(i+1), 0, ev)); err != nil {
				t.Fatalf("%s: %v", typ, err)
			}
		}
		if !tr.Done() || len(tr.Messages) != 1 || tr.Messages[0].TextOf() != "go on" {
			t.Fatalf("%s: transcript %+v", typ, tr.Messages)
		}
		want := (*TranscriptRestored)(nil)
		if typ == EventTranscriptRestored {
			want = &TranscriptRestored{Type: typ, From: "r0", Messages: 12, Bytes: 4096}
		}
		if (tr.Restored == nil) != (want == nil) || (want != nil && *tr.Restored != *want) {
			t.Fatalf("%s: restored %+v", typ, tr.Restored)
		}
	}
}
