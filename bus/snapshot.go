package bus

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
)

// Snapshots (since 1.9).
//
// A finished run's transcript is kept as one object of the object store
// agents_transcripts, named by the run's id, so a continuation loads it in
// one read instead of folding every event of the run:
//
//   - the body is the transcript's messages as one JSON array (pi JSON,
//     docs/protocol.md §5), the whole context: a continuation's snapshot
//     holds the messages it continued from too;
//   - the header is the object's metadata (SnapshotHeader): run, attempt,
//     messages, from; its size is the object's;
//   - only the attempt that finishes the run writes it, before the final
//     record: a continuation that finds the run finished finds its
//     snapshot, unless writing it failed (the run finishes all the same)
//     or the run finished another way (a give-up, a bad request). A reader
//     trusts a snapshot only when its attempt is the record's: an attempt
//     that lost its lease at the end may have written one;
//   - objects live as long as the events (EventsMaxAge): without one the
//     reader falls back to the events, and a run older than both cannot be
//     continued either way.

// SnapshotHeader describes a run's snapshot.
type SnapshotHeader struct {
	Run      string `json:"run"`
	Attempt  int    `json:"attempt"`
	Messages int    `json:"messages"`
	// Bytes is the size of the body (the messages' JSON array).
	Bytes int64 `json:"bytes"`
	// From is the run this one continued from, or "".
	From string `json:"from,omitempty"`
}

// ErrNoSnapshot: the run has no snapshot (an older run, or writing it
// failed): read its events instead.
var ErrNoSnapshot = errors.New("no transcript snapshot")

// Snapshot metadata keys.
const (
	snapRun      = "run"
	snapAttempt  = "attempt"
	snapMessages = "messages"
	snapFrom     = "from"
)

func (c *Client) ensureTranscriptsBucket(ctx context.Context, cfg StreamsConfig) error {
	name := c.names.TranscriptsBucket()
	if _, err := c.js.ObjectStore(ctx, name); err == nil {
		return nil // an operator's settings stay
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("object store %s: %w", name, err)
	}
	_, err := c.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      name,
		Description: "agentfleet finished runs' transcripts (continueFrom)",
		// As long as the events: a snapshot outliving its run's events
		// would let a run be continued whose history nobody can read.
		TTL:         cfg.EventsMaxAge,
		MaxBytes:    cfg.EventsMaxBytes,
		Storage:     cfg.Storage,
		Replicas:    cfg.Replicas,
		Compression: true, // JSON text: S2 keeps a fraction of it on disk
	})
	if err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
		return fmt.Errorf("object store %s: %w", name, err)
	}
	return nil
}

// transcripts is the snapshots' object store.
func (c *Client) transcripts(ctx context.Context) (jetstream.ObjectStore, error) {
	c.mu.Lock()
	obs := c.obs
	c.mu.Unlock()
	if obs != nil {
		return obs, nil
	}
	obs, err := c.js.ObjectStore(ctx, c.names.TranscriptsBucket())
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", c.names.TranscriptsBucket(), err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.obs == nil {
		c.obs = obs
	}
	return c.obs, nil
}

// PutSnapshot stores msgs as run h.Run's snapshot, replacing any, and
// returns its header (with Bytes). The JSON is written into the store as
// it is encoded: no copy of the whole body is made.
func (c *Client) PutSnapshot(ctx context.Context, h SnapshotHeader, msgs []agent.Message) (SnapshotHeader, error) {
	if err := CheckID(h.Run); err != nil {
		return h, err
	}
	obs, err := c.transcripts(ctx)
	if err != nil {
		return h, err
	}
	h.Messages = len(msgs)
	md := map[string]string{snapRun: h.Run, snapAttempt: strconv.Itoa(h.Attempt), snapMessages: strconv.Itoa(h.Messages)}
	if h.From != "" {
		md[snapFrom] = h.From
	}
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(encodeMessages(pw, msgs))
	}()
	info, err := obs.Put(ctx, jetstream.ObjectMeta{Name: h.Run, Metadata: md}, pr)
	// Put stops reading on an error: the encoder's next write fails.
	pr.CloseWithError(errors.New("snapshot not stored"))
	<-done
	if err != nil {
		return h, fmt.Errorf("snapshot of run %s: %w", h.Run, err)
	}
	h.Bytes = int64(info.Size)
	return h, nil
}

func encodeMessages(w io.Writer, msgs []agent.Message) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	var buf []byte
	if err := bw.WriteByte('['); err != nil {
		return err
	}
	for i := range msgs {
		if i > 0 {
			if err := bw.WriteByte(','); err != nil {
				return err
			}
		}
		var err error
		if buf, err = agent.AppendJSON(buf[:0], &msgs[i]); err != nil {
			return err
		}
		if _, err := bw.Write(buf); err != nil {
			return err
		}
	}
	if err := bw.WriteByte(']'); err != nil {
		return err
	}
	return bw.Flush()
}

// SnapshotInfo reads run's snapshot header (not its body): ErrNoSnapshot
// when it has none.
func (c *Client) SnapshotInfo(ctx context.Context, run string) (SnapshotHeader, error) {
	if err := CheckID(run); err != nil {
		return SnapshotHeader{}, err
	}
	obs, err := c.transcripts(ctx)
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return SnapshotHeader{}, ErrNoSnapshot // a fleet before 1.9
	}
	if err != nil {
		return SnapshotHeader{}, err
	}
	info, err := obs.GetInfo(ctx, run)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return SnapshotHeader{}, ErrNoSnapshot
	}
	if err != nil {
		return SnapshotHeader{}, fmt.Errorf("snapshot of run %s: %w", run, err)
	}
	return snapshotHeader(run, info)
}

func snapshotHeader(run string, info *jetstream.ObjectInfo) (SnapshotHeader, error) {
	md := info.Metadata
	h := SnapshotHeader{Run: md[snapRun], From: md[snapFrom], Bytes: int64(info.Size)}
	var e1, e2 error
	h.Attempt, e1 = strconv.Atoi(md[snapAttempt])
	h.Messages, e2 = strconv.Atoi(md[snapMessages])
	if h.Run != run || e1 != nil || e2 != nil || h.Messages < 0 {
		return h, fmt.Errorf("snapshot of run %s: its header is not a snapshot's (run %q, attempt %q, messages %q)",
			run, truncate(md[snapRun], 64), truncate(md[snapAttempt], 16), truncate(md[snapMessages], 16))
	}
	return h, nil
}

// LoadSnapshot reads run's snapshot in one read, decoding the body as it
// arrives (no copy of it is kept). It refuses one larger than maxBytes
// (it may have been replaced since SnapshotInfo), one whose attempt is
// not attempt (0: any), and one whose body does not match its header.
func (c *Client) LoadSnapshot(ctx context.Context, run string, attempt int, maxBytes int64) ([]agent.Message, SnapshotHeader, error) {
	if err := CheckID(run); err != nil {
		return nil, SnapshotHeader{}, err
	}
	obs, err := c.transcripts(ctx)
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, SnapshotHeader{}, ErrNoSnapshot
	}
	if err != nil {
		return nil, SnapshotHeader{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the object's subscription when not read to the end
	res, err := obs.Get(ctx, run)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, SnapshotHeader{}, ErrNoSnapshot
	}
	if err != nil {
		return nil, SnapshotHeader{}, fmt.Errorf("snapshot of run %s: %w", run, err)
	}
	defer res.Close()
	info, err := res.Info()
	if err != nil {
		return nil, SnapshotHeader{}, fmt.Errorf("snapshot of run %s: %w", run, err)
	}
	h, err := snapshotHeader(run, info)
	switch {
	case err != nil:
		return nil, h, err
	case attempt != 0 && h.Attempt != attempt:
		return nil, h, fmt.Errorf("snapshot of run %s: written by attempt %d, the run finished in attempt %d: %w", run, h.Attempt, attempt, ErrNoSnapshot)
	case maxBytes > 0 && h.Bytes > maxBytes:
		return nil, h, fmt.Errorf("snapshot of run %s: %d bytes, more than the %d bytes reserved for it", run, h.Bytes, maxBytes)
	}
	msgs, err := decodeMessages(res, h)
	if err == nil {
		err = res.Error() // the digest, checked at the end
	}
	if err != nil {
		return nil, h, fmt.Errorf("snapshot of run %s: %w", run, err)
	}
	return msgs, h, nil
}

// decodeMessages decodes a snapshot's body one message at a time.
func decodeMessages(r io.Reader, h SnapshotHeader) ([]agent.Message, error) {
	dec := json.NewDecoder(io.LimitReader(r, h.Bytes))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil, fmt.Errorf("the body is not a JSON array of messages (%v)", err)
	}
	msgs := make([]agent.Message, 0, h.Messages)
	for dec.More() {
		if len(msgs) == h.Messages {
			return nil, fmt.Errorf("the body has more messages than its header's %d", h.Messages)
		}
		msgs = append(msgs, agent.Message{})
		if err := dec.Decode(&msgs[len(msgs)-1]); err != nil {
			return nil, fmt.Errorf("message %d: %w", len(msgs)-1, err)
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("the body's array does not end: %w", err)
	}
	if len(msgs) != h.Messages {
		return nil, fmt.Errorf("the body has %d messages, its header says %d", len(msgs), h.Messages)
	}
	// Read to the end: the store checks the digest there.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return nil, err
	}
	return msgs, nil
}
