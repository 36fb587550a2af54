package bus_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/workerproto"
)

// BenchmarkResumeLongRun stores RESUME_BENCH_EVENTS (default 100,000)
// events of one run's first attempt (turns of a streamed answer: 20
// deltas a message), interleaved with as many events of 4 other runs, and
// times what a resuming worker does before its first new event: read the
// run's events below its run_started (bus.ReadEvents) and fold them
// (workerproto.Recover). Run it 5 times:
//
//	go test ./bus -run '^$' -bench ResumeLongRun -benchtime 5x -timeout 30m
func BenchmarkResumeLongRun(b *testing.B) {
	n, f, js := benchFleet(b, "RESUME_BENCH_EVENTS", 100_000)
	c, ctx := f.Client, context.Background()
	const run = "long-run"
	seqs := map[string]uint64{}
	pending := 0
	pub := func(id, event string) {
		seqs[id]++
		env := bus.Envelope{Run: id, Seq: seqs[id], Attempt: 1, Worker: "bench", TS: time.Now().UnixMilli(), Event: []byte(event)}
		m := nats.NewMsg(c.Names().Events(id))
		m.Data = env.AppendJSON(nil)
		m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("%s:1:%d", id, seqs[id]))
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
		if pending++; pending == 4096 {
			pending = 0
			<-js.PublishAsyncComplete()
		}
	}
	others := []string{"other-1", "other-2", "other-3", "other-4"}
	emit := func(id, event string) {
		pub(id, event)
		pub(others[int(seqs[id])%len(others)], event) // interleaved history
	}
	emit(run, `{"type":"run_started","queue":"default","worker":"bench","attempt":1}`)
	emit(run, `{"type":"agent_start"}`)
	emit(run, `{"type":"message_start","message":{"role":"user","content":"go on","timestamp":1}}`)
	emit(run, `{"type":"message_end","message":{"role":"user","content":"go on","timestamp":1}}`)
	for int(seqs[run]) < n-30 {
		emit(run, `{"type":"turn_start"}`)
		emit(run, `{"type":"message_start","message":{"role":"assistant","content":[],"api":"faux","provider":"faux","model":"x","usage":{},"stopReason":"stop","timestamp":1}}`)
		emit(run, `{"type":"message_update","assistantMessageEvent":{"type":"text_start","contentIndex":0}}`)
		for range 20 {
			emit(run, `{"type":"message_update","assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"a few words of the answer "}}`)
		}
		emit(run, `{"type":"message_update","assistantMessageEvent":{"type":"text_end","contentIndex":0,"content":"the answer"}}`)
		msgSeq := seqs[run] + 1
		emit(run, `{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"the answer"}],"api":"faux","provider":"faux","model":"x","usage":{"input":10,"output":10,"totalTokens":20},"stopReason":"stop","timestamp":1}}`)
		emit(run, fmt.Sprintf(`{"type":"turn_end","messageSeq":%d}`, msgSeq))
		emit(run, `{"type":"message_start","message":{"role":"user","content":"go on","timestamp":1}}`)
		emit(run, `{"type":"message_end","message":{"role":"user","content":"go on","timestamp":1}}`)
	}
	<-js.PublishAsyncComplete()
	// The next attempt's run_started: the resume reads below it.
	started, err := js.Publish(ctx, c.Names().Events(run), []byte(`{"run":"long-run","seq":1,"attempt":2,"worker":"b","ts":1,"event":{"type":"run_started"}}`))
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%d events of %s, %d stored in all", seqs[run], run, started.Sequence)
	var times []time.Duration
	var restored int
	for b.Loop() {
		t0 := time.Now()
		envs, err := c.ReadEvents(ctx, run, started.Sequence)
		if err != nil {
			b.Fatal(err)
		}
		rc := workerproto.Recover(envs, time.Now().UnixMilli())
		times = append(times, time.Since(t0))
		restored = len(rc.Messages)
		if len(envs) != int(seqs[run]) || restored < 3 {
			b.Fatalf("%d envelopes read, %d messages restored", len(envs), restored)
		}
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms-p50")
	b.ReportMetric(float64(times[len(times)-1].Microseconds())/1000, "ms-max")
	b.ReportMetric(float64(restored), "messages-restored")
}

// benchFleet starts a fleet for a storage benchmark: the size from the
// environment variable (else def), the fleet, and a JetStream context that
// keeps many async publishes in flight.
func benchFleet(b *testing.B, sizeEnv string, def int) (int, *fleettest.Fleet, jetstream.JetStream) {
	n := def
	if v := os.Getenv(sizeEnv); v != "" {
		n, _ = strconv.Atoi(v)
	}
	f := fleettest.Start(b, fleettest.Options{})
	js, err := jetstream.New(f.Client.Conn(), jetstream.WithPublishAsyncMaxPending(16384))
	if err != nil {
		b.Fatal(err)
	}
	return n, f, js
}
