package schedule

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
)

// A worker whose clock runs 2 min ahead of the server's runs an on-time
// fire of a catch-up-none schedule: lateness is judged by the server's
// clock (review 57b #3).
func TestFireOnTimeWithWorkerClockAhead(t *testing.T) {
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
	req := json.RawMessage(`{"model":"faux/x","prompt":"tick","faux":{"responses":[{"content":[{"type":"text","text":"tock"}]}]}}`)
	op(ctx, t, c, bus.DefaultQueue, "skew", bus.ScheduleOpCreate, &bus.Schedule{Name: "skew", Queue: bus.DefaultQueue, Every: "1s", Request: req,
		Overlap: bus.OverlapAllow, CatchUp: bus.CatchUpNone})
	cons, err := c.JetStream().Consumer(ctx, c.Names().SchedulesStream(), c.Names().FiresConsumer())
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
		t.Fatalf("no fire: %v", batch.Error())
	}
	obs := &counts{}
	env := &Env{Client: c, Log: slog.New(slog.DiscardHandler), Obs: obs, Now: func() time.Time { return time.Now().Add(2 * time.Minute) }}
	env.Handle(ctx, m)
	if obs.fired != 1 {
		t.Errorf("an on-time fire (first delivery) on a worker 2 min ahead: fired %d, skipped %d; want fired 1", obs.fired, obs.skipped)
	}
	op(ctx, t, c, bus.DefaultQueue, "skew", bus.ScheduleOpPause, nil)
}

// A fire is the outage's only when a planned time was missed: an @every
// fire the server re-anchored at restart + interval after a short restart
// in mid-interval is not (review 57b #2).
func TestMissedPlanned(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 22, 14, 42, 0, time.UTC) // the previous fire's next
	every6 := &bus.Schedule{Every: "6s"}
	every1 := &bus.Schedule{Every: "1s"}
	cron := &bus.Schedule{Cron: "*/6 * * * * *"}
	for _, c := range []struct {
		name   string
		s      *bus.Schedule
		stored time.Duration // after t0
		want   bool
	}{
		{"every on time", every6, 10 * time.Millisecond, false},
		{"every re-anchored, restart before next", every6, 3 * time.Second, false},
		{"every re-anchored, restart just before next", every6, 5900 * time.Millisecond, false},
		{"every restart after next", every6, 7 * time.Second, true},
		{"every 1s, 5s outage", every1, 5500 * time.Millisecond, true},
		{"every 1s, short delay", every1, 1500 * time.Millisecond, false},
		{"cron on time", cron, 10 * time.Millisecond, false},
		{"cron after an outage", cron, 3 * time.Second, true},
	} {
		if got := missedPlanned(c.s, t0, t0.Add(c.stored)); got != c.want {
			t.Errorf("%s: missedPlanned %v, want %v", c.name, got, c.want)
		}
	}
	if missedPlanned(every6, time.Time{}, t0) {
		t.Error("no previous next: missedPlanned true")
	}
}
