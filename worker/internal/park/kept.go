package park

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reading a kept copy (the waker's, and the pickup of a 1.9 park's wake).
//
// Since 1.10 AGENTS_PARKED allows direct gets: the read is answered by
// the stream (any replica in sync) outside the server's JetStream API
// queue, where in a bulk wake it waited behind the woken runs' own reads
// (docs/benchmarks/2026-12.md). Invariant: a copy the record names is never
// taken as gone on a replica's word. A replica behind the leader may not
// have it yet, so on a stream of more than one replica a direct get's "not
// found" is asked again of the leader, through the API.

// kept reads the kept copy at seq of AGENTS_PARKED.
func (e *Env) kept(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	m, err := e.Parked.GetMsg(ctx, seq) // direct when the stream allows it
	if cfg := e.Parked.CachedInfo().Config; errors.Is(err, jetstream.ErrMsgNotFound) && cfg.AllowDirect && cfg.Replicas > 1 {
		return e.leaderGet(ctx, cfg.Name, seq)
	}
	return m, err
}

// leaderGet reads seq of stream through the JetStream API (STREAM.MSG.GET,
// answered by the stream's leader), which the jetstream package no longer
// uses for a stream that allows direct gets.
func (e *Env) leaderGet(ctx context.Context, stream string, seq uint64) (*jetstream.RawStreamMsg, error) {
	o := e.JS.Options()
	prefix := "$JS.API."
	switch {
	case o.Domain != "":
		prefix = "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		prefix = strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	body, err := json.Marshal(struct {
		Seq uint64 `json:"seq"`
	}{seq})
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	resp, err := e.JS.Conn().RequestWithContext(ctx, prefix+"STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, fmt.Errorf("reading %s #%d from its leader: %w", stream, seq, err)
	}
	var r struct {
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("reading %s #%d from its leader: %w", stream, seq, err)
	}
	switch {
	case r.Error != nil && r.Error.Code == 404:
		return nil, jetstream.ErrMsgNotFound
	case r.Error != nil:
		return nil, fmt.Errorf("reading %s #%d from its leader: %d %s", stream, seq, r.Error.Code, r.Error.Description)
	case r.Message == nil:
		return nil, fmt.Errorf("reading %s #%d from its leader: an empty answer", stream, seq)
	}
	m := &jetstream.RawStreamMsg{Subject: r.Message.Subject, Sequence: r.Message.Seq, Data: r.Message.Data, Time: r.Message.Time}
	if len(r.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, fmt.Errorf("reading %s #%d from its leader: %w", stream, seq, err)
		}
	}
	return m, nil
}
