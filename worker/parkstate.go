package worker

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"slices"

	"github.com/agentfleet/agentfleet/bus"
)

// A parked run's state (protocol 1.10, Agentfleet-Parked-State): its
// events, kept by its attempt's publisher as it published them, put on
// the kept request copy at park time, so that its first woken attempt
// resumes from the wake it holds instead of reading the run's events
// (a walk of the events stream the server pays for, and a round trip
// waiting for run_started's ack). Invariants:
//
//  1. The state is every event the run has stored: an attempt keeps its
//     envelopes only when it knows every earlier one (the run's first
//     attempt, or one resumed from a state), and the park flushed and
//     fenced its publisher before its state is taken, so nothing it
//     kept is unstored and nothing stored is missing. Events of an older
//     attempt that outlived its lease are left out, as a resume after
//     the newer attempt's run_started leaves them out of the transcript.
//  2. It is used only by the attempt whose confirmation found the record
//     still parked by the park that kept it, with parked.state its digest
//     (worker/internal/park: Confirm): any later attempt may have stored
//     events since, and reads them.
//  3. It is bounded (parkStateKeep, and with its request within a
//     message): a larger one is not kept, and the wake reads the events
//     as before.

// parkStateKeep bounds the envelopes an attempt keeps (every running or
// waiting run that may park, on a parking worker, holds them: 1,000 runs waiting to park
// hold at most 64 MiB); parkStateMax bounds a state read (before
// compression), and parkStateHeaderMax its header value: a wake is a
// request of at most 1 MiB plus headers.
const (
	parkStateKeep      = 64 << 10
	parkStateMax       = 256 << 10
	parkStateHeaderMax = 48 << 10
)

// keepsState reports whether this attempt keeps its envelopes for a
// park's state (invariant 1); only a run that may park keeps them.
func (r *run) keepsState() bool {
	return r.w.parking != nil && r.w.cfg.ParkAfter > 0 && r.mayPark() &&
		((r.attempt == 1 && r.lease.RequeuedFrom == 0 && r.wokenFrom == 0) || r.stateEnvs != nil)
}

// mayPark reports whether the run can ever wait in a parkable way
// (parkableWait): only a gated tool or a run_agent call makes it. Other
// runs keep no envelopes: 10,000 runs in flight would hold up to 640 MiB.
func (r *run) mayPark() bool {
	if r.req == nil {
		return false
	}
	if p := r.approvalPolicy(); p != nil && len(p.Tools) > 0 {
		return true
	}
	return slices.Contains(r.req.Tools, bus.ToolRunAgent)
}

// parkState is the Agentfleet-Parked-State of a parking attempt with a
// request of reqBytes ("" when it has none to give: invariants 1 and 3).
func (r *run) parkState(reqBytes int) string {
	if r.pub == nil || !r.keepsState() {
		return ""
	}
	envs, ok := r.pub.Kept()
	if !ok {
		return ""
	}
	st, err := encodeParkState(envs)
	if err != nil || len(st) > parkStateHeaderMax || int64(reqBytes+len(st)+(64<<10)) > r.w.c.Conn().MaxPayload() {
		return ""
	}
	return st
}

func encodeParkState(envs [][]byte) (string, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write([]byte{'['}); err != nil {
		return "", err
	}
	for i, e := range envs {
		if i > 0 {
			if _, err := zw.Write([]byte{','}); err != nil {
				return "", err
			}
		}
		if _, err := zw.Write(e); err != nil {
			return "", err
		}
	}
	if _, err := zw.Write([]byte{']'}); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes()), nil
}

// decodeParkState returns a state's envelopes, raw, in stream order.
func decodeParkState(st string) ([][]byte, error) {
	z, err := base64.StdEncoding.DecodeString(st)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(z))
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(zr, parkStateMax+1))
	if err != nil {
		return nil, err
	}
	if len(data) > parkStateMax {
		return nil, fmt.Errorf("parked state over %d bytes", parkStateMax)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, err
	}
	out := make([][]byte, len(raw))
	for i, m := range raw {
		out[i] = m
	}
	return out, nil
}

// stateEvents decodes the envelopes of a state, as a read of the run's
// events returns them (one that does not decode is skipped, as there).
func stateEvents(raw [][]byte) []*bus.Envelope {
	envs := make([]*bus.Envelope, 0, len(raw))
	for _, d := range raw {
		if env, err := bus.DecodeEnvelope(d); err == nil {
			envs = append(envs, env)
		}
	}
	return envs
}
