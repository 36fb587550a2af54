package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// WaitBudget is the reason of a model_wait for the tenant's next budget
// period (the run's first call waited for it).
const WaitBudget = "budget"

// WaitingBudget is a running record's Waiting while the run waits for its
// tenant's next budget period.
const WaitingBudget = "budget"

// BudgetsBucket is the KV bucket of the tenants' spending ledger
// (agents_budgets): one key per tenant and budget period (package budget).
func (n Names) BudgetsBucket() string { return n.lower + "_budgets" }

// ensureBudgetsBucket creates agents_budgets (history 1, on the streams'
// storage: spending must survive a restart) when it is missing. An
// existing bucket keeps its keys (the period's spending) and config, but
// for per-message TTLs (allowBudgetsTTL).
func (c *Client) ensureBudgetsBucket(ctx context.Context, cfg StreamsConfig) error {
	name := c.names.BudgetsBucket()
	if _, err := c.js.KeyValue(ctx, name); errors.Is(err, jetstream.ErrBucketNotFound) {
		if _, err := c.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      name,
			Description: "agentfleet tenants' spending per budget period",
			History:     1,
			Storage:     cfg.Storage,
			Replicas:    cfg.Replicas,
		}); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return fmt.Errorf("kv bucket %s: %w", name, err)
		}
	} else if err != nil {
		return fmt.Errorf("kv bucket %s: %w", name, err)
	}
	c.allowBudgetsTTL(ctx)
	return nil
}

// allowBudgetsTTL turns per-message TTLs on for the bucket's stream, the
// only change made to an existing bucket (a widening, as widenStream's):
// the workers' writes then expire two budget periods after the last one,
// so keys of past periods go. A server that refuses (older than 2.11, or
// no permission) leaves the bucket as it is; the workers then keep every
// key and say so.
func (c *Client) allowBudgetsTTL(ctx context.Context) {
	s, err := c.js.Stream(ctx, "KV_"+c.names.BudgetsBucket())
	if err != nil {
		return
	}
	cfg := s.CachedInfo().Config
	if cfg.AllowMsgTTL {
		return
	}
	cfg.AllowMsgTTL = true
	// A refused request (no permission) is never answered: bound it, so
	// a worker's start does not wait out its setup deadline.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, _ = c.js.UpdateStream(ctx, cfg)
}

// BudgetsKeyTTL reports whether the bucket's writes may carry a TTL.
func BudgetsKeyTTL(ctx context.Context, kv jetstream.KeyValue) bool {
	st, err := kv.Status(ctx)
	if err != nil {
		return false
	}
	s, ok := st.(*jetstream.KeyValueBucketStatus)
	return ok && s.StreamInfo() != nil && s.StreamInfo().Config.AllowMsgTTL
}

// Budgets returns the bucket of the tenants' spending ledger.
func (c *Client) Budgets(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := c.js.KeyValue(ctx, c.names.BudgetsBucket())
	if err != nil {
		return nil, fmt.Errorf("kv bucket %s: %w (has a worker or EnsureStreams created it?)", c.names.BudgetsBucket(), err)
	}
	return kv, nil
}
