package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Worker presence: each worker writes its state to KV bucket
// agents_workers (key = worker id) every PresenceInterval and on change;
// an entry lives PresenceTTL, so a worker that died vanishes on its own.
const (
	PresenceInterval = 10 * time.Second
	PresenceTTL      = 30 * time.Second
	maxPresenceBytes = 1 << 20
)

// What one entry lists of a worker's tools, so that it always fits the
// bucket's values (1 MiB) whatever its tool sources announce: at most
// MaxPresenceTools tools and MaxPresenceToolBytes of them as JSON, each
// description cut to MaxPresenceDescription bytes.
const (
	MaxPresenceTools       = 512
	MaxPresenceToolBytes   = 256 << 10
	MaxPresenceDescription = 512
)

// WorkersBucket is the KV bucket of worker presence (agents_workers).
func (n Names) WorkersBucket() string { return n.lower + "_workers" }

// WorkerPresence is one worker's entry in agents_workers.
type WorkerPresence struct {
	Worker    string    `json:"worker"`
	Version   string    `json:"version"`
	Protocol  string    `json:"protocol"`
	StartedAt time.Time `json:"startedAt"`
	Queues    []string  `json:"queues"`
	// Slots is the worker's concurrency; Busy the runs it drives now;
	// Waiting the runs it holds without a slot (runs waiting for an
	// approval; it pulls only into free slots).
	Slots   int            `json:"slots"`
	Busy    int            `json:"busy"`
	Waiting int            `json:"waiting"`
	Tools   []PresenceTool `json:"tools"`
	// ToolsTruncated says Tools is not all the worker serves as it is:
	// descriptions were cut, or ToolsOmitted tools left out (since 1.8).
	ToolsTruncated bool `json:"toolsTruncated,omitempty"`
	ToolsOmitted   int  `json:"toolsOmitted,omitempty"`
	// Models are the models ("provider/id") of the worker's model tables,
	// DefaultModel the one of requests that name none (since 1.8).
	Models       []string `json:"models,omitempty"`
	DefaultModel string   `json:"defaultModel,omitempty"`
}

// PresenceTool is a tool a worker serves. Source is "builtin",
// "mcp:<server>" or "service:<name>"; Available is false while its source
// is down or when its name cannot be used.
type PresenceTool struct {
	Name        string `json:"name"`
	Source      string `json:"source"`
	Description string `json:"description,omitempty"`
	Available   bool   `json:"available"`
}

// ensureWorkersBucket creates agents_workers (history 1, TTL 30 s).
func (c *Client) ensureWorkersBucket(ctx context.Context, cfg StreamsConfig) error {
	if _, err := c.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:       c.names.WorkersBucket(),
		Description:  "agentfleet worker presence",
		History:      1,
		TTL:          PresenceTTL,
		MaxValueSize: maxPresenceBytes,
		Storage:      jetstream.MemoryStorage,
		Replicas:     cfg.Replicas,
	}); err != nil {
		return fmt.Errorf("kv bucket %s: %w", c.names.WorkersBucket(), err)
	}
	return nil
}

// Workers returns the presence bucket.
func (c *Client) Workers(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := c.js.KeyValue(ctx, c.names.WorkersBucket())
	if err != nil {
		return nil, fmt.Errorf("kv bucket %s: %w (has a worker or EnsureStreams created it?)", c.names.WorkersBucket(), err)
	}
	return kv, nil
}

// ListWorkers reads every live worker's presence, sorted by worker id.
// Entries that do not decode are skipped.
func (c *Client) ListWorkers(ctx context.Context) ([]WorkerPresence, error) {
	kv, err := c.Workers(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []WorkerPresence
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var p WorkerPresence
		if json.Unmarshal(e.Value(), &p) == nil && p.Worker != "" {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b WorkerPresence) int {
		switch {
		case a.Worker < b.Worker:
			return -1
		case a.Worker > b.Worker:
			return 1
		}
		return 0
	})
	return out, nil
}

// LimitsBucket is the KV bucket of the fleet's shared model rate limits
// (agents_limits): one key per limit group.
func (n Names) LimitsBucket() string { return n.lower + "_limits" }

// KeysBucket holds the concurrency keys' places (agents_keys, since 1.10):
// one entry per key, workers only (worker/internal/keys).
func (n Names) KeysBucket() string { return n.lower + "_keys" }

// ensureKeysBucket creates agents_keys (history 1, file: a place outlives
// a server restart as its run does).
func (c *Client) ensureKeysBucket(ctx context.Context, cfg StreamsConfig) error {
	if _, err := c.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      c.names.KeysBucket(),
		Description: "agentfleet concurrency keys' places",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}); err != nil {
		return fmt.Errorf("kv bucket %s: %w", c.names.KeysBucket(), err)
	}
	return nil
}

// ensureLimitsBucket creates agents_limits (history 1, in memory: the
// state only matters for one window).
func (c *Client) ensureLimitsBucket(ctx context.Context, cfg StreamsConfig) error {
	if _, err := c.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      c.names.LimitsBucket(),
		Description: "agentfleet shared model rate limits",
		History:     1,
		Storage:     jetstream.MemoryStorage,
		Replicas:    cfg.Replicas,
	}); err != nil {
		return fmt.Errorf("kv bucket %s: %w", c.names.LimitsBucket(), err)
	}
	return nil
}

// EnsureMemoryBuckets creates again those of the buckets kept in memory
// (agents_workers, agents_limits) that are gone: a NATS restart loses
// them, and their writers call this when a write finds them gone
// (IsBucketGone). It returns the buckets it created: watchers of one
// have to watch again (ratelimit.Limiter.Rewatch).
func (c *Client) EnsureMemoryBuckets(ctx context.Context, cfg StreamsConfig) (created []string, err error) {
	for _, b := range []struct {
		name   string
		ensure func(context.Context, StreamsConfig) error
	}{{c.names.WorkersBucket(), c.ensureWorkersBucket}, {c.names.LimitsBucket(), c.ensureLimitsBucket}} {
		// A write also finds no stream while NATS is still starting: only a
		// stream the server says is missing is created again.
		_, err := c.js.Stream(ctx, "KV_"+b.name)
		if err == nil {
			continue
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return created, fmt.Errorf("kv bucket %s: %w", b.name, err)
		}
		if err := b.ensure(ctx, cfg); err != nil {
			return created, err
		}
		created = append(created, b.name)
	}
	return created, nil
}

// IsBucketGone reports whether a KV write failed because the bucket's
// stream is not there (a memory bucket after a NATS restart).
func IsBucketGone(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, jetstream.ErrBucketNotFound)
}

// Limits returns the bucket of shared model rate limits.
func (c *Client) Limits(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := c.js.KeyValue(ctx, c.names.LimitsBucket())
	if err != nil {
		return nil, fmt.Errorf("kv bucket %s: %w (has a worker or EnsureStreams created it?)", c.names.LimitsBucket(), err)
	}
	return kv, nil
}
