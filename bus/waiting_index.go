package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The waiting index (AGENTS_WAITING, since 1.9) holds one message per
// waiting run, on <prefix>.waiting.<queue>.<run>, kept one per subject.
// Only workers write it: an entry is put after the record that says the
// run waits is written, and purged after the record that says it no longer
// waits is written. Readers page it oldest first by stream sequence (an
// entry is written once when the run starts waiting, so its place is when
// the wait began) and read each listed run's record: the record decides.
//
// Invariant: an entry never lists a run whose record does not say it
// waits (readers drop such an entry: stale after a crash between the
// record write and the purge, or forged), and a run held by a worker that
// waits is missing from the index for at most one heartbeat (a failed put
// is retried at the next record write; a crashed worker's next attempt
// puts it when it takes the run).

// Indexed reports whether a wait for what has an index entry: waits that
// last (a person's answer, a budget's next period, child runs, a
// concurrency key's place: the last two since 1.10) and that a listing
// of waiting runs shows. A model call's rate-limit wait lasts seconds and
// comes and goes with each call: indexed, its entry was put and purged
// at every heartbeat (since 1.10 it is not; a listing asking for it
// walks the records).
func Indexed(what string) bool {
	switch what {
	case WaitingApproval, WaitingBudget, WaitingChildren, WaitingKey:
		return true
	}
	return false
}

// WaitingStream is the waiting-run index stream (AGENTS_WAITING).
func (n Names) WaitingStream() string { return n.upper + "_WAITING" }

// WaitingEntry is the subject of run's waiting-index entry.
func (n Names) WaitingEntry(queue, run string) string {
	return n.prefix + ".waiting." + queue + "." + run
}

// WaitingAll matches every waiting-index entry.
func (n Names) WaitingAll() string { return n.prefix + ".waiting.*.*" }

// WaitingIndexEntry is the body of a waiting-index entry: a hint, the
// record decides.
type WaitingIndexEntry struct {
	For   string    `json:"for"`
	Since time.Time `json:"since,omitzero"`
}

// waitingStreamConfig is the index stream's configuration.
func waitingStreamConfig(n Names, cfg StreamsConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        n.WaitingStream(),
		Description: "agentfleet waiting-run index (one entry per waiting run; the record decides)",
		Subjects:    []string{n.WaitingAll()},
		Retention:   jetstream.LimitsPolicy,
		// One entry per run: a rewrite (the wait's kind changed) replaces it.
		MaxMsgsPerSubject: 1,
		MaxMsgSize:        1 << 10,
		// Readers page it with direct gets (rangeOf).
		AllowDirect: true,
		Storage:     cfg.Storage,
		Replicas:    cfg.Replicas,
	}
}

// PutWaiting writes the waiting-index entry of rec, a running record that
// waits. With ifAbsent an entry already there is kept (its place in the
// oldest-first order too): ok.
func (c *Client) PutWaiting(ctx context.Context, rec *RunRecord, ifAbsent bool) error {
	if rec.Waiting == nil {
		return errors.New("waiting index: the record does not wait")
	}
	body, err := json.Marshal(WaitingIndexEntry{For: rec.Waiting.For, Since: rec.Waiting.Since})
	if err != nil {
		return err
	}
	var opts []jetstream.PublishOpt
	if ifAbsent {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(0))
	}
	_, err = c.js.Publish(ctx, c.names.WaitingEntry(rec.Queue, rec.ID), body, opts...)
	var apiErr *jetstream.APIError
	if ifAbsent && errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return nil
	}
	return err
}

// DropWaiting purges run's waiting-index entry (none: ok).
func (c *Client) DropWaiting(ctx context.Context, queue, run string) error {
	s, err := c.Stream(ctx, c.names.WaitingStream())
	if err != nil {
		return err
	}
	return s.Purge(ctx, jetstream.WithPurgeSubject(c.names.WaitingEntry(queue, run)))
}

// waitingCursor is "w.<seq>": the next page starts after index sequence seq.
func waitingCursor(seq uint64) string { return "w." + strconv.FormatUint(seq, 10) }

// waitingPage is ListPage for State waiting from the index: entries oldest
// first from after the cursor, each checked against its record (one
// batched read per window). ok is false when the index cannot serve the
// listing (no index stream: a fleet before 1.9; or a filter on the
// records' order), and the caller walks the records.
func (c *Client) waitingPage(ctx context.Context, o ListOptions, after uint64) (*RunPage, bool, error) {
	if o.BeforeSeq != 0 || !o.Before.IsZero() || !o.Since.IsZero() || o.WaitingFor != "" && !Indexed(o.WaitingFor) {
		return nil, false, nil
	}
	s, err := c.Stream(ctx, c.names.WaitingStream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	info, err := s.Info(ctx)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, false, nil // deleted since the handle was cached
	}
	if err != nil {
		return nil, false, err
	}
	page := &RunPage{Stored: info.State.Msgs}
	if after >= info.State.LastSeq {
		return page, true, nil // nothing after the cursor (a hostile one too)
	}
	lo, hi := max(info.State.FirstSeq, after+1), info.State.LastSeq
	maxScan := o.MaxScan
	if maxScan == 0 {
		maxScan = DefaultListScan
	}
	want := func() bool { return o.Limit <= 0 || len(page.Records) < o.Limit }
	g := c.directGetter(c.names.WaitingStream())
	recs := c.directGetter("KV_" + c.names.RecordsBucket())
	entryPrefix := c.names.Prefix() + ".waiting."
	window := uint64(firstWindow)
	if o.Limit > 0 {
		window = uint64(2*o.Limit + 8) // holes of runs that stopped waiting
	}
	next := after // the last sequence the page consumed
	more := false // the page stopped inside a window
	now := time.Now()
	read := uint64(0) // sequences read, holes too: what MaxScan bounds here
	for lo <= hi && want() {
		if maxScan > 0 && read >= uint64(maxScan) {
			page.Truncated = true
			break
		}
		to := min(hi, lo+window-1)
		read += to - lo + 1
		msgs, err := g.rangeOf(ctx, lo, to)
		if err != nil {
			return nil, false, err
		}
		type cand struct {
			seq     uint64
			subject string
		}
		var cands []cand
		for _, m := range msgs {
			queue, run, ok := strings.Cut(strings.TrimPrefix(m.subject, entryPrefix), ".")
			if !ok || !strings.HasPrefix(m.subject, entryPrefix) || !ValidID(run) || o.Queue != "" && queue != o.Queue {
				continue
			}
			var e WaitingIndexEntry
			if json.Unmarshal(m.data, &e) != nil || !Indexed(e.For) || o.WaitingFor != "" && e.For != o.WaitingFor {
				continue // a hint only: a record's kind change rewrites the entry
			}
			cands = append(cands, cand{m.seq, c.names.Record(run)})
		}
		got := map[string]storedMsg{}
		for i := 0; i < len(cands); i += multiLastChunk {
			subs := make([]string, 0, multiLastChunk)
			for _, cd := range cands[i:min(len(cands), i+multiLastChunk)] {
				subs = append(subs, cd.subject)
			}
			rs, err := recs.multiLast(ctx, subs)
			if err != nil {
				return nil, false, err
			}
			for _, r := range rs {
				got[r.subject] = r
			}
		}
		for _, cd := range cands {
			if !want() {
				more = true
				break
			}
			next = cd.seq
			page.Scanned++
			m, ok := got[cd.subject]
			if !ok || len(m.data) == 0 {
				continue // stale: the record is gone
			}
			if r, ok := c.listed(m, o, nil, now); ok && Indexed(r.Waiting.For) {
				page.Records = append(page.Records, r)
			}
		}
		if !more {
			next = to
		}
		lo = to + 1
		window = min(window*2, maxWindow)
	}
	if more || lo <= hi {
		page.NextCursor = waitingCursor(next)
	}
	return page, true, nil
}

// multiLastChunk bounds the subjects of one batched record read.
const multiLastChunk = 256

// SweepWaiting removes stale waiting-index entries: those whose run's
// record is gone, final, or no longer waits for what the index lists
// (a final record's drop that failed, a worker that died between the
// record and the drop). One pass reads at most n sequences of the index
// from after the cursor (holes included: the work is bounded whatever
// the index holds) and their records, one batched read per 256; next is
// the cursor of the next pass (0: the index's end was reached, start
// again). Any worker may sweep, two at once too. Invariants:
//
//   - an entry younger than minAge is kept: its record may not be
//     readable yet where the read lands (a stream replica behind), and a
//     run's entry is written after its record;
//   - a stale entry is purged by its sequence (a purge of its subject up
//     to it): an entry put again since (the run waits again, at a later
//     sequence) is not touched, and a second sweeper's purge of the same
//     entry removes nothing.
func (c *Client) SweepWaiting(ctx context.Context, after uint64, n int, minAge time.Duration) (next uint64, removed int, err error) {
	s, err := c.Stream(ctx, c.names.WaitingStream())
	if err != nil {
		return 0, 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	lo, hi := max(info.State.FirstSeq, after+1), info.State.LastSeq
	if n <= 0 || lo > hi || info.State.Msgs == 0 {
		return 0, 0, nil
	}
	to := min(hi, lo+uint64(n)-1)
	msgs, err := c.directGetter(c.names.WaitingStream()).rangeOf(ctx, lo, to)
	if err != nil {
		return after, 0, err
	}
	next = to
	if to == hi {
		next = 0
	}
	entryPrefix := c.names.Prefix() + ".waiting."
	type cand struct {
		entry      storedMsg
		queue, run string
	}
	var cands []cand
	now := time.Now()
	for _, m := range msgs {
		if now.Sub(m.time) < minAge {
			next = m.seq - 1 // it and those after it (younger) wait for a later pass
			break
		}
		queue, run, ok := strings.Cut(strings.TrimPrefix(m.subject, entryPrefix), ".")
		if !ok || !ValidID(run) {
			continue // not a worker's (readers skip it): not the sweep's
		}
		cands = append(cands, cand{m, queue, run})
	}
	recs := c.directGetter("KV_" + c.names.RecordsBucket())
	for i := 0; i < len(cands); i += multiLastChunk {
		chunk := cands[i:min(len(cands), i+multiLastChunk)]
		subs := make([]string, 0, len(chunk))
		for _, cd := range chunk {
			subs = append(subs, c.names.Record(cd.run))
		}
		rs, err := recs.multiLast(ctx, subs)
		if err != nil {
			return after, removed, err
		}
		got := make(map[string]storedMsg, len(rs))
		for _, r := range rs {
			got[r.subject] = r
		}
		for _, cd := range chunk {
			if m, ok := got[c.names.Record(cd.run)]; ok && len(m.data) > 0 && stillWaits(m.data, cd.queue) {
				continue
			}
			err := s.Purge(ctx, jetstream.WithPurgeSubject(cd.entry.subject), jetstream.WithPurgeSequence(cd.entry.seq+1))
			if err != nil {
				return after, removed, fmt.Errorf("waiting index: purge %s up to %d: %w", cd.entry.subject, cd.entry.seq, err)
			}
			removed++
		}
	}
	return next, removed, nil
}

// stillWaits reports whether a record (its JSON) says its run waits in
// queue for what the index lists.
func stillWaits(data []byte, queue string) bool {
	var r RunRecord
	return json.Unmarshal(data, &r) == nil && r.State == StateRunning && r.Queue == queue &&
		r.Waiting != nil && Indexed(r.Waiting.For)
}
