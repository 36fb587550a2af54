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

// Timers of parked runs. A parked run's pending approvals still time out
// at their expiresAt, with no worker holding the run: before its record
// says parked, the parking attempt stores a message schedule in
// AGENTS_PARKED (subject <prefix>.parktimer.<run>.at, Nats-Schedule
// "@at <first expiresAt>", the newest per run: a later park replaces it),
// and when it is due the server publishes it to <prefix>.parktimer.<run>.due.
// Those pass the durable consumer "waketimers", which every worker pulls
// (no single point of failure: the schedule lives in the stream, and a
// due message a worker took and did not ack comes again). Each due
// message:
//
//   - the record is parked: the run is woken (Wake); its woken attempt
//     finds the call expired and times it out (deny or abort, as the
//     request says), as a running attempt would have;
//   - the record is finished, gone, or held by a later attempt than the
//     one that set the timer: acked (nothing to do; a later attempt has
//     its own timers);
//   - the record is still the setting attempt's, not parked (the timer
//     is stored before the record says parked): it is looked at again a
//     little later (NakWithDelay); the park ends one way or the other
//     within the attempt's AckWait.

// timer is a parked run's timer message.
type timer struct {
	Attempt int `json:"attempt"`
}

// Arm stores run id's timer, due at due (rounded up to the second), for
// the attempt that parks it.
func (e *Env) Arm(ctx context.Context, id string, attempt int, due time.Time) error {
	body, err := json.Marshal(timer{Attempt: attempt})
	if err != nil {
		return err
	}
	at := due.UTC().Truncate(time.Second)
	if at.Before(due) {
		at = at.Add(time.Second)
	}
	m := &nats.Msg{Subject: e.Names.ParkTimer(id), Data: body, Header: nats.Header{}}
	m.Header.Set("Nats-Schedule", "@at "+at.Format(time.RFC3339))
	m.Header.Set("Nats-Schedule-Target", e.Names.ParkTimerDue(id))
	if _, err := e.JS.PublishMsg(ctx, m, jetstream.WithExpectStream(e.Names.ParkedStream())); err != nil {
		return fmt.Errorf("storing the parked run's timer: %w", err)
	}
	return nil
}

// timerRetry is how soon a due timer of a run still parking is looked at
// again.
const timerRetry = 2 * time.Second

// StartTimers pulls the due timers from cons until the returned stop is
// called; stop waits for those in progress.
func (e *Env) StartTimers(ctx context.Context, cons jetstream.Consumer) (stop func(), err error) {
	return e.consume(ctx, cons, "timers consumer", e.handleTimer)
}

func (e *Env) handleTimer(ctx context.Context, m jetstream.Msg) {
	rest, _ := strings.CutPrefix(m.Subject(), e.Names.Prefix()+".parktimer.")
	id, _, _ := strings.Cut(rest, ".")
	var t timer
	if id == "" || json.Unmarshal(m.Data(), &t) != nil {
		_ = m.Term()
		return
	}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rec, err := e.Read(hctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		_ = m.Ack()
		return
	}
	switch {
	case err != nil:
	case rec.Parked != nil && rec.Parked.Attempt == t.Attempt:
		var due time.Time // the server stored the due message when the timer fired
		if md, mdErr := m.Metadata(); mdErr == nil {
			due = md.Timestamp
		}
		if err = e.WakeBy(hctx, rec, ByTimer, due); err == nil {
			e.Log.Info("parked run woken: an approval's timeout is due", "run", id, "parkedSeq", rec.Parked.Seq)
			_ = m.Ack()
			return
		}
	case rec.Finished() || rec.Attempt != t.Attempt || rec.Parked != nil:
		_ = m.Ack()
		return
	default:
		_ = m.NakWithDelay(timerRetry) // still parking
		return
	}
	e.Log.Warn("parked run's timer: wake failed; retrying", "run", id, "err", err)
	_ = m.NakWithDelay(time.Second)
}
