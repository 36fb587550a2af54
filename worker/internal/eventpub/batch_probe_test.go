package eventpub

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// A probe commit not answered at the worker's start (here: its wait cut
// short) turns batches off, and a later probe that is answered turns them
// on again: a server slow at the start costs a while of single sends, not
// the worker's life.
func TestBatchesComeBackOnceAProbeIsAnswered(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.batch.ProbeOrOff(ctx, w.log, 10*time.Millisecond)
	if w.batch.on() {
		t.Fatal("batches on after a probe without an answer")
	}
	for deadline := time.Now().Add(20 * time.Second); !w.batch.on(); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatal("batches still off after probes that are answered")
		}
	}
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	sent := replies(t, c, p.subject)
	publishN(t, p, 3)
	if err := flushWithin(t, p); err != nil {
		t.Fatal(err)
	}
	if r := sent(3); !strings.HasSuffix(r[2], ".$FI") {
		t.Fatalf("event 3 not in a batch (reply %q)", r[2])
	}
}

// A stream that does not allow batches (an operator removed the flag, or
// an older server) gets every event plainly.
func TestStreamWithoutBatchesGetsEventsPlainly(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	ensureStreams(t, c)
	noBatches := func(cfg *jetstream.StreamConfig) { cfg.AllowBatchPublish = false }
	updateEventsStream(t, c, noBatches)
	w, _ := startInternalOn(t, c, testConfig{}, nil)
	// The worker widens the stream again (flags are only added) and so
	// batches; an operator's removal after the start is answered by the
	// stream, and the batch turns off.
	if w.batch == nil {
		t.Fatal("the worker did not turn batches on again")
	}
	updateEventsStream(t, c, noBatches)
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	storeTen(t, c, p)
	if !w.batch.off.Load() {
		t.Fatal("batches still on after the stream refused one")
	}
	// After the refusal, events go plainly.
	p2 := newPublisher(w, bus.NewRunID(), 1, nil)
	sent2 := replies(t, c, p2.subject)
	publishN(t, p2, 5)
	if err := flushWithin(t, p2); err != nil {
		t.Fatal(err)
	}
	for _, r := range sent2(5) {
		if strings.HasSuffix(r, ".$FI") {
			t.Fatalf("event sent in a batch (%s) after the stream refused batches", r)
		}
	}
}

// Batches only where the stream takes their commits: a stream set up by an
// operator (SkipEnsureStreams) that allows batches without the commit
// subject gets every event singly.
func TestNoBatchesWithoutTheCommitSubject(t *testing.T) {
	t.Parallel()
	c := connectTestServer(t)
	ensureStreams(t, c)
	updateEventsStream(t, c, func(cfg *jetstream.StreamConfig) { cfg.Subjects = []string{c.Names().Events("*")} })
	w, _ := startInternalOn(t, c, testConfig{SkipEnsureStreams: true}, nil)
	if w.batch != nil {
		t.Fatal("the worker batches on a stream without the commit subject")
	}
	p := newPublisher(w, bus.NewRunID(), 1, nil)
	publishN(t, p, 5)
	if err := flushWithin(t, p); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(storedSeqs(t, c, p.run)), fmt.Sprint(seqsTo(5)); got != want {
		t.Fatalf("stored %s, want %s", got, want)
	}
}

// A probe answered "batch publish is disabled" (the stream's config
// changed since the worker read it) turns batches off for good, and a
// probe answered "no responders" (JetStream away) is no answer.
func TestAProbeTellsADisabledStreamFromNoAnswer(t *testing.T) {
	t.Parallel()
	w, c := startInternal(t, testConfig{}, nil)
	ctx := context.Background()
	s, err := c.JetStream().Stream(ctx, w.names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowBatchPublish = false
	if _, err := c.JetStream().UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := w.batch.probe(ctx); !errors.Is(err, errBatchesDisabled) {
		t.Fatalf("probe of a stream without batches: %v", err)
	}
	w.batch.ProbeOrOff(ctx, w.log, time.Millisecond)
	if w.batch.on() {
		t.Fatal("batches on after a probe answered that they are disabled")
	}
	// Unanswered first (its wait cut short), then re-probes: the first
	// answered "disabled" ends them.
	cut, cancel := context.WithCancel(ctx)
	cancel()
	w.batch.ProbeOrOff(cut, w.log, time.Millisecond)
	reprobesEnded := make(chan struct{})
	go func() {
		w.batch.reprobing.Wait()
		close(reprobesEnded)
	}()
	within(t, reprobesEnded, 20*time.Second, "the re-probes ending at a stream without batches")
	if w.batch.on() {
		t.Fatal("batches on after a re-probe answered that they are disabled")
	}

	// What the server answers a request nobody serves.
	sub, err := c.Conn().Subscribe("no.stream.here", func(m *nats.Msg) {
		_ = m.RespondMsg(&nats.Msg{Header: nats.Header{"Status": []string{"503"}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	w.batch.commitSubject = "no.stream.here"
	if err := w.batch.probe(ctx); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("probe without responders: %v", err)
	}
}
