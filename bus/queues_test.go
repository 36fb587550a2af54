package bus_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// Only declared queues take requests: one for a queue no worker declared is
// refused at once instead of being kept for a week (also invalid tokens).
func TestUndeclaredQueuesAreRefused(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default", "batch"}}})
	ctx, c := fleettest.Context(t), f.Client
	if _, err := c.SubmitRaw(ctx, "batch", "r1", []byte(`{"prompt":"x"}`)); err != nil {
		t.Fatalf("declared queue: %v", err)
	}
	_, err := c.SubmitRaw(ctx, "nobody", "r2", []byte(`{"prompt":"x"}`))
	if !errors.Is(err, bus.ErrUnknownQueue) {
		t.Fatalf("undeclared queue: %v", err)
	}
	for _, subj := range []string{"agents.submit.dé.r3", "agents.submit.nobody.r4", "agents.submit.>"} {
		if _, err := c.JetStream().Publish(ctx, subj, []byte(`{}`)); err == nil {
			t.Errorf("%s was stored", subj)
		}
	}
	// A later worker declaring another queue adds it, keeps the others.
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{Queues: []string{"nobody"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitRaw(ctx, "nobody", "r2", []byte(`{"prompt":"x"}`)); err != nil {
		t.Fatalf("after declaring: %v", err)
	}
	s, _ := c.JetStream().Stream(ctx, c.Names().RunsStream())
	subs := s.CachedInfo().Config.Subjects
	old := slices.DeleteFunc(slices.Clone(subs), func(s string) bool { return !strings.HasPrefix(s, "agents.submit.") })
	if len(old) != 3 || !slices.Contains(old, "agents.submit.batch.*") || !slices.Contains(old, "agents.submit.nobody.*") {
		t.Fatalf("subjects %v", subs)
	}
	// Since 1.10 each queue's lanes too, every tenant.
	if !slices.Contains(subs, "agents.lane.nobody.high.*.*") || !slices.Contains(subs, "agents.lane.batch.low.*.*") || len(subs) != 12 {
		t.Fatalf("subjects %v", subs)
	}
}

// A stream made by 1.10's first cut took only the no-tenant lanes
// (lane.<q>.<p>._.*): declaring the queue again replaces them with every
// tenant's (a stream may not hold overlapping subjects), and a tenant
// lane request is then stored.
func TestNoTenantLaneSubjectsAreWidened(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default"}}})
	ctx, c := fleettest.Context(t), f.Client
	s, err := c.JetStream().Stream(ctx, c.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Subjects = []string{"agents.submit.default.*"}
	for _, p := range bus.Priorities() {
		cfg.Subjects = append(cfg.Subjects, "agents.lane.default."+p+"._.*")
	}
	if _, err := c.JetStream().UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{Queues: []string{"default"}}); err != nil {
		t.Fatal(err)
	}
	got := streamConfig(ctx, t, c, c.Names().RunsStream()).Subjects
	if slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, "._.") }) || !slices.Contains(got, "agents.lane.default.normal.*.*") {
		t.Fatalf("subjects %v", got)
	}
	if _, err := c.SubmitLane(ctx, bus.Lane{Queue: "default", Priority: bus.PriorityNormal, Tenant: "acme"}, "t1", []byte(`{"prompt":"x"}`)); err != nil {
		t.Fatalf("tenant lane request: %v", err)
	}
}

// A stream made by an older version takes every queue; declaring queues
// on it adds no overlapping subject.
func TestWildcardRunsStreamIsKept(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{NoStreams: true})
	ctx, c := fleettest.Context(t), f.Client
	if _, err := c.JetStream().CreateStream(ctx, jetstreamConfig(c.Names())); err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{Queues: []string{"default", "batch"}}); err != nil {
		t.Fatal(err)
	}
	cfg := streamConfig(ctx, t, c, c.Names().RunsStream())
	if cfg.Subjects[0] != c.Names().SubmitAll() || slices.ContainsFunc(cfg.Subjects[1:], func(s string) bool { return !strings.HasPrefix(s, "agents.lane.") }) {
		t.Fatalf("subjects %v", cfg.Subjects)
	}
}

// A duplicate ack for another request (another queue, another body) is an
// error, not a success: nobody can squat on a run id unnoticed.
func TestSubmitDetectsASquattedRunID(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default", "other"}}})
	ctx, c := fleettest.Context(t), f.Client
	if _, err := c.SubmitRaw(ctx, "other", "victim", []byte(`{"prompt":"evil"}`)); err != nil {
		t.Fatal(err)
	}
	_, err := c.Submit(ctx, "default", &bus.RunRequest{ID: "victim", Prompt: "mine"})
	if !errors.Is(err, bus.ErrRunIDTaken) {
		t.Fatalf("another queue: %v", err)
	}
	if _, err := c.SubmitRaw(ctx, "default", "victim2", []byte(`{"prompt":"evil"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitRaw(ctx, "default", "victim2", []byte(`{"prompt":"mine"}`)); !errors.Is(err, bus.ErrRunIDTaken) {
		t.Fatalf("another body: %v", err)
	}
	// The same request sent twice (a retry) is a duplicate, not an error.
	req := &bus.RunRequest{ID: "retry", Prompt: "same"}
	if _, err := c.Submit(ctx, "default", req); err != nil {
		t.Fatal(err)
	}
	res, err := c.Submit(ctx, "default", req)
	if err != nil || !res.Duplicate {
		t.Fatalf("retry: %+v %v", res, err)
	}
}

func jetstreamConfig(n bus.Names) jetstream.StreamConfig {
	return jetstream.StreamConfig{Name: n.RunsStream(), Subjects: []string{n.SubmitAll()},
		Retention: jetstream.WorkQueuePolicy, Discard: jetstream.DiscardNew, MaxMsgs: 1_000_000}
}

// A request published with a literal wildcard token (only a pedantic
// connection is refused) is stored like any other; the queue's consumer
// delivers it (the worker then terminates it), so nothing is kept that no
// one will run. Under the former filter agents.submit.<queue>.* a stored
// literal '>' was passed over and stayed for the stream's max age.
func TestQueueConsumerDeliversLiteralWildcardSubjects(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx, c := fleettest.Context(t), f.Client
	js, n := c.JetStream(), c.Names()
	published := []string{n.Submit(bus.DefaultQueue, "r0")}
	for range 3 {
		published = append(published, n.Submit(bus.DefaultQueue, ">"), n.Submit(bus.DefaultQueue, "*"))
	}
	published = append(published, n.Submit(bus.DefaultQueue, "r1"))
	for _, subj := range published {
		if _, err := js.Publish(ctx, subj, []byte(`{"prompt":"x"}`)); err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
	}
	cons, err := js.Consumer(ctx, n.RunsStream(), n.Consumer(bus.DefaultQueue))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < len(published) {
		b, err := cons.Fetch(len(published), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range b.Messages() {
			n++
			got = append(got, m.Subject())
			if err := m.Term(); err != nil {
				t.Fatal(err)
			}
		}
		if n == 0 {
			break
		}
	}
	if !slices.Equal(got, published) {
		t.Fatalf("the queue's consumer delivered %q\nof %q", got, published)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 0 {
		t.Fatalf("the consumer has %d pending", info.NumPending)
	}
	s, err := js.Stream(ctx, n.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	// A term is not acknowledged: the stream empties soon after.
	for deadline := time.Now().Add(5 * time.Second); ; {
		si, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if si.State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream keeps %d requests after every one was terminated", si.State.Msgs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
