package bus

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/natsembed"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// stuckIter passes through its first message, then never delivers again:
// nats.go's ordered consumer after some NATS restarts.
type stuckIter struct {
	jetstream.MessagesContext
	n       int
	stopped chan struct{}
	once    sync.Once
}

func (s *stuckIter) Next(opts ...jetstream.NextOpt) (jetstream.Msg, error) {
	if s.n < 1 {
		s.n++
		return s.MessagesContext.Next(opts...)
	}
	<-s.stopped
	return nil, jetstream.ErrMsgIteratorClosed
}

func (s *stuckIter) Stop() {
	s.once.Do(func() { close(s.stopped) })
	s.MessagesContext.Stop()
}

// ownServerClient is a client on its own embedded server with the
// streams, and a context that ends with the test (3 minutes at most: only
// a guard against a hang; a test storing a few hundred records on a
// loaded machine took over a minute).
func ownServerClient(t *testing.T) (context.Context, *Client) {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	c, err := Connect(ctx, ConnectOptions{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.EnsureStreams(ctx, StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	return ctx, c
}

func stallClient(t *testing.T) (context.Context, *Client, func(seq uint64, ev any)) {
	t.Helper()
	ctx, c := ownServerClient(t)
	c.SetFollowStall(50 * time.Millisecond)
	pub := func(seq uint64, ev any) {
		b, _ := json.Marshal(ev)
		if _, err := c.JetStream().Publish(ctx, c.names.Events("r"), (&Envelope{Run: "r", Seq: seq, Attempt: 1, Worker: "w", TS: 1, Event: b}).AppendJSON(nil)); err != nil {
			t.Error(err)
		}
	}
	return ctx, c, pub
}

// stallFirstConsumer makes the first follow consumer go silent; later ones
// deliver. It counts the consumers opened.
func stallFirstConsumer(c *Client) *atomic.Int32 {
	wraps := new(atomic.Int32)
	c.wrapFollow = func(it jetstream.MessagesContext) jetstream.MessagesContext {
		if wraps.Add(1) > 1 {
			return it
		}
		return &stuckIter{MessagesContext: it, stopped: make(chan struct{})}
	}
	return wraps
}

// A consumer that goes silent while the run's events are stored is
// replaced by one starting after the last delivered event: every event
// arrives once, in order.
func TestFollowReplacesAStalledConsumer(t *testing.T) {
	t.Parallel()
	ctx, c, pub := stallClient(t)
	wraps := stallFirstConsumer(c)
	pub(1, RunStarted{Type: EventRunStarted, Attempt: 1})
	pub(2, AgentEvent{Type: "agent_start"})
	pub(3, AgentEvent{Type: "agent_end"})
	pub(4, RunFinished{Type: EventRunFinished, Status: StatusSucceeded})
	var got []uint64
	for e, err := range c.Follow(ctx, "r") {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Seq)
	}
	if len(got) != 4 || got[0] != 1 || got[1] != 2 || got[2] != 3 || got[3] != 4 {
		t.Fatalf("got seqs %v, want [1 2 3 4]", got)
	}
	if n := wraps.Load(); n != 2 {
		t.Fatalf("%d consumers opened, want 2", n)
	}
}

// A follower of an idle run, and one whose loop body is slow, keep their
// consumer: only a consumer that missed stored events is replaced.
func TestFollowKeepsAHealthyConsumer(t *testing.T) {
	t.Parallel()
	ctx, c, pub := stallClient(t)
	// Stalled means two whole intervals in Next with a stored event not
	// delivered. At 50 ms a loaded CI (two suites on 2 cores) once kept
	// the follower's goroutine from running that long, and its healthy
	// consumer was replaced; this test pins the rule, not a latency.
	c.SetFollowStall(250 * time.Millisecond)
	var wraps atomic.Int32
	c.wrapFollow = func(it jetstream.MessagesContext) jetstream.MessagesContext {
		wraps.Add(1)
		return it
	}
	pub(1, RunStarted{Type: EventRunStarted, Attempt: 1})
	pub(2, AgentEvent{Type: "agent_start"})
	var got []uint64
	var wg sync.WaitGroup
	defer wg.Wait()
	for e, err := range c.Follow(ctx, "r") {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Seq)
		switch e.Seq {
		case 1:
			// A slow body: many stall intervals outside Next.
			time.Sleep(10 * c.followStall)
		case 2:
			// An idle run: the watch looks (and finds nothing missed)
			// while the follower waits, before the next event is stored.
			wg.Go(func() {
				waitLooks(t, c, 3)
				pub(3, RunFinished{Type: EventRunFinished, Status: StatusSucceeded})
			})
		}
	}
	if len(got) != 3 {
		t.Fatalf("got seqs %v, want [1 2 3]", got)
	}
	if n := wraps.Load(); n != 1 {
		t.Fatalf("%d consumers opened, want 1", n)
	}
}

// waitLooks waits until the stall watch has asked the stream n more times.
func waitLooks(t *testing.T, c *Client, n int64) {
	start := c.stallLooks.Load()
	deadline := time.Now().Add(30 * time.Second)
	for c.stallLooks.Load() < start+n {
		if time.Now().After(deadline) {
			t.Errorf("the stall watch looked %d times, want %d", c.stallLooks.Load()-start, n)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// While the stream cannot be asked (NATS away), the watch asks again as
// often as before: it backs off only after answers that found nothing
// missed, so a consumer that stalled in an outage is replaced soon after.
func TestFollowStallChecksKeepTheirPaceWhileNATSIsAway(t *testing.T) {
	t.Parallel()
	ctx, c, pub := stallClient(t)
	stallFirstConsumer(c)
	var mu sync.Mutex
	var ticks []int64
	c.lookLast = func(ctx context.Context, runID string) (uint64, error) {
		mu.Lock()
		defer mu.Unlock()
		ticks = append(ticks, c.stallTicks.Load())
		if len(ticks) <= 5 {
			return 0, nats.ErrTimeout
		}
		return c.lastEventSeq(ctx, runID)
	}
	pub(1, RunStarted{Type: EventRunStarted, Attempt: 1})
	pub(2, RunFinished{Type: EventRunFinished, Status: StatusSucceeded})
	n := 0
	for _, err := range c.Follow(ctx, "r") {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	mu.Lock()
	defer mu.Unlock()
	if n != 2 || len(ticks) != 6 {
		t.Fatalf("%d events after %d looks, want 2 after 6", n, len(ticks))
	}
	for i := 1; i < len(ticks); i++ {
		if d := ticks[i] - ticks[i-1]; d != 2 {
			t.Fatalf("looks at ticks %v: every 2 ticks wanted", ticks)
		}
	}
}

// A follower whose consumer is making itself again (its stream gone, so
// for ever) ends when its ctx does: nats.go's Next does not look at ctx
// then.
func TestFollowEndsOnCancelWhileItsConsumerResets(t *testing.T) {
	t.Parallel()
	ctx, c, pub := stallClient(t)
	c.SetFollowStall(time.Hour) // the watch stays out of it
	creates := make(chan struct{}, 100)
	sub, err := c.nc.Subscribe("$JS.API.CONSUMER.CREATE."+c.names.EventsStream()+".>", func(*nats.Msg) { creates <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	pub(1, RunStarted{Type: EventRunStarted, Attempt: 1})
	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	got := make(chan error, 10)
	go func() {
		defer close(got)
		for _, err := range c.Follow(fctx, "r") {
			got <- err
		}
	}()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	<-creates // the follow's own
	if err := c.js.DeleteStream(ctx, c.names.EventsStream()); err != nil {
		t.Fatal(err)
	}
	<-creates // the consumer resetting: its first attempt
	<-creates // and its second (it retries for ever)
	fcancel()
	select {
	case err := <-got:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("follow ended with %v, want context.Canceled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the follow went on 20 s after its ctx ended")
	}
}

// A consumer create request that is lost (sent as the server went down)
// is sent again: the follow does not wait for its ctx to end.
func TestFollowRetriesALostConsumerCreate(t *testing.T) {
	t.Parallel()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A JetStream API under another prefix that, once armed, drops the
	// first consumer create and passes everything else on, replies included.
	var armed atomic.Bool
	var createsSeen atomic.Int32
	proxy, err := nc.Subscribe("$JSX.API.>", func(m *nats.Msg) {
		api := strings.TrimPrefix(m.Subject, "$JSX.API.")
		if armed.Load() && strings.HasPrefix(api, "CONSUMER.CREATE.") && createsSeen.Add(1) == 1 {
			return
		}
		target := "$JS.API." + api
		if strings.HasPrefix(api, "$KV.") {
			// A KV put under the prefix (EnsureStreams' declared queues
			// since 1.10): the bucket's own subject.
			target = api
		}
		_ = nc.PublishMsg(&nats.Msg{Subject: target, Reply: m.Reply, Header: m.Header, Data: m.Data})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Unsubscribe()
	c, err := NewClient(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.js, err = jetstream.NewWithAPIPrefix(nc, "$JSX.API"); err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureStreams(ctx, StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	c.SetFollowStall(50 * time.Millisecond) // one create attempt: 2 s
	for seq, ev := range []any{RunStarted{Type: EventRunStarted, Attempt: 1}, RunFinished{Type: EventRunFinished, Status: StatusSucceeded}} {
		b, _ := json.Marshal(ev)
		if _, err := c.js.Publish(ctx, c.names.Events("r"), (&Envelope{Run: "r", Seq: uint64(seq + 1), Attempt: 1, Worker: "w", TS: 1, Event: b}).AppendJSON(nil)); err != nil {
			t.Fatal(err)
		}
	}
	armed.Store(true)
	n := 0
	for _, err := range c.Follow(ctx, "r") {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 2 || createsSeen.Load() != 2 {
		t.Fatalf("%d events after %d consumer creates, want 2 after 2", n, createsSeen.Load())
	}
}

// Following a run that does not exist ends with ErrRunNotFound instead of
// waiting for ever, at once or, for a queued run whose request goes away
// without events, at the watch's next look; a queued run is followed
// until its events come.
func TestFollowNoSuchRun(t *testing.T) {
	t.Parallel()
	ctx, c, pub := stallClient(t)
	follow := func(run string) <-chan error {
		done := make(chan error, 1)
		go func() {
			var last error
			for _, err := range c.Follow(ctx, run) {
				last = err
			}
			done <- last
		}()
		return done
	}
	notFound := func(done <-chan error, run string) {
		t.Helper()
		if err := <-done; !errors.Is(err, ErrRunNotFound) || !strings.Contains(err.Error(), "follow "+run+": run not found") {
			t.Fatalf("follow %s ended with %v, want ErrRunNotFound", run, err)
		}
	}
	notFound(follow("nobody"), "nobody")

	res, err := c.SubmitRaw(ctx, "", "q", []byte(`{"prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	gone := follow("q")
	waitLooks(t, c, 2) // it has looked, found the request, and follows on
	select {
	case err := <-gone:
		t.Fatalf("following a queued run ended: %v", err)
	default:
	}
	runs, err := c.Stream(ctx, c.names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	if err := runs.DeleteMsg(ctx, res.Seq); err != nil { // e.g. an operator's, or the week's max age
		t.Fatal(err)
	}
	notFound(gone, "q")

	if _, err := c.SubmitRaw(ctx, "", "r", []byte(`{"prompt":"hi"}`)); err != nil {
		t.Fatal(err)
	}
	queued := follow("r")
	waitLooks(t, c, 2)
	pub(1, RunStarted{Type: EventRunStarted, Attempt: 1})
	pub(2, RunFinished{Type: EventRunFinished, Status: StatusSucceeded})
	if err := <-queued; err != nil {
		t.Fatalf("following a queued run: %v", err)
	}
}

// A finished run whose events are no longer stored (aged out, or dropped
// by the events stream's byte limit) while its record remains: Follow
// ends with ErrEventsGone, saying how the run ended, instead of waiting
// for events that will never come.
func TestFollowFinishedRunWithoutEvents(t *testing.T) {
	t.Parallel()
	ctx, c, pub := stallClient(t)
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(RunRecord{ID: "old", Queue: "default", State: StatusSucceeded, Attempt: 1})
	if _, err := kv.Put(ctx, "old", b); err != nil {
		t.Fatal(err)
	}
	var last error
	for _, err := range c.Follow(ctx, "old") {
		last = err
	}
	if !errors.Is(last, ErrEventsGone) || !strings.Contains(last.Error(), "follow old: run finished (succeeded) but its events are no longer stored") {
		t.Fatalf("follow ended with %v, want ErrEventsGone", last)
	}
	// A finished run whose events are there is followed to its end.
	if _, err := kv.Put(ctx, "r", b); err != nil {
		t.Fatal(err)
	}
	pub(1, RunStarted{Type: EventRunStarted, Attempt: 1})
	pub(2, RunFinished{Type: EventRunFinished, Status: StatusSucceeded})
	n := 0
	for _, err := range c.Follow(ctx, "r") {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 2 {
		t.Fatalf("%d events, want 2", n)
	}
}

// The watch's looks and its ending of the follower are not one step: a
// run's first event stored after the second look found nothing is
// delivered, and then the follower goes on to the run's end instead of
// ending with ErrRunNotFound (the watch ends only a follower that has
// delivered nothing).
func TestFollowDeliversAndNeverThenEndsNotFound(t *testing.T) {
	t.Parallel()
	ctx, c, pub := stallClient(t)
	delivered := make(chan struct{})
	var once sync.Once
	called := false
	c.beforeEnd = func(string) {
		once.Do(func() {
			called = true
			pub(1, RunStarted{Type: EventRunStarted, Attempt: 1})
			<-delivered // the follower has taken it
		})
	}
	var got []uint64
	for e, err := range c.Follow(ctx, "r") {
		if err != nil {
			t.Fatalf("follow: %v after seqs %v", err, got)
		}
		got = append(got, e.Seq)
		if e.Seq == 1 {
			close(delivered)
			pub(2, RunFinished{Type: EventRunFinished, Status: StatusSucceeded})
		}
	}
	if len(got) != 2 || !called {
		t.Fatalf("got seqs %v, want [1 2] (the watch about to end the follower: %v)", got, called)
	}
}
