package main

import (
	"errors"
	"flag"
	"fmt"

	"github.com/agentfleet/agentfleet/budget"
	"github.com/agentfleet/agentfleet/worker"
)

// budgetOptions are the per-tenant budget flags.
type budgetOptions struct {
	file, tenantKey, tenantFrom string
	loaded                      *budget.Budgets
}

func (b *budgetOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&b.file, "budgets", env("AGENTS_BUDGETS", ""), `per-tenant spending budgets: a JSON file {"period": "24h", "tenants": {"<tenant>": {"usd": 50, "onExhausted": "refuse" or "wait"}}, "default": {"usd": 5}}; periods are aligned to the Unix epoch in UTC; model calls are charged at the model table's prices [AGENTS_BUDGETS]`)
	fs.StringVar(&b.tenantKey, "tenant-key", env("AGENTS_TENANT_KEY", worker.DefaultTenantKey), "request metadata key naming a run's tenant (with --budgets) [AGENTS_TENANT_KEY]")
	fs.StringVar(&b.tenantFrom, "tenant-from", env("AGENTS_TENANT_FROM", "metadata"), "where a run's tenant comes from: metadata (the --tenant-key entry, what the submitter says) or queue (the queue's name; restrict who publishes to which queue) [AGENTS_TENANT_FROM]")
}

// load checks the flags and reads the budgets file.
func (b *budgetOptions) load() error {
	if b.tenantFrom != "metadata" && b.tenantFrom != "queue" {
		return fmt.Errorf("--tenant-from %q: use metadata or queue", clip(b.tenantFrom))
	}
	if b.tenantKey == "" {
		return errors.New("--tenant-key must not be empty")
	}
	if b.file == "" {
		return nil
	}
	var err error
	if b.loaded, err = budget.Load(b.file); err != nil {
		return fmt.Errorf("--budgets: %w", err)
	}
	return nil
}

// config is the worker's tenant budgets; nil without a budgets file.
func (b *budgetOptions) config() *worker.TenantBudgets {
	if b.loaded == nil {
		return nil
	}
	return &worker.TenantBudgets{Budgets: b.loaded, Key: b.tenantKey, FromQueue: b.tenantFrom == "queue",
		Stats: budget.NewStats(b.loaded)}
}
