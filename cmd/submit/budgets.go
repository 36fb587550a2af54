package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/agentfleet/agentfleet/budget"
)

// tenantBudget is one line of submit budgets: a tenant's spending in one
// period, read from the budgets bucket. The limit is the one the workers
// wrote into the ledger entry (they have the budgets file; submit needs
// none).
type tenantBudget struct {
	Tenant       string    `json:"tenant"`
	Period       string    `json:"period"`
	PeriodStart  time.Time `json:"periodStart"`
	SpentUSD     float64   `json:"spentUsd"`
	ReservedUSD  float64   `json:"reservedUsd"`
	LimitUSD     float64   `json:"limitUsd"`
	RemainingUSD float64   `json:"remainingUsd"`
	ResetsAt     time.Time `json:"resetsAt"`
}

func cmdBudgets(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "budgets", "submit budgets [--all] [--json]")
	var cf conn
	var asJSON, all bool
	cf.register(fs.FlagSet, e)
	budgetsFlags(fs.FlagSet, &asJSON, &all)
	pos, code, ok := parseCommand(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return fail(e, usagef("budgets takes no arguments (got %q); to submit the prompt %q: submit -- %s", pos[0], "budgets", "budgets"))
	}
	ctx, cancel := interruptible(ctx, e)
	defer cancel()
	c, err := cf.connect(ctx, e)
	if err != nil {
		return fail(e, err)
	}
	defer c.Close()
	kv, err := c.Budgets(ctx)
	if err != nil {
		return fail(e, fleetError(c, err))
	}
	list := budget.ListLatest // one read per tenant
	if all {
		list = budget.List
	}
	entries, err := list(ctx, kv)
	if err != nil {
		return fail(e, err)
	}
	lines := tenantBudgets(entries, time.Now(), all)
	if asJSON {
		return writeJSON(e, lines)
	}
	if len(lines) == 0 {
		fmt.Fprintln(e.stderr, "no tenant has spending in the current period (workers write a tenant's entry at its first run of a period)")
		return exitOK
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tPERIOD\tSPENT\tLIMIT\tREMAINING\tRESETS")
	for _, l := range lines {
		name := "(no tenant)"
		if l.Tenant != "" {
			q := strconv.Quote(l.Tenant) // no control characters on the terminal
			name = q[1 : len(q)-1]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", name, l.Period,
			usd(l.SpentUSD+l.ReservedUSD), usd(l.LimitUSD), usd(l.RemainingUSD), l.ResetsAt.Format(time.RFC3339))
	}
	_ = tw.Flush()
	return exitOK
}

// budgetsFlags are submit budgets' own flags.
func budgetsFlags(fs *flag.FlagSet, asJSON, all *bool) {
	fs.BoolVar(asJSON, "json", false, "print a JSON array (tenant, period, periodStart, spentUsd, reservedUsd, limitUsd, remainingUsd, resetsAt)")
	fs.BoolVar(all, "all", false, "include past periods")
}

// tenantBudgets are the entries as lines: the current periods only
// unless all, by tenant, newest period first.
func tenantBudgets(entries []budget.Entry, now time.Time, all bool) []tenantBudget {
	out := []tenantBudget{}
	for _, en := range entries {
		if !all && en.End <= now.UnixMilli() {
			continue
		}
		out = append(out, tenantBudget{Tenant: en.Tenant, Period: en.Period, PeriodStart: time.UnixMilli(en.Start).UTC(),
			SpentUSD: en.SpentUSD, ReservedUSD: en.Held(), LimitUSD: en.LimitUSD, RemainingUSD: en.Remaining(), ResetsAt: en.ResetsAt()})
	}
	return out
}

func usd(v float64) string { return fmt.Sprintf("$%.4f", v) }
