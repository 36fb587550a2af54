package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// op does a schedule operation as a worker answering it would (no worker
// runs here).
func op(ctx context.Context, t *testing.T, c *bus.Client, queue, name, what string, s *bus.Schedule) {
	t.Helper()
	body := []byte("{}")
	if s != nil {
		var err error
		if body, err = json.Marshal(s); err != nil {
			t.Fatal(err)
		}
	}
	if r := c.ApplyScheduleOp(ctx, queue, name, what, body); r.Code != "" {
		t.Fatalf("schedule %s: %s: %s %v", name, what, r.Error, r.Problems)
	}
}

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
	op(ctx, t, f.Client, bus.DefaultQueue, "twice", bus.ScheduleOpCreate, &bus.Schedule{Name: "twice", Queue: bus.DefaultQueue, Every: "1s", Request: req,
		Overlap: bus.OverlapAllow})
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
	op(ctx, t, f.Client, bus.DefaultQueue, "twice", bus.ScheduleOpPause, nil)
}

// Review 57, finding 4: fire k submits but fails to record its last run
// and is retried after fire k+1 ran. Under overlap abort the retry must
// not abort the newer run k+1, nor set the last run back to k.
func TestFireRetriedAfterANewerOneLeavesIt(t *testing.T) {
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
	op(ctx, t, c, bus.DefaultQueue, "retried", bus.ScheduleOpCreate, &bus.Schedule{Name: "retried", Queue: bus.DefaultQueue, Every: "1s", Request: req,
		Overlap: bus.OverlapAbort})
	cons, err := c.JetStream().Consumer(ctx, c.Names().SchedulesStream(), c.Names().FiresConsumer())
	if err != nil {
		t.Fatal(err)
	}
	var fires []jetstream.Msg
	for len(fires) < 2 {
		batch, err := cons.Fetch(2-len(fires), jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			fires = append(fires, m)
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
	}
	failing := &Env{Client: c, Log: slog.New(slog.DiscardHandler), Late: time.Hour,
		setLast: func(context.Context, string, string, bus.ScheduleLast) error { return errors.New("injected") }}
	env := &Env{Client: c, Log: slog.New(slog.DiscardHandler), Late: time.Hour}
	failing.Handle(ctx, fires[0]) // k: submitted, last run not recorded
	env.Handle(ctx, fires[1])     // k+1: k is not known, so k+1 runs
	env.Handle(ctx, fires[0])     // k again
	last, err := c.LastScheduleRun(ctx, bus.DefaultQueue, "retried")
	if err != nil || last == nil {
		t.Fatalf("last run: %v %v", last, err)
	}
	newer := newestRun(t, c, "retried")
	if last.Run != newer {
		t.Errorf("last run %s, want the newer fire's %s", last.Run, newer)
	}
	ctl, err := c.JetStream().Stream(ctx, c.Names().ControlStream())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.GetLastMsgForSubject(ctx, c.Names().Control(newer, bus.KindAbort)); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the newer run %s was aborted (%v)", newer, err)
	}
	op(ctx, t, c, bus.DefaultQueue, "retried", bus.ScheduleOpPause, nil)
}

// newestRun is the id of the request with the newest scheduledFor.
func newestRun(t *testing.T, c *bus.Client, name string) string {
	t.Helper()
	ctx := context.Background()
	runs, err := c.JetStream().Stream(ctx, c.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := runs.Info(ctx, jetstream.WithSubjectFilter(c.Names().SubmitAll()))
	if err != nil {
		t.Fatal(err)
	}
	var id, at string
	for subj := range info.State.Subjects {
		m, err := runs.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			t.Fatal(err)
		}
		var r bus.RunRequest
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		if r.Metadata[bus.MetaSchedule] == name && r.Metadata[bus.MetaScheduledFor] > at {
			id, at = r.ID, r.Metadata[bus.MetaScheduledFor]
		}
	}
	return id
}

// delayed is a fire whose NumDelivered is set and whose NAK delay is kept.
type delayed struct {
	jetstream.Msg
	delivered uint64
	nak       time.Duration
	termed    bool
}

func (d *delayed) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := d.Msg.Metadata()
	if err == nil {
		md.NumDelivered = d.delivered
	}
	return md, err
}

func (d *delayed) NakWithDelay(delay time.Duration) error { d.nak = delay; return nil }
func (d *delayed) Term() error                            { d.termed = true; return nil }

// Review 57, finding 7: a fire that keeps failing (a queue no worker
// declared) backs off by its deliveries instead of coming every second.
func TestFireFailingBacksOff(t *testing.T) {
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
	op(ctx, t, c, "undeclared", "nowhere", bus.ScheduleOpCreate, &bus.Schedule{Name: "nowhere", Queue: "undeclared", Every: "1s", Request: req})
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
		t.Fatalf("no fire in 10 s: %v", batch.Error())
	}
	env := &Env{Client: c, Log: slog.New(slog.DiscardHandler), Late: time.Hour}
	for _, tc := range []struct {
		delivered uint64
		want      time.Duration
	}{{1, time.Second}, {3, 4 * time.Second}, {bus.FireMaxDeliver - 1, time.Minute}} {
		d := &delayed{Msg: m, delivered: tc.delivered}
		env.Handle(ctx, d)
		if d.nak != tc.want {
			t.Errorf("delivery %d: NAK delay %s, want %s", tc.delivered, d.nak, tc.want)
		}
	}
	// Its last delivery: given up (terminated, counted failed), not
	// handed back for the consumer's MaxDeliver to drop unseen.
	obs := &counts{}
	env.Obs = obs
	d := &delayed{Msg: m, delivered: bus.FireMaxDeliver}
	env.Handle(ctx, d)
	if !d.termed || d.nak != 0 || obs.skipped != 1 {
		t.Errorf("delivery %d: terminated %v, NAK delay %s, %d skips counted; want given up", bus.FireMaxDeliver, d.termed, d.nak, obs.skipped)
	}
	op(ctx, t, c, "undeclared", "nowhere", bus.ScheduleOpPause, nil)
}

// Review 57, finding 11: a fire's body is checked as a create checks it:
// an unknown overlap or an unknown request field is invalid, not read as
// abort or dropped.
func TestFireBodyIsValidated(t *testing.T) {
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
	req := json.RawMessage(`{"model":"faux/x","prompt":"tick"}`)
	op(ctx, t, c, bus.DefaultQueue, "odd", bus.ScheduleOpCreate, &bus.Schedule{Name: "odd", Queue: bus.DefaultQueue, Every: "1h", Paused: true, Request: req})
	cons, err := c.JetStream().Consumer(ctx, c.Names().SchedulesStream(), c.Names().FiresConsumer())
	if err != nil {
		t.Fatal(err)
	}
	for i, body := range []string{
		`{"name":"odd","queue":"default","every":"1h","overlap":"sometimes","request":{"model":"faux/x","prompt":"tick"}}`,
		`{"name":"odd","queue":"default","every":"1h","overlap":"allow","request":{"model":"faux/x","prompt":"tick","promtp":"typo"}}`,
	} {
		m := nats.NewMsg(c.Names().ScheduleFire(bus.DefaultQueue, "odd"))
		m.Data = []byte(body)
		m.Header.Set(bus.HeaderScheduleTrigger, time.Now().UTC().Add(time.Duration(i)*time.Second).Format(time.RFC3339Nano))
		if _, err := c.JetStream().PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var fire jetstream.Msg
		for fire = range batch.Messages() {
		}
		if fire == nil {
			t.Fatalf("no fire in 10 s: %v", batch.Error())
		}
		obs := &counts{}
		(&Env{Client: c, Log: slog.New(slog.DiscardHandler), Obs: obs}).Handle(ctx, fire)
		if obs.skipped != 1 || obs.fired != 0 {
			t.Errorf("fire %d: %d skipped, %d fired; want it refused", i, obs.skipped, obs.fired)
		}
	}
	runs, err := c.JetStream().Stream(ctx, c.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := runs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Errorf("%d requests stored, want none", info.State.Msgs)
	}
}
