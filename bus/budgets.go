package bus

import (
	"context"
	"errors"
	"fmt"

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
// existing bucket is left as it is: its keys are the period's spending.
func (c *Client) ensureBudgetsBucket(ctx context.Context, cfg StreamsConfig) error {
	name := c.names.BudgetsBucket()
	if _, err := c.js.KeyValue(ctx, name); err == nil {
		return nil
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("kv bucket %s: %w", name, err)
	}
	if _, err := c.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      name,
		Description: "agentfleet tenants' spending per budget period",
		History:     1,
		Storage:     cfg.Storage,
		Replicas:    cfg.Replicas,
	}); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
		return fmt.Errorf("kv bucket %s: %w", name, err)
	}
	return nil
}

// Budgets returns the bucket of the tenants' spending ledger.
func (c *Client) Budgets(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := c.js.KeyValue(ctx, c.names.BudgetsBucket())
	if err != nil {
		return nil, fmt.Errorf("kv bucket %s: %w (has a worker or EnsureStreams created it?)", c.names.BudgetsBucket(), err)
	}
	return kv, nil
}
