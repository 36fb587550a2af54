package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
)

func envelopeMsg(t *testing.T, run string, attempt int, seq uint64, ts int64, event string) *nats.Msg {
	t.Helper()
	e := bus.Envelope{Run: run, Seq: seq, Attempt: attempt, Worker: "w", TS: ts, Event: []byte(event)}
	return &nats.Msg{Subject: "agents.run." + run + ".events", Data: e.AppendJSON(nil)}
}

func TestStreamFollowerChecksEachRunsSequence(t *testing.T) {
	f := &streamFollower{prefix: "agents.run.", n: 2, runs: map[string]*streamRun{"a": {}, "b": {}},
		reasons: map[string]int{}, delays: make([]uint32, delayBuckets), done: make(chan struct{})}
	started := `{"type":"run_started"}`
	delta := `{"type":"message_update","assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"x"}}`
	finished := `{"type":"run_finished","status":"succeeded"}`
	for _, m := range []*nats.Msg{
		envelopeMsg(t, "a", 1, 1, 1, started),
		envelopeMsg(t, "a", 1, 2, 1, delta),
		envelopeMsg(t, "b", 1, 1, 1, started), // every run started
		envelopeMsg(t, "a", 1, 4, 1, delta),   // gap: 3 missing
		envelopeMsg(t, "a", 1, 4, 1, delta),   // duplicate
		envelopeMsg(t, "b", 2, 1, 1, started), // a new attempt starts over
		envelopeMsg(t, "b", 2, 2, 1, delta),
		envelopeMsg(t, "other", 1, 9, 1, delta), // not the bench's
		envelopeMsg(t, "a", 1, 5, 1, finished),
		envelopeMsg(t, "b", 2, 3, 1, finished),
	} {
		f.onEvent(m)
	}
	select {
	case <-f.done:
	default:
		t.Fatal("both runs finished, done not closed")
	}
	if f.gaps != 1 || f.dups != 1 || f.failed != 0 || f.events != 9 {
		t.Fatalf("gaps %d dups %d failed %d events %d, want 1 1 0 9", f.gaps, f.dups, f.failed, f.events)
	}
	// The window opens after b's run_started and closes after a's
	// run_finished: 5 events.
	if f.window != 5 {
		t.Fatalf("window %d events, want 5", f.window)
	}
}

func TestEnvelopeHead(t *testing.T) {
	m := envelopeMsg(t, "r", 3, 42, 1700000000123, `{"type":"agent_start"}`)
	seq, attempt, ts, ok := envelopeHead(m.Data)
	if !ok || seq != 42 || attempt != 3 || ts != 1700000000123 {
		t.Fatalf("got %d %d %d %v", seq, attempt, ts, ok)
	}
	// Another field order: the full decode.
	seq, attempt, ts, ok = envelopeHead([]byte(`{"ts":5,"attempt":2,"seq":7,"run":"r","worker":"w","event":{"type":"x"}}`))
	if !ok || seq != 7 || attempt != 2 || ts != 5 {
		t.Fatalf("fallback: got %d %d %d %v", seq, attempt, ts, ok)
	}
	if _, _, _, ok := envelopeHead([]byte(`garbage`)); ok {
		t.Fatal("garbage decoded")
	}
}

// Streaming runs ask for a fixed pace unless told not to; without it the
// request carries no fixedPace at all, so a 1.4 worker takes it.
func TestStreamingBenchAsksForAFixedPace(t *testing.T) {
	for _, fixed := range []bool{true, false} {
		body, err := benchRequest(&benchFlags{model: "faux/bench", prompt: "x", streaming: true, deltasPerSecond: 10, deltas: 20, fixedPace: fixed})
		if err != nil {
			t.Fatal(err)
		}
		req, err := bus.DecodeRunRequest(body, "r1")
		if err != nil {
			t.Fatal(err)
		}
		if req.Faux == nil || req.Faux.FixedPace != fixed || req.Faux.TokensPerSecond != 40 {
			t.Errorf("fixed %v: %s", fixed, body)
		}
		if !fixed && bytes.Contains(body, []byte("fixedPace")) {
			t.Errorf("--fixed-pace=false still sends the field: %s", body)
		}
	}
}

// The bench's CPU is the window's; without one (here a run finished
// before the last one started), the whole bench's, and it says so.
func TestStreamFollowerCPUWindow(t *testing.T) {
	started := `{"type":"run_started"}`
	finished := `{"type":"run_finished","status":"succeeded"}`
	t0 := time.Now().Add(-time.Hour)
	start := cpuMark{wall: t0, cpu: 0, ok: true}
	for _, c := range []struct {
		name   string
		events []*nats.Msg
		over   string
	}{
		{"window", []*nats.Msg{envelopeMsg(t, "a", 1, 1, 1, started), envelopeMsg(t, "b", 1, 1, 1, started),
			envelopeMsg(t, "a", 1, 2, 1, finished)}, "over the window"},
		{"finished before the last started", []*nats.Msg{envelopeMsg(t, "a", 1, 1, 1, started), envelopeMsg(t, "a", 1, 2, 1, finished),
			envelopeMsg(t, "b", 1, 1, 1, started)}, "over the bench (no window)"},
		{"not all started", []*nats.Msg{envelopeMsg(t, "a", 1, 1, 1, started)}, "over the bench (no window)"},
	} {
		f := &streamFollower{prefix: "agents.run.", n: 2, runs: map[string]*streamRun{"a": {}, "b": {}},
			reasons: map[string]int{}, delays: make([]uint32, delayBuckets), done: make(chan struct{})}
		for _, m := range c.events {
			f.onEvent(m)
		}
		now := markCPU(time.Now())
		if !now.ok {
			t.Skip("no CPU time on this system")
		}
		got, over := f.windowCPU(start, now)
		if over != c.over || got.CPUCores == nil {
			t.Errorf("%s: %s %s, want it %s", c.name, cpuLine(got), over, c.over)
			continue
		}
		// The whole bench began at CPU 0: its seconds are all this
		// process has used, the window's a few microseconds' worth.
		whole := *got.CPUSeconds == *cpuBetween(start, now).CPUSeconds
		if whole != (c.over != "over the window") {
			t.Errorf("%s: %s, measured over the wrong span", c.name, cpuLine(got))
		}
	}
}
