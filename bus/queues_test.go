package bus_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// Only declared queues take requests: one for a queue no worker declared is
// refused at once instead of being kept for a week (also invalid tokens).
func TestUndeclaredQueuesAreRefused(t *testing.T) {
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
	if subs := s.CachedInfo().Config.Subjects; len(subs) != 3 || !slices.Contains(subs, "agents.submit.batch.*") || !slices.Contains(subs, "agents.submit.nobody.*") {
		t.Fatalf("subjects %v", subs)
	}
}

// A stream made by an older version takes every queue; declaring queues
// on it adds no overlapping subject.
func TestWildcardRunsStreamIsKept(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{NoStreams: true})
	ctx, c := fleettest.Context(t), f.Client
	if _, err := c.JetStream().CreateStream(ctx, jetstreamConfig(c.Names())); err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureStreams(ctx, bus.StreamsConfig{Queues: []string{"default", "batch"}}); err != nil {
		t.Fatal(err)
	}
	cfg := streamConfig(ctx, t, c, c.Names().RunsStream())
	if !slices.Equal(cfg.Subjects, []string{c.Names().SubmitAll()}) {
		t.Fatalf("subjects %v", cfg.Subjects)
	}
}

// A duplicate ack for another request (another queue, another body) is an
// error, not a success: nobody can squat on a run id unnoticed.
func TestSubmitDetectsASquattedRunID(t *testing.T) {
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
