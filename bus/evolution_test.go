package bus_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// An older worker's EnsureStreams must not undo what a newer worker or an
// operator added: a subject, a byte limit, a longer age, more replicas'
// worth of settings it does not know.
func TestEnsureStreamsOnlyWidens(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{NoStreams: true})
	ctx, c := fleettest.Context(t), f.Client
	n := c.Names()
	extra := n.Prefix() + ".run.*.progress"
	if _, err := c.JetStream().CreateStream(ctx, jetstream.StreamConfig{
		Name:     n.EventsStream(),
		Subjects: []string{n.Events("*"), extra},
		MaxBytes: 512 << 20,
		MaxAge:   30 * 24 * time.Hour,
		Metadata: map[string]string{"owner": "ops"},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.JetStream().CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: n.RecordsBucket(), History: 1, MaxBytes: 64 << 20, TTL: time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second run changes nothing
		if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := streamConfig(ctx, t, c, n.EventsStream())
	if !slices.Contains(cfg.Subjects, extra) || !slices.Contains(cfg.Subjects, n.Events("*")) {
		t.Errorf("subjects %v", cfg.Subjects)
	}
	if cfg.MaxBytes != 512<<20 || cfg.MaxAge != 30*24*time.Hour || cfg.Metadata["owner"] != "ops" {
		t.Errorf("operator settings lost: max bytes %d, max age %v, metadata %v", cfg.MaxBytes, cfg.MaxAge, cfg.Metadata)
	}
	if cfg.Duplicates < 2*time.Minute {
		t.Errorf("duplicate window %v not raised", cfg.Duplicates)
	}
	kv := streamConfig(ctx, t, c, "KV_"+n.RecordsBucket())
	if kv.MaxBytes != 64<<20 || kv.MaxAge != 7*24*time.Hour {
		t.Errorf("bucket: max bytes %d, max age %v (the TTL is raised to the default week, the byte limit kept)", kv.MaxBytes, kv.MaxAge)
	}
	// The streams EnsureStreams created itself are complete.
	ctl := streamConfig(ctx, t, c, n.ControlStream())
	if ctl.RePublish == nil || len(ctl.Subjects) != len(controlKinds) {
		t.Errorf("control stream %+v", ctl)
	}
	// A run still goes through: the widened streams work.
	res, err := c.Submit(ctx, bus.DefaultQueue, &bus.RunRequest{Prompt: "hi"})
	if err != nil || res.ID == "" {
		t.Fatalf("submit: %v", err)
	}
}

func streamConfig(ctx context.Context, t *testing.T, c *bus.Client, name string) jetstream.StreamConfig {
	t.Helper()
	s, err := c.JetStream().Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.Config
}

// Events of a type this version does not know (a newer worker's) are
// skipped by readers whatever their fields, and nothing stops.
func TestReadersIgnoreUnknownEventTypes(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	user := agent.UserText("q")
	answer := agent.Message{Role: agent.RoleAssistant, Content: []agent.Content{agent.Text("a")}, StopReason: agent.StopReasonStop}
	events := []any{
		bus.RunStarted{Type: bus.EventRunStarted, Protocol: "1.10", Attempt: 1, Tools: []string{}},
		bus.AgentEvent{Type: "message_end", Message: &user},
		// Fields that clash with the known events' types.
		map[string]any{"type": "tool_progress", "message": 5, "result": "half", "status": []int{1}},
		bus.AgentEvent{Type: "message_end", Message: &answer},
		map[string]any{"type": "run_paused", "attempt": "x"},
		bus.RunFinished{Type: bus.EventRunFinished, Status: bus.StatusSucceeded},
	}
	for i, ev := range events {
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		env := bus.Envelope{Run: "r1", Seq: uint64(i + 1), Attempt: 1, Worker: "w", TS: 1, Event: b}
		if _, err := c.JetStream().Publish(ctx, c.Names().Events("r1"), env.AppendJSON(nil)); err != nil {
			t.Fatal(err)
		}
	}
	var types []string
	for e, err := range c.Follow(ctx, "r1") {
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
		if _, err := e.Decode(); err != nil {
			t.Errorf("%s: %v", e.Type, err)
		}
		types = append(types, e.Type)
	}
	if len(types) != len(events) || types[len(types)-1] != bus.EventRunFinished {
		t.Fatalf("followed %v", types)
	}
	tr, err := c.LoadTranscript(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Done() || len(tr.Messages) != 2 || tr.FinalText() != "a" || tr.Started.Protocol != "1.10" {
		t.Fatalf("transcript: done %v, %d messages, %q, protocol %q", tr.Done(), len(tr.Messages), tr.FinalText(), tr.Started.Protocol)
	}
}

// A worker's byte limits are set where a stream has none, raise a smaller
// one, and never lower an operator's.
func TestEnsureStreamsByteLimits(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{NoStreams: true})
	ctx, c := fleettest.Context(t), f.Client
	n := c.Names()
	if _, err := c.JetStream().CreateStream(ctx, jetstream.StreamConfig{
		Name: n.ControlStream(), Subjects: []string{n.Control("*", bus.KindSteer)}, MaxBytes: 256 << 20,
	}); err != nil {
		t.Fatal(err)
	}
	cfg := bus.StreamsConfig{RequestsMaxBytes: 64 << 20, EventsMaxBytes: 128 << 20, ControlMaxBytes: 64 << 20}
	if err := c.EnsureStreams(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int64{n.RunsStream(): 64 << 20, n.EventsStream(): 128 << 20, n.ControlStream(): 256 << 20} {
		if got := streamConfig(ctx, t, c, name).MaxBytes; got != want {
			t.Errorf("%s: max bytes %d, want %d", name, got, want)
		}
	}
	// A worker started without the flags keeps them; a larger one raises.
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{EventsMaxBytes: 192 << 20}); err != nil {
		t.Fatal(err)
	}
	if got := streamConfig(ctx, t, c, n.RunsStream()).MaxBytes; got != 64<<20 {
		t.Errorf("runs: max bytes %d after a worker without the flag", got)
	}
	if got := streamConfig(ctx, t, c, n.EventsStream()).MaxBytes; got != 192<<20 {
		t.Errorf("events: max bytes %d, want raised to 192 MiB", got)
	}
}

// A control stream made by a 1.7 worker (discard new per subject: 1,024
// junk messages for a run id refused its owner's) keeps the newest once a
// 1.8 worker ensures it: the owner's abort is stored after a full subject.
func TestEnsureStreamsControlKeepsTheNewest(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{NoStreams: true})
	ctx, c := fleettest.Context(t), f.Client
	n := c.Names()
	subjects := make([]string, len(controlKinds))
	for i, k := range controlKinds {
		subjects[i] = n.Control("*", k)
	}
	if _, err := c.JetStream().CreateStream(ctx, jetstream.StreamConfig{
		Name: n.ControlStream(), Subjects: subjects, MaxMsgsPerSubject: bus.MaxControlsPerSubject,
		Discard: jetstream.DiscardNew, DiscardNewPerSubject: true,
	}); err != nil {
		t.Fatal(err)
	}
	junk := n.Control("future", bus.KindAbort)
	for i := range bus.MaxControlsPerSubject {
		if _, err := c.JetStream().Publish(ctx, junk, []byte(`{"reason":"junk"}`)); err != nil {
			t.Fatalf("junk %d: %v", i, err)
		}
	}
	if _, err := c.JetStream().Publish(ctx, junk, []byte(`{"reason":"owner"}`)); err == nil {
		t.Fatal("the 1.7 stream took a message past its per-subject cap")
	}
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	cfg := streamConfig(ctx, t, c, n.ControlStream())
	if cfg.DiscardNewPerSubject || cfg.MaxMsgsPerSubject != bus.MaxControlsPerSubject || cfg.Discard != jetstream.DiscardNew {
		t.Fatalf("control stream: discard new per subject %v, max per subject %d, discard %v",
			cfg.DiscardNewPerSubject, cfg.MaxMsgsPerSubject, cfg.Discard)
	}
	ack, err := c.JetStream().Publish(ctx, junk, []byte(`{"reason":"owner"}`))
	if err != nil {
		t.Fatalf("the owner's abort after 1,024 junk aborts: %v", err)
	}
	s, err := c.JetStream().Stream(ctx, n.ControlStream())
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.GetLastMsgForSubject(ctx, junk)
	if err != nil || last.Sequence != ack.Sequence {
		t.Fatalf("last abort stored: %v (want sequence %d)", err, ack.Sequence)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(junk))
	if err != nil || info.State.Subjects[junk] != bus.MaxControlsPerSubject {
		t.Fatalf("subject holds %v (%v), want the newest %d", info.State.Subjects, err, bus.MaxControlsPerSubject)
	}
}

// controlKinds lists every control kind, in the order streams list them.
var controlKinds = []string{bus.KindSteer, bus.KindFollowUp, bus.KindAbort, bus.KindApprove, bus.KindCompact}

// A parked-requests stream of a 1.9 fleet (no direct gets) allows them
// once a 1.10 worker ensures it (the waker's read of the kept copy), its
// kept copies kept.
func TestEnsureStreamsParkedAllowsDirectGets(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{NoStreams: true})
	ctx, c := fleettest.Context(t), f.Client
	n := c.Names()
	if _, err := c.JetStream().CreateStream(ctx, jetstream.StreamConfig{
		Name: n.ParkedStream(), Subjects: []string{n.ParkedAll(), n.ParkTimersAll()},
		AllowMsgSchedules: true, MaxMsgsPerSubject: 1,
	}); err != nil {
		t.Fatal(err)
	}
	ack, err := c.JetStream().Publish(ctx, n.Parked(bus.DefaultQueue, "r1"), []byte(`{"prompt":"kept"}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	if cfg := streamConfig(ctx, t, c, n.ParkedStream()); !cfg.AllowDirect || !cfg.AllowMsgSchedules {
		t.Fatalf("parked stream: allow direct %v, message schedules %v", cfg.AllowDirect, cfg.AllowMsgSchedules)
	}
	s, err := c.JetStream().Stream(ctx, n.ParkedStream())
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.GetMsg(ctx, ack.Sequence); err != nil || string(m.Data) != `{"prompt":"kept"}` {
		t.Fatalf("the kept copy by direct get after the update: %v", err)
	}
}
