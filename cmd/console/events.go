package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// events streams a run's envelopes as Server-Sent Events: "event: envelope",
// the envelope as stored in data, and its AGENTS_EVENTS sequence as id. A
// client that reconnects with Last-Event-ID (or ?after=) gets the envelopes
// stored after that sequence: an ordered consumer on the run's subject
// starts right after it, so nothing is missed or sent twice. After the
// run's run_finished comes "event: end" and the stream closes. Open
// streams are bounded in all and per client: past a bound, a 503.
func (s *server) events(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := bus.CheckID(id); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var after uint64
	last := r.Header.Get("Last-Event-ID")
	if last == "" {
		last = r.URL.Query().Get("after")
	}
	if last != "" {
		n, err := strconv.ParseUint(last, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "Last-Event-ID %q is not a stream sequence", last)
			return
		}
		after = n
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	names := s.client.Names()
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{names.Events(id)}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	if s.finishedBefore(ctx, id, after) {
		startSSE(w)
		_, _ = w.Write([]byte("event: end\ndata: {}\n\n"))
		return
	}
	// Each stream holds a consumer on the server: bounded (streams.go).
	// The place is given back after the consumer is deleted (defers run
	// last first).
	free, refusal := s.streams.acquire(s.streamClient(r))
	if refusal != "" {
		refuseStream(w, refusal)
		return
	}
	defer free()
	cons, release, err := s.client.OrderedEvents(ctx, cfg)
	if err != nil {
		writeError(w, http.StatusBadGateway, "events of %s: %v", id, err)
		return
	}
	defer release()
	it, err := cons.Messages()
	if err != nil {
		writeError(w, http.StatusBadGateway, "events of %s: %v", id, err)
		return
	}
	defer it.Stop()

	type next struct {
		msg jetstream.Msg
		err error
	}
	// Buffered, so that under load the writer finds several envelopes
	// ready and sends them with one flush.
	msgs := make(chan next, 64)
	go func() {
		for {
			m, err := it.Next(jetstream.NextContext(ctx))
			select {
			case msgs <- next{m, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	startSSE(w)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	hb := time.NewTicker(s.heartbeat)
	defer hb.Stop()
	var buf []byte
	for {
		select {
		case <-ctx.Done():
			return
		case <-hb.C:
			_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := w.Write([]byte(": heartbeat\n\n")); err != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		case n := <-msgs:
			if n.err != nil {
				if !errors.Is(n.err, context.Canceled) {
					s.log.Warn("events stream ended", "run", id, "err", n.err)
				}
				return
			}
			md, err := n.msg.Metadata()
			if err != nil {
				continue
			}
			data := n.msg.Data()
			buf = appendSSE(buf[:0], "envelope", md.Sequence.Stream, data)
			finished := isRunFinished(data)
			if finished {
				buf = append(buf, "event: end\ndata: {}\n\n"...)
			}
			_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := w.Write(buf); err != nil {
				return
			}
			// Flush when nothing else is ready: one write for a burst.
			if len(msgs) == 0 {
				if rc.Flush() != nil {
					return
				}
			}
			if finished {
				_ = rc.Flush()
				return
			}
		}
	}
}

func startSSE(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
}

// appendSSE appends one event; data lines are split at newlines, which
// JSON envelopes do not have anyway.
func appendSSE(dst []byte, event string, id uint64, data []byte) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, event...)
	dst = append(dst, "\nid: "...)
	dst = strconv.AppendUint(dst, id, 10)
	dst = append(dst, '\n')
	for line := range bytes.Lines(data) {
		dst = append(dst, "data: "...)
		dst = append(dst, bytes.TrimRight(line, "\r\n")...)
		dst = append(dst, '\n')
	}
	return append(dst, '\n')
}

// finishedBefore reports whether a resuming client has already had the
// run's run_finished: the last stored envelope is at or before after and
// ends the run. Then there is nothing more to wait for.
func (s *server) finishedBefore(ctx context.Context, id string, after uint64) bool {
	if after == 0 {
		return false
	}
	st, err := s.client.Stream(ctx, s.client.Names().EventsStream())
	if err != nil {
		return false
	}
	m, err := st.GetLastMsgForSubject(ctx, s.client.Names().Events(id))
	if err != nil || m.Sequence > after {
		return false
	}
	return isRunFinished(m.Data)
}

// isRunFinished reports whether an envelope holds run_finished; the cheap
// test first, as almost no envelope does.
func isRunFinished(data []byte) bool {
	if !bytes.Contains(data, []byte(`"run_finished"`)) {
		return false
	}
	env, err := bus.DecodeEnvelope(data)
	return err == nil && env.Type == bus.EventRunFinished
}
