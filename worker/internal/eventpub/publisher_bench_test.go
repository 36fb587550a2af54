package eventpub

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/workerproto"
)

func TestEnvelopePartsMatchAppendJSON(t *testing.T) {
	t.Parallel()
	for _, worker := range []string{"w1", `we"ird <w> & \ é`, ""} {
		for _, cs := range []uint64{0, 42} {
			for _, intr := range []bool{false, true} {
				e := bus.Envelope{Run: "r-1", Seq: 17, Attempt: 3, Worker: worker, TS: 1700000000123,
					ControlSeq: cs, Interrupted: intr, Event: []byte(`{"type":"x"}`)}
				want := e.AppendJSON(nil)
				p := &Publisher{}
				p.envHead, p.envMid = envelopeParts(e.Run, e.Attempt, e.Worker)
				if got := p.appendEnvelope(nil, e.Seq, e.TS, Options{ControlSeq: cs, Interrupted: intr}, e.Event); !bytes.Equal(got, want) {
					t.Errorf("got  %s\nwant %s", got, want)
				}
			}
		}
	}
}

// BenchmarkPublishDelta is the worker's path for one text delta: encode
// the agent event, wrap it in its envelope, publish it asynchronously with
// its message id and take its ack (an embedded server in the process).
func BenchmarkPublishDelta(b *testing.B) {
	for _, tc := range []struct {
		name  string
		plain bool
	}{{"batches", false}, {"plain", true}} {
		b.Run(tc.name, func(b *testing.B) {
			w, _ := startInternal(b, testConfig{NoEventBatches: tc.plain}, nil)
			ev := agent.Event{Type: agent.EventMessageUpdate, StreamEvent: &agent.StreamEvent{Type: agent.StreamTextDelta, Delta: "lorem ipsum dolo"}}
			p := newPublisher(w, bus.NewRunID(), 1, nil)
			var scratch []byte
			b.ReportAllocs()
			for b.Loop() {
				data, err := workerproto.AppendAgentEvent(scratch[:0], &ev, workerproto.Refs{})
				if err != nil {
					b.Fatal(err)
				}
				scratch = data
				if _, err := p.Event(string(ev.Type), data, Options{}); err != nil {
					b.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := p.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		})
	}
}
