package worker

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Every message stored in AGENTS_RUNS is run or removed with a logged
// reason (docs/protocol.md §2). A work queue keeps a message until a
// consumer acks or terminates it, so one its queue's consumer passes over
// stays for the stream's max age (7 days) and counts against its limits.
// Since 1.8 the consumer's filter (bus.Names.QueueFilter) delivers every
// message stored for its queue, and a subject that names no run is
// terminated at pickup (handle). A message is still passed over when it
// came in under the older filter <prefix>.submit.<queue>.* (a 1.7 worker's,
// set again by a 1.7 worker starting in a mixed fleet, or an operator's)
// with a literal '>' token: such a filter does not match it, and the
// consumer moves past it for good. The sweep removes those.
//
// Everything at or below the consumer's ack floor was acked or passed
// over, so what is still stored there is never delivered: the sweep reads
// the queue's messages up to the floor, each once (the floor only rises),
// and deletes those whose subject names no run. One there with a valid
// subject ran out of deliveries: the give-up's (giveup.go).

// sweepOrphans removes the requests of queue at or below floor whose
// subject names no run, reading from *from on; *from is left past what was
// read. A failed read or delete leaves the rest to the next sweep.
func (w *Worker) sweepOrphans(ctx context.Context, queue string, floor uint64, from *uint64) {
	filter := w.names.QueueFilter(queue)
	removed, first := 0, ""
	defer func() {
		if removed > 0 {
			w.log.Warn("requests with an invalid subject removed: the queue's consumer had passed them over (they name no run)",
				"queue", queue, "removed", removed, "firstSubject", first)
		}
	}()
	*from = max(*from, 1)
	for *from <= floor {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := w.runsStream.GetMsg(rctx, *from, jetstream.WithGetMsgSubject(filter))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			*from = floor + 1
			return
		}
		if err != nil {
			w.log.Warn("sweep of passed-over requests: read failed", "queue", queue, "err", err)
			return
		}
		if m.Sequence > floor {
			*from = floor + 1
			return
		}
		if _, _, err := w.names.ParseSubmit(m.Subject); err == nil {
			*from = m.Sequence + 1
			continue
		}
		switch gone, err := w.deleteRequest(ctx, m.Sequence); {
		case err != nil:
			w.log.Warn("sweep of passed-over requests: delete failed", "queue", queue, "requestSeq", m.Sequence, "err", err)
			return
		case !gone: // another worker's sweep was first
		default:
			if removed++; removed == 1 {
				first = clipString(m.Subject, 200)
			}
		}
		*from = m.Sequence + 1
	}
}

// deleteRequest deletes a message of the runs stream; gone is false when
// it was not there (the server answers a failure, not "not found", so the
// message is looked up again, with its own timeout: a delete that timed
// out leaves the look-up its time).
func (w *Worker) deleteRequest(ctx context.Context, seq uint64) (gone bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = w.runsStream.DeleteMsg(dctx, seq)
	cancel()
	if err == nil {
		return true, nil
	}
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, gerr := w.runsStream.GetMsg(gctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	return false, err
}

// warnStreamSettings logs, once at start, the settings of the streams
// and queue consumers (an operator's, under SkipEnsureStreams, or a 1.7
// worker's started since this one's EnsureStreams) that keep a message
// from its run: a per-subject cap that refuses (docs/protocol.md §6), a
// queue filter that passes requests over, a runs stream for every queue.
func (w *Worker) warnStreamSettings(consumers []jetstream.Consumer) {
	if w.controlStream.CachedInfo().Config.DiscardNewPerSubject {
		w.log.Warn("AGENTS_CONTROL refuses a run's control messages of a kind once it holds 1024 (discard new per subject): junk published for a run id keeps its owner's abort out; turn it off (nats stream edit AGENTS_CONTROL --no-discard-per-subject -f)",
			"stream", w.names.ControlStream())
	}
	for i, q := range w.cfg.Queues {
		if f := consumers[i].CachedInfo().Config.FilterSubject; f != w.names.QueueFilter(q) {
			w.log.Warn("a queue consumer's filter passes some requests over (those with a literal wildcard token, removed later by the sweep); set it to "+w.names.QueueFilter(q),
				"consumer", w.names.Consumer(q), "filter", f)
		}
	}
	w.warnWildcardQueues(w.runsStream.CachedInfo().Config.Subjects)
}

// warnWildcardQueues logs the runs stream's subjects that take every
// queue (an older version's <prefix>.submit.*.*, or an operator's): what
// they store for a queue no worker declared, or with a literal wildcard
// token for the queue, matches no queue's consumer and is never run nor
// swept.
func (w *Worker) warnWildcardQueues(subjects []string) {
	// A subject of the stream that stores a request whose queue token is a
	// literal '*' takes every queue.
	probe := strings.Split(w.names.Submit("*", "r"), ".")
	for _, s := range subjects {
		if matchesLiteral(strings.Split(s, "."), probe) {
			w.log.Warn("AGENTS_RUNS takes requests for every queue: those for a queue no worker declared, or whose queue token is a literal wildcard, are stored and never run; narrow its subjects to the declared queues (docs/operations.md, Queues are declared)",
				"stream", w.names.RunsStream(), "subject", s)
		}
	}
}

// matchesLiteral reports whether the tokens of a subject filter match
// those of a published subject, whose tokens are all literal.
func matchesLiteral(filter, subject []string) bool {
	for i, f := range filter {
		if f == ">" {
			return i < len(subject)
		}
		if i >= len(subject) || f != "*" && f != subject[i] {
			return false
		}
	}
	return len(filter) == len(subject)
}
