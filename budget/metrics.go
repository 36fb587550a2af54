package budget

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats counts spending, refusals and waits by tenant. Only the tenants
// of the budgets file get their own label; every other tenant is "other",
// so a submitter cannot grow the metrics without bound.
type Stats struct {
	known map[string]bool

	mu      sync.Mutex
	spent   map[string]float64
	refused map[string]float64
	waited  map[string]float64
}

// NewStats counts for the tenants of b.
func NewStats(b *Budgets) *Stats {
	s := &Stats{known: map[string]bool{}, spent: map[string]float64{}, refused: map[string]float64{}, waited: map[string]float64{}}
	for _, n := range b.Names() {
		s.known[n] = true
	}
	return s
}

// Label is the metrics label of a tenant.
func (s *Stats) Label(tenant string) string {
	if s.known[tenant] {
		return tenant
	}
	return "other"
}

func (s *Stats) add(m map[string]float64, tenant string, v float64) {
	if s == nil {
		return
	}
	s.mu.Lock()
	m[s.Label(tenant)] += v
	s.mu.Unlock()
}

// Spent counts a settled call's cost.
func (s *Stats) Spent(tenant string, usd float64) {
	if s != nil {
		s.add(s.spent, tenant, usd)
	}
}

// Refused counts a run or call refused for the tenant's budget.
func (s *Stats) Refused(tenant string) {
	if s != nil {
		s.add(s.refused, tenant, 1)
	}
}

// Waited counts a run that waited for the tenant's next period.
func (s *Stats) Waited(tenant string) {
	if s != nil {
		s.add(s.waited, tenant, 1)
	}
}

// Collector exports the counters under namespace (e.g. "agentfleet"):
// tenant_spend_usd_total, tenant_budget_refusals_total and
// tenant_budget_waits_total, by tenant.
func (s *Stats) Collector(namespace string) prometheus.Collector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "tenant", name), help, []string{"tenant"}, nil)
	}
	return &collector{s: s,
		spent:   desc("spend_usd_total", "Cost of model calls charged to tenants' budgets (the model table's prices); tenants outside the budgets file are \"other\"."),
		refused: desc("budget_refusals_total", "Runs and model calls refused because the tenant's budget was spent."),
		waited:  desc("budget_waits_total", "Runs that waited for the tenant's next budget period."),
	}
}

type collector struct {
	s                      *Stats
	spent, refused, waited *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.spent
	ch <- c.refused
	ch <- c.waited
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	for _, m := range []struct {
		d *prometheus.Desc
		v map[string]float64
	}{{c.spent, c.s.spent}, {c.refused, c.s.refused}, {c.waited, c.s.waited}} {
		for t, v := range m.v {
			ch <- prometheus.MustNewConstMetric(m.d, prometheus.CounterValue, v, t)
		}
	}
}
