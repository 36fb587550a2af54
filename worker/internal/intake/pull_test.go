package intake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// gatedDialer gives a connection whose reads wait while the gate is shut:
// what the server sends waits, as behind a stalled reader.
type gatedDialer struct {
	net.Dialer
	mu   sync.Mutex
	open chan struct{} // closed while reads may go on
}

func newGatedDialer() *gatedDialer {
	d := &gatedDialer{open: make(chan struct{})}
	close(d.open)
	return d
}

func (d *gatedDialer) shut() {
	d.mu.Lock()
	d.open = make(chan struct{})
	d.mu.Unlock()
}

func (d *gatedDialer) reopen() {
	d.mu.Lock()
	close(d.open)
	d.mu.Unlock()
}

func (d *gatedDialer) Dial(network, addr string) (net.Conn, error) {
	c, err := d.Dialer.Dial(network, addr)
	if err != nil {
		return nil, err
	}
	return gatedConn{c, d}, nil
}

type gatedConn struct {
	net.Conn
	d *gatedDialer
}

// Read holds what it read while the gate is shut: a read already waiting
// on the socket when the gate shuts is held too.
func (c gatedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.d.mu.Lock()
	open := c.d.open
	c.d.mu.Unlock()
	<-open
	return n, err
}

// pullFixture is a stream of requests with one pull consumer (AckWait 30 s,
// so a second delivery within a test is a hand-back, never a timeout) and
// a connection whose reads can be held.
type pullFixture struct {
	js   jetstream.JetStream
	cons jetstream.Consumer
	nc   *nats.Conn // the reader's, gated
	gate *gatedDialer
}

func newPullFixture(t *testing.T) *pullFixture {
	t.Helper()
	srv := startJetStream(t, 0)
	pub, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	js, err := jetstream.New(pub)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "REQ", Subjects: []string{"req.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, "REQ", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	gate := newGatedDialer()
	nc, err := nats.Connect(srv.ClientURL(), nats.SetCustomDialer(gate))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	rjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := rjs.Consumer(ctx, "REQ", "c")
	if err != nil {
		t.Fatal(err)
	}
	return &pullFixture{js: js, cons: cons, nc: nc, gate: gate}
}

func (f *pullFixture) publish(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range n {
		if _, err := f.js.Publish(ctx, fmt.Sprint("req.", i), []byte(fmt.Sprint("request ", i))); err != nil {
			t.Fatal(err)
		}
	}
}

// waitDelivered waits until the server has delivered every message to the
// reader (none left to deliver, n unacknowledged).
func (f *pullFixture) waitDelivered(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := f.js.Consumer(ctx, "REQ", "c")
		cancel()
		if err == nil {
			if i := info.CachedInfo(); i.NumPending == 0 && i.NumAckPending == n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not deliver %d messages", n)
		}
		time.Sleep(10 * time.Millisecond) // polling the server's state, not standing in for it
	}
}

// A reader that stalls longer than nats.go's fetch waited for its inbox (a
// second) still gets every message of its request, on first delivery:
// the loop's inbox outlives the stall.
func TestAStalledReaderGetsItsWholeRequest(t *testing.T) {
	f := newPullFixture(t)
	f.publish(t, 5)
	p, err := NewPuller(f.nc, f.cons)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.grace = 5 * time.Second // the stall is to outlast nats.go's second, not this
	f.gate.shut()
	type result struct {
		msgs []jetstream.Msg
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		// no_wait ends the request once the 5 are sent; a 2 s expiry, not
		// ShortWait's 5 ms, so a loaded server sends them all before it.
		_, r.err = p.Fetch(context.Background(), 8, 1<<20, 2*time.Second, func(m jetstream.Msg) { r.msgs = append(r.msgs, m) })
		done <- r
	}()
	f.waitDelivered(t, 5)
	// Past the second nats.go waited: the messages sit in the socket.
	stall := time.NewTimer(1500 * time.Millisecond)
	<-stall.C
	f.gate.reopen()
	r := <-done
	if r.err != nil || len(r.msgs) != 5 {
		t.Fatalf("got %d messages, err %v; want 5", len(r.msgs), r.err)
	}
	for i, m := range r.msgs {
		md, err := m.Metadata()
		if err != nil || md.NumDelivered != 1 || md.Sequence.Stream != uint64(i+1) || string(m.Data()) != fmt.Sprint("request ", i) {
			t.Fatalf("message %d: %q %+v %v", i, m.Data(), md, err)
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if n := p.handedBack.Load(); n != 0 {
		t.Fatalf("%d messages handed back", n)
	}
}

// A reader stalled well past the request's expiry and requestGrace (as
// behind a loaded machine's slow read side, the server's buffer full of
// what it sent before) still gets every message of its request, on first
// delivery: silence is not loss while what the server sent has not been
// read. The loop gave up after the grace and handed each message back:
// attempt 2 of runs never started (TestLargeRequestsAreFetchedWithinTheByteBound
// under load).
func TestAStalledReaderKeepsItsRequestPastTheGrace(t *testing.T) {
	f := newPullFixture(t)
	f.publish(t, 5)
	p := newPullerT(t, f.cons, f.nc)
	p.grace = 200 * time.Millisecond

	f.gate.shut()
	type result struct {
		msgs []jetstream.Msg
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		_, r.err = p.Fetch(context.Background(), 8, 1<<20, ShortWait, func(m jetstream.Msg) { r.msgs = append(r.msgs, m) })
		done <- r
	}()
	f.waitDelivered(t, 5)
	// The loop finds itself behind twice (two graces and two pings past
	// the expiry) while the messages sit in the socket.
	for p.behind.Load() < 2 {
		select {
		case r := <-done:
			f.gate.reopen()
			t.Fatalf("the request ended while its messages were on their way: %d messages, %v", len(r.msgs), r.err)
		case <-time.After(10 * time.Millisecond): // look at the count again
		}
	}
	f.gate.reopen()
	r := <-done
	if r.err != nil || len(r.msgs) != 5 {
		t.Fatalf("got %d messages, err %v; want 5", len(r.msgs), r.err)
	}
	for i, m := range r.msgs {
		if md, err := m.Metadata(); err != nil || md.NumDelivered != 1 || md.Sequence.Stream != uint64(i+1) {
			t.Fatalf("message %d: %+v %v", i, md, err)
		}
	}
	if n := p.handedBack.Load(); n != 0 {
		t.Fatalf("%d messages handed back", n)
	}
}

// A request no one answers (lost with a connection, or with a server that
// restarted without its shutdown's 409) is given up once the loop has read
// all the server sent before: the loop is not left waiting for an end that
// never comes.
func TestALostRequestIsGivenUp(t *testing.T) {
	f := newPullFixture(t)
	p := newPullerT(t, f.cons, f.nc)
	p.grace = 200 * time.Millisecond
	// The requests go to a subscriber that keeps them (no "no responders"
	// status either): none reaches the consumer.
	swallow, err := f.nc.SubscribeSync("lost.requests")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = swallow.Unsubscribe() })
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	p.subject = "lost.requests"
	got, err := p.Fetch(context.Background(), 1, 0, 300*time.Millisecond, func(jetstream.Msg) { t.Error("a message for a lost request") })
	if got != 0 || !errors.Is(err, errRequestLost) {
		t.Fatalf("got %d, err %v; want the request given up", got, err)
	}
	if _, err := swallow.NextMsg(time.Second); err != nil {
		t.Fatalf("the request was not sent: %v", err)
	}
}

// What reaches an inbox the loop moved on from (a request it gave up on
// that the server still held) is handed back at once, not left for
// AckWait (30 s here): the next request gets it again.
func TestALateMessageIsHandedBackAtOnce(t *testing.T) {
	f := newPullFixture(t)
	p := newPullerT(t, f.cons, f.nc)
	p.grace = time.Second

	// A request of the loop's current inbox the loop then leaves, the
	// server still holding it.
	if err := f.nc.PublishRequest(p.subject, p.inbox+".99", []byte(`{"batch":1,"expires":20000000000}`)); err != nil {
		t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := p.abandon(); err != nil {
		t.Fatal(err)
	}
	f.publish(t, 1)
	waitHandedBack(t, p, 1)
	var again []jetstream.Msg
	if _, err := p.Fetch(context.Background(), 1, 0, 10*time.Second, func(m jetstream.Msg) { again = append(again, m) }); err != nil || len(again) != 1 {
		t.Fatalf("next request: %d messages, %v", len(again), err)
	}
	md, err := again[0].Metadata()
	if err != nil || md.NumDelivered != 2 {
		t.Fatalf("redelivered %+v %v", md, err)
	}
}

// A message for an inbox the loop moved on from that is still on its way
// once nothing came for requestGrace (in the socket, behind a stalled
// reader) is read and handed back: the old inbox was dropped after the
// grace, and the message with it, to wait for AckWait (30 s here).
func TestALateMessageBehindAStalledReaderIsHandedBack(t *testing.T) {
	f := newPullFixture(t)
	p := newPullerT(t, f.cons, f.nc)
	p.grace = 200 * time.Millisecond

	if err := f.nc.PublishRequest(p.subject, p.inbox+".99", []byte(`{"batch":1,"expires":20000000000}`)); err != nil {
		t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := p.abandon(); err != nil {
		t.Fatal(err)
	}
	dropped := make(chan struct{})
	go func() { p.late.Wait(); close(dropped) }()
	f.gate.shut()
	f.publish(t, 1)
	f.waitDelivered(t, 1)
	for p.behind.Load() < 2 {
		select {
		case <-dropped:
			f.gate.reopen()
			t.Fatal("the old inbox was dropped with a message for it on its way")
		case <-time.After(10 * time.Millisecond): // look at the count again
		}
	}
	f.gate.reopen()
	waitHandedBack(t, p, 1)
	var again []jetstream.Msg
	if _, err := p.Fetch(context.Background(), 1, 0, 10*time.Second, func(m jetstream.Msg) { again = append(again, m) }); err != nil || len(again) != 1 {
		t.Fatalf("next request: %d messages, %v", len(again), err)
	}
	if md, err := again[0].Metadata(); err != nil || md.NumDelivered != 2 {
		t.Fatalf("redelivered %+v %v", md, err)
	}
}

// A stopping loop (its context done) does not wait on a stalled reader:
// its request is given up at the first silence past the expiry, and Close
// does not wait for the abandoned inbox to catch up. (A worker's stop
// waits for its loops.)
func TestAStoppingLoopDoesNotWaitOnAStalledReader(t *testing.T) {
	f := newPullFixture(t)
	f.publish(t, 2)
	p, err := NewPuller(f.nc, f.cons)
	if err != nil {
		t.Fatal(err)
	}
	p.grace = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.gate.shut()
	defer f.gate.reopen()
	type result struct {
		got int
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := p.Fetch(ctx, 8, 1<<20, ShortWait, func(jetstream.Msg) { t.Error("a message read through the stall") })
		done <- result{got, err}
	}()
	bound := time.NewTimer(20 * time.Second)
	defer bound.Stop()
	select {
	case r := <-done:
		if r.got != 0 || !errors.Is(r.err, errRequestLost) {
			t.Fatalf("got %d, err %v; want the request given up", r.got, r.err)
		}
	case <-bound.C:
		t.Fatal("a stopping loop's fetch waits on the stalled reader")
	}
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-bound.C:
		t.Fatal("Close waits on the stalled reader")
	}
}

func (f *pullFixture) consumer(t *testing.T, cfg jetstream.ConsumerConfig) jetstream.Consumer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg.AckPolicy, cfg.AckWait = jetstream.AckExplicitPolicy, 30*time.Second
	if _, err := f.js.CreateOrUpdateConsumer(ctx, "REQ", cfg); err != nil {
		t.Fatal(err)
	}
	cons, err := jetstream.New(f.nc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cons.Consumer(ctx, "REQ", cfg.Durable)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newPullerT(t *testing.T, cons jetstream.Consumer, nc *nats.Conn) *Puller {
	t.Helper()
	p, err := NewPuller(nc, cons)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// A short request whose messages fill max_bytes exactly ends at the last
// one (the server sends no status after it): the loop neither waits out
// the expiry and grace nor moves on as if the request were lost.
func TestAFetchThatFillsMaxBytesEndsThere(t *testing.T) {
	f := newPullFixture(t)
	f.publish(t, 3)
	// The first message's size as the server counts it, from a twin
	// consumer: the same subject and data, a reply of the same length.
	twin := newPullerT(t, f.consumer(t, jetstream.ConsumerConfig{Durable: "d"}), f.nc)
	size := 0
	if _, err := twin.Fetch(context.Background(), 1, 1<<20, time.Second, func(m jetstream.Msg) { size = m.(*pulledMsg).m.Size() }); err != nil || size == 0 {
		t.Fatalf("twin: size %d, %v", size, err)
	}
	p := newPullerT(t, f.cons, f.nc)
	p.grace = 5 * time.Second
	got, err := p.Fetch(context.Background(), 3, size, 5*time.Second, func(jetstream.Msg) {})
	if got != 1 || err != nil {
		t.Fatalf("got %d, err %v; want the one message that fills max_bytes", got, err)
	}
}

// At the consumer's MaxAckPending the server neither serves nor ends a
// no_wait request without an expiry: a short request has one, so it ends
// with nothing, and the message it could not take is still on its first
// delivery once there is room.
func TestAShortFetchAtMaxAckPendingEnds(t *testing.T) {
	f := newPullFixture(t)
	cons := f.consumer(t, jetstream.ConsumerConfig{Durable: "c", MaxAckPending: 1})
	f.publish(t, 2)
	p := newPullerT(t, cons, f.nc)
	p.grace = 5 * time.Second
	var held jetstream.Msg
	if got, err := p.Fetch(context.Background(), 1, 0, time.Second, func(m jetstream.Msg) { held = m }); got != 1 || err != nil {
		t.Fatalf("first: got %d, %v", got, err)
	}
	got, err := p.Fetch(context.Background(), 4, 1<<20, ShortWait, func(jetstream.Msg) { t.Error("a message past MaxAckPending") })
	if got != 0 || err != nil {
		t.Fatalf("at MaxAckPending: got %d, err %v; want the request ended empty", got, err)
	}
	if err := held.Ack(); err != nil {
		t.Fatal(err)
	}
	var next jetstream.Msg
	if got, err := p.Fetch(context.Background(), 1, 0, 10*time.Second, func(m jetstream.Msg) { next = m }); got != 1 || err != nil {
		t.Fatalf("after the ack: got %d, %v", got, err)
	}
	if md, err := next.Metadata(); err != nil || md.NumDelivered != 1 || md.Sequence.Stream != 2 {
		t.Fatalf("second message %+v %v", md, err)
	}
}

// A byte-bounded batch of one with bytes to spare is followed by a "409
// Batch Completed" on its own reply subject: the next request does not
// take it for its own end.
func TestAnEarlierRequestsStatusIsNotTheNextOnesEnd(t *testing.T) {
	f := newPullFixture(t)
	f.publish(t, 2)
	p := newPullerT(t, f.cons, f.nc)
	for i := range 2 {
		var data string
		got, err := p.Fetch(context.Background(), 1, 1<<20, time.Second, func(m jetstream.Msg) { data = string(m.Data()) })
		if got != 1 || err != nil || data != fmt.Sprint("request ", i) {
			t.Fatalf("request %d: got %d %q, %v", i, got, data, err)
		}
	}
}

// startJetStream starts an embedded nats-server with JetStream for the
// test; maxPending 0 keeps the server's default.
func startJetStream(t *testing.T, maxPending int64) *server.Server {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), MaxPending: maxPending, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	return srv
}

// waitHandedBack waits (20 s at most) until p has handed n late messages
// back.
func waitHandedBack(t *testing.T, p *Puller, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for p.handedBack.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d late messages handed back in 20 s, want %d", p.handedBack.Load(), n)
		}
		time.Sleep(10 * time.Millisecond) // look at the count again
	}
}
