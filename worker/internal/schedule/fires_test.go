package schedule

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type counts struct{ fired, skipped int }

func (c *counts) ScheduleFired(time.Duration) { c.fired++ }
func (c *counts) ScheduleSkipped(string)      { c.skipped++ }

// A fire handled twice (a redelivery; two workers) stores one request:
// the run id is the hash of its planned time, and the second submit is
// the work queue's duplicate (overlap allow: the dedupe alone keeps it
// single). No worker pulls here: the test takes the
// server's fire itself.
func TestFireHandledTwiceStoresOneRequest(t *testing.T) {
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir(), MaxMemory: 64 << 20, MaxStore: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	f := struct{ Client *bus.Client }{c}
	req := json.RawMessage(`{"model":"faux/x","prompt":"tick","faux":{"responses":[{"content":[{"type":"text","text":"tock"}]}]}}`)
	if _, err := f.Client.CreateSchedule(ctx, &bus.Schedule{Name: "twice", Queue: bus.DefaultQueue, Every: "1s", Request: req,
		Overlap: bus.OverlapAllow}, false); err != nil {
		t.Fatal(err)
	}
	cons, err := f.Client.JetStream().Consumer(ctx, f.Client.Names().SchedulesStream(), f.Client.Names().FiresConsumer())
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var m jetstream.Msg
	for m = range batch.Messages() {
	}
	if m == nil {
		t.Fatalf("no fire in 10 s: %v", batch.Error())
	}
	obs := &counts{}
	env := &Env{Client: f.Client, Log: slog.New(slog.DiscardHandler), Obs: obs}
	env.Handle(ctx, m)
	env.Handle(ctx, m)
	runs, err := f.Client.JetStream().Stream(ctx, f.Client.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := runs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 || obs.fired != 1 {
		t.Fatalf("%d requests stored, %d fires counted; want 1 and 1", info.State.Msgs, obs.fired)
	}
	last, err := f.Client.LastScheduleRun(ctx, bus.DefaultQueue, "twice")
	if err != nil || last == nil {
		t.Fatalf("last run: %v %v", last, err)
	}
	if want := bus.ScheduleRunID(bus.DefaultQueue, "twice", last.PlannedAt, false); last.Run != want {
		t.Errorf("run %s, want the hash of its planned time %s", last.Run, want)
	}
	if err := f.Client.PauseSchedule(ctx, "twice"); err != nil {
		t.Fatal(err)
	}
}
