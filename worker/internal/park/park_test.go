package park

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/natsembed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type testFleet struct {
	c   *bus.Client
	env *Env
	kv  jetstream.KeyValue
	ctl jetstream.Stream
}

// newTestFleet is the fleet's streams on an embedded server, and a
// worker's parking env on them.
func newTestFleet(t *testing.T) *testFleet {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx := testCtx(t)
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{Queues: []string{bus.DefaultQueue, "other"}}); err != nil {
		t.Fatal(err)
	}
	n := c.Names()
	js := c.JetStream()
	runs, err := js.Stream(ctx, n.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	parked, err := js.Stream(ctx, n.ParkedStream())
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := js.Stream(ctx, n.ControlStream())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	read := func(ctx context.Context, id string) (*bus.RunRecord, error) {
		e, err := kv.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		return bus.DecodeRecord(e)
	}
	env := &Env{JS: js, Names: n, Runs: runs, Parked: parked, Read: read, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	return &testFleet{c: c, env: env, kv: kv, ctl: ctl}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// park stores a request for run id, keeps it and writes a parked record,
// as a parking attempt does; it returns the request and the record.
func (f *testFleet) park(t *testing.T, id string, body []byte) (*jetstream.RawStreamMsg, *bus.RunRecord) {
	t.Helper()
	return f.parkDigest(t, id, body, false)
}

// parkDigest is park with the record's parked.digest (a 1.10 worker's
// park; "": a 1.9 worker's).
func (f *testFleet) parkDigest(t *testing.T, id string, body []byte, withDigest bool) (*jetstream.RawStreamMsg, *bus.RunRecord) {
	t.Helper()
	ctx := testCtx(t)
	res, err := f.c.SubmitRaw(ctx, "default", id, body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := f.env.Runs.GetMsg(ctx, res.Seq)
	if err != nil {
		t.Fatal(err)
	}
	seq, digest, err := f.env.Keep(ctx, "default", id, 1, req)
	if err != nil {
		t.Fatal(err)
	}
	if !withDigest {
		digest = "" // as a 1.9 worker parks
	}
	// Acknowledged: gone from the work queue.
	if err := f.env.Runs.DeleteMsg(ctx, res.Seq); err != nil {
		t.Fatal(err)
	}
	rec := &bus.RunRecord{ID: id, Queue: "default", State: bus.StateRunning, Attempt: 1, RequestSeq: res.Seq,
		Waiting: &bus.Waiting{For: bus.WaitingApproval}, Parked: &bus.Parked{At: time.Now(), Seq: seq, Attempt: 1, Digest: digest}}
	data, err := agent.MarshalJSON(rec)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Revision, err = f.kv.Create(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	return req, rec
}

// wakes returns the wake requests stored for run id.
func (f *testFleet) wakes(t *testing.T, id string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := testCtx(t)
	var out []*jetstream.RawStreamMsg
	for seq := uint64(1); ; {
		m, err := f.env.Runs.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(f.env.Names.Submit("default", id)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
		seq = m.Sequence + 1
	}
}

// A wake is a copy of the kept request with the park's headers; waking
// twice stores one (the dedupe), and the record confirms it: attempt
// base, the park; a copy with another body, or naming another park, is
// not confirmed.
func TestWakeIsConfirmedOnlyForItsPark(t *testing.T) {
	f := newTestFleet(t)
	ctx := testCtx(t)
	body := []byte(`{"prompt":"deploy"}`)
	_, rec := f.park(t, "r1", body)
	for range 2 {
		if err := f.env.Wake(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	wakes := f.wakes(t, "r1")
	if len(wakes) != 1 || string(wakes[0].Data) != string(body) || wakes[0].Header.Get(bus.HeaderWokenFrom) != strconv.FormatUint(rec.Parked.Seq, 10) {
		t.Fatalf("wakes %+v", wakes)
	}
	w := wakes[0]
	c, err := f.env.Confirm(ctx, "default", "r1", w.Sequence, w.Header, w.Data)
	if err != nil || !c.OK || c.Base != 1 || c.From != rec.Parked.Seq {
		t.Fatalf("confirm %+v %v", c, err)
	}
	if c, _ := f.env.Confirm(ctx, "default", "r1", w.Sequence, w.Header, []byte(`{"prompt":"other"}`)); !c.Wake || c.OK {
		t.Fatalf("another body confirmed: %+v", c)
	}
	h := nats.Header{}
	h.Set(bus.HeaderWokenFrom, strconv.FormatUint(rec.Parked.Seq+7, 10))
	h.Set(bus.HeaderAttemptBase, "1")
	if c, _ := f.env.Confirm(ctx, "default", "r1", w.Sequence, h, w.Data); c.OK {
		t.Fatalf("another park confirmed: %+v", c)
	}
	if c, _ := f.env.Confirm(ctx, "default", "r1", w.Sequence, nats.Header{}, w.Data); c.Wake {
		t.Fatalf("a plain request taken for a wake: %+v", c)
	}
}

// A message squatting the wake's Nats-Msg-Id does not keep the wake out.
// A record with parked.digest (1.10) confirms a wake by the digest of its
// bytes, without reading the kept copy (here removed after the wake was
// published), and hands the record it read to the pickup; another body
// is not confirmed. Without a digest (a 1.9 park) the copy is read: gone,
// nothing is confirmed.
func TestWakeIsConfirmedByTheParkedDigest(t *testing.T) {
	f := newTestFleet(t)
	ctx := testCtx(t)
	body := []byte(`{"prompt":"deploy"}`)
	for _, digest := range []bool{true, false} {
		id := "rd" + strconv.FormatBool(digest)
		_, rec := f.parkDigest(t, id, body, digest)
		if err := f.env.Wake(ctx, rec); err != nil {
			t.Fatal(err)
		}
		w := f.wakes(t, id)[0]
		if err := f.env.Parked.DeleteMsg(ctx, rec.Parked.Seq); err != nil {
			t.Fatal(err)
		}
		c, err := f.env.Confirm(ctx, "default", id, w.Sequence, w.Header, w.Data)
		if err != nil {
			t.Fatal(err)
		}
		if !digest {
			if c.OK {
				t.Fatalf("a 1.9 park confirmed without its kept copy: %+v", c)
			}
			continue
		}
		if !c.OK || c.Rec == nil || c.Rec.Parked == nil || c.Rec.Parked.Seq != rec.Parked.Seq || c.Rec.Revision != rec.Revision {
			t.Fatalf("confirm by digest %+v %v", c, err)
		}
		if c, _ := f.env.Confirm(ctx, "default", id, w.Sequence, w.Header, []byte(`{"prompt":"other"}`)); c.OK {
			t.Fatalf("another body confirmed by digest: %+v", c)
		}
		// The run's owner has the body: without the kept copy's wake key
		// (or with another) the body alone confirms nothing.
		for _, key := range []string{"", "guessed"} {
			h := nats.Header{}
			for k, v := range w.Header {
				h[k] = v
			}
			h.Del(bus.HeaderWakeKey)
			if key != "" {
				h.Set(bus.HeaderWakeKey, key)
			}
			if c, _ := f.env.Confirm(ctx, "default", id, w.Sequence, h, w.Data); c.OK {
				t.Fatalf("a wake with key %q confirmed by digest: %+v", key, c)
			}
		}
	}
}

func TestWakeSquattedByItsIDIsPublishedAnyway(t *testing.T) {
	f := newTestFleet(t)
	ctx := testCtx(t)
	_, rec := f.park(t, "r2", []byte(`{"prompt":"deploy"}`))
	m := &nats.Msg{Subject: f.env.Names.Submit("default", "r2"), Data: []byte(`{"prompt":"junk"}`), Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, "r2:wake:"+strconv.FormatUint(rec.Parked.Seq, 10))
	if _, err := f.c.JetStream().PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := f.env.Wake(ctx, rec); err != nil {
		t.Fatal(err)
	}
	confirmed := 0
	for _, w := range f.wakes(t, "r2") {
		if c, _ := f.env.Confirm(ctx, "default", "r2", w.Sequence, w.Header, w.Data); c.OK {
			confirmed++
		}
	}
	if confirmed != 1 {
		t.Fatalf("%d confirmed wakes, want 1", confirmed)
	}
}

// An approve or abort stored after what the parking attempt took is found
// (the parking attempt then wakes the run itself); none is not.
func TestAnswerAfter(t *testing.T) {
	f := newTestFleet(t)
	ctx := testCtx(t)
	n := f.env.Names
	pub := func(kind string) uint64 {
		ack, err := f.c.JetStream().Publish(ctx, n.Control("r3", kind), []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	steer := pub(bus.KindSteer)
	if got, err := f.env.AnswerAfter(ctx, f.ctl, "r3", 0, 0); err != nil || got {
		t.Fatalf("a steer counted as an answer: %v %v", got, err)
	}
	a := pub(bus.KindApprove)
	if got, _ := f.env.AnswerAfter(ctx, f.ctl, "r3", a-1, steer); !got {
		t.Fatal("an approve after the last taken not found")
	}
	if got, _ := f.env.AnswerAfter(ctx, f.ctl, "r3", a, steer); got {
		t.Fatal("an approve already taken found")
	}
	ab := pub(bus.KindAbort)
	if got, _ := f.env.AnswerAfter(ctx, f.ctl, "r3", a, ab-1); !got {
		t.Fatal("an abort after the last taken not found")
	}
}

// The wake consumer wakes a parked run for its answer, and nothing for a
// run that is not parked.
func TestWakeConsumerWakesParkedRuns(t *testing.T) {
	f := newTestFleet(t)
	ctx := testCtx(t)
	_, rec := f.park(t, "r4", []byte(`{"prompt":"deploy"}`))
	cons, err := f.c.JetStream().Consumer(ctx, f.env.Names.ControlStream(), f.env.Names.WakeConsumer())
	if err != nil {
		t.Fatal(err)
	}
	stop, err := f.env.Start(context.Background(), cons)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for _, id := range []string{"r4", "not-parked"} {
		if _, err := f.c.Answer(ctx, id, bus.ApprovalAnswer{ToolCallID: "c1", Decision: bus.DecisionApprove}); err != nil {
			t.Fatal(err)
		}
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.AckFloor.Stream >= 2 && info.NumAckPending == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond) // the consumer's state is all there is to wait on
	}
	if w := f.wakes(t, "r4"); len(w) != 1 || w[0].Header.Get(bus.HeaderWokenFrom) != strconv.FormatUint(rec.Parked.Seq, 10) {
		t.Fatalf("wakes of the parked run: %+v", w)
	}
	if w := f.wakes(t, "not-parked"); len(w) != 0 {
		t.Fatalf("a run that is not parked was woken: %+v", w)
	}
}

// A woken attempt parks the run again and dies before its request (the
// wake) is acknowledged: the redelivered wake is confirmed (it resumes
// the run, invariant 2), though the record names the newer park, not
// the one the wake's header names.
func TestRedeliveredWakeOfReparkedRunResumes(t *testing.T) {
	f := newTestFleet(t)
	ctx := testCtx(t)
	body := []byte(`{"prompt":"deploy"}`)
	_, rec := f.park(t, "r9", body)
	if err := f.env.Wake(ctx, rec); err != nil {
		t.Fatal(err)
	}
	w := f.wakes(t, "r9")[0]
	if c, err := f.env.Confirm(ctx, "default", "r9", w.Sequence, w.Header, w.Data); err != nil || !c.OK {
		t.Fatalf("confirm %+v %v", c, err)
	}
	// The woken attempt (2) holds the run, then parks it again: Keep, then
	// the record with its new park; its request (the wake) is not acked.
	seq2, _, err := f.env.Keep(ctx, "default", "r9", 2, w)
	if err != nil {
		t.Fatal(err)
	}
	rec2 := &bus.RunRecord{ID: "r9", Queue: "default", State: bus.StateRunning, Attempt: 2, RequestSeq: w.Sequence,
		Waiting: &bus.Waiting{For: bus.WaitingApproval}, Parked: &bus.Parked{At: time.Now(), Seq: seq2, Attempt: 2}}
	data, err := agent.MarshalJSON(rec2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.kv.Put(ctx, "r9", data); err != nil {
		t.Fatal(err)
	}
	c, err := f.env.Confirm(ctx, "default", "r9", w.Sequence, w.Header, w.Data)
	if err != nil {
		t.Fatal(err)
	}
	if !c.OK || c.Base != 1 || c.From != rec.Parked.Seq {
		t.Fatalf("redelivered wake of its own re-parked run not confirmed: %+v", c)
	}
	// A wake of the newer park published after the redelivery took the
	// lease (the record is the redelivery's, not parked) is dropped.
	if err := f.env.Wake(ctx, rec2); err != nil {
		t.Fatal(err)
	}
	rec3 := *rec2
	rec3.Attempt, rec3.Parked = 3, nil
	data, _ = agent.MarshalJSON(&rec3)
	if _, err := f.kv.Put(ctx, "r9", data); err != nil {
		t.Fatal(err)
	}
	wakes := f.wakes(t, "r9")
	if len(wakes) != 2 {
		t.Fatalf("%d wakes, want 2", len(wakes))
	}
	w2 := wakes[1]
	if c, err := f.env.Confirm(ctx, "default", "r9", w2.Sequence, w2.Header, w2.Data); err != nil || c.OK {
		t.Fatalf("a wake of a park the redelivery ended confirmed: %+v %v", c, err)
	}
}

// A wake copy published to another queue's submit subject (the kept
// request with the park's headers) is not confirmed: the run would move
// queues. On its own queue it is, with the kept copy's wake key only: the
// run's owner has the bytes, not the key.
func TestWakeOnAnotherQueueIsNotConfirmed(t *testing.T) {
	f := newTestFleet(t)
	ctx := testCtx(t)
	_, rec := f.park(t, "r10", []byte(`{"prompt":"deploy"}`))
	kept, err := f.env.Parked.GetMsg(ctx, rec.Parked.Seq)
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: f.env.Names.Submit("other", "r10"), Data: kept.Data, Header: nats.Header{}}
	m.Header.Set(bus.HeaderWokenFrom, strconv.FormatUint(rec.Parked.Seq, 10))
	m.Header.Set(bus.HeaderAttemptBase, "1")
	m.Header.Set(bus.HeaderWakeKey, kept.Header.Get(bus.HeaderWakeKey))
	ack, err := f.c.JetStream().PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := f.env.Confirm(ctx, "other", "r10", ack.Sequence, m.Header, m.Data); err != nil || !c.Wake || c.OK {
		t.Fatalf("a wake on another queue: %+v %v, want not confirmed", c, err)
	}
	if c, err := f.env.Confirm(ctx, "default", "r10", ack.Sequence, m.Header, m.Data); err != nil || !c.OK {
		t.Fatalf("the same wake on the run's queue: %+v %v, want confirmed", c, err)
	}
	if kept.Header.Get(bus.HeaderWakeKey) == "" {
		t.Fatal("the kept copy has no wake key")
	}
	for _, key := range []string{"", "guessed"} {
		h := nats.Header{}
		for k, v := range m.Header {
			h[k] = v
		}
		h.Set(bus.HeaderWakeKey, key)
		if c, err := f.env.Confirm(ctx, "default", "r10", ack.Sequence, h, m.Data); err != nil || c.OK {
			t.Fatalf("a wake with the kept bytes and key %q: %+v %v, want not confirmed", key, c, err)
		}
	}
}

// A kept copy's Agentfleet-Parked-State goes with its wakes, and the
// confirmation hands it on only while the record is parked with it as
// parked.state: a changed state, or a redelivery after the woken attempt
// took the run (it may have stored events since), hands on none.
func TestWakeCarriesTheParkedStateItsRecordNames(t *testing.T) {
	f := newTestFleet(t)
	ctx := testCtx(t)
	res, err := f.c.SubmitRaw(ctx, "default", "rs", []byte(`{"prompt":"deploy"}`))
	if err != nil {
		t.Fatal(err)
	}
	req, err := f.env.Runs.GetMsg(ctx, res.Seq)
	if err != nil {
		t.Fatal(err)
	}
	const state = "c3RhdGU="
	seq, digest, err := f.env.KeepState(ctx, "default", "rs", 1, req, state)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.env.Runs.DeleteMsg(ctx, res.Seq); err != nil {
		t.Fatal(err)
	}
	rec := &bus.RunRecord{ID: "rs", Queue: "default", State: bus.StateRunning, Attempt: 1, RequestSeq: res.Seq,
		Waiting: &bus.Waiting{For: bus.WaitingApproval},
		Parked:  &bus.Parked{At: time.Now(), Seq: seq, Attempt: 1, Digest: digest, State: bus.StateDigest(state)}}
	data, err := agent.MarshalJSON(rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.kv.Create(ctx, "rs", data); err != nil {
		t.Fatal(err)
	}
	if err := f.env.Wake(ctx, rec); err != nil {
		t.Fatal(err)
	}
	w := f.wakes(t, "rs")[0]
	if got := w.Header.Get(bus.HeaderParkedState); got != state {
		t.Fatalf("wake's state %q", got)
	}
	if c, err := f.env.Confirm(ctx, "default", "rs", w.Sequence, w.Header, w.Data); err != nil || !c.OK || c.State != state {
		t.Fatalf("confirm %+v %v", c, err)
	}
	h := nats.Header{}
	for k, v := range w.Header {
		h[k] = v
	}
	h.Set(bus.HeaderParkedState, "b3RoZXI=")
	if c, err := f.env.Confirm(ctx, "default", "rs", w.Sequence, h, w.Data); err != nil || !c.OK || c.State != "" {
		t.Fatalf("a state parked.state does not name handed on: %+v %v", c, err)
	}
	// The woken attempt took the run: its redelivery reads the events.
	rec2 := *rec
	rec2.Attempt, rec2.RequestSeq, rec2.Parked = 2, w.Sequence, nil
	data, _ = agent.MarshalJSON(&rec2)
	if _, err := f.kv.Put(ctx, "rs", data); err != nil {
		t.Fatal(err)
	}
	if c, err := f.env.Confirm(ctx, "default", "rs", w.Sequence, w.Header, w.Data); err != nil || !c.OK || c.State != "" {
		t.Fatalf("a redelivery handed the state on: %+v %v", c, err)
	}
}
