package ratelimit

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the counters of the limiter behind the seam, by limit
// group (a configured, bounded set), under namespace (e.g. "agentfleet").
func (s *Seam) Collector(namespace string) prometheus.Collector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "model_limit", name), help, []string{"group"}, nil)
	}
	return &collector{s: s,
		waits:    desc("waits_total", "Model calls that waited for the fleet's shared rate limits."),
		waitSecs: desc("wait_seconds_total", "Time model calls waited for the fleet's shared rate limits."),
		reserved: desc("tokens_reserved_total", "Tokens reserved before model calls (estimated input plus output reserve)."),
		used:     desc("tokens_used_total", "Tokens model calls used, as settled."),
		throttle: desc("retry_after_total", "429s (and 503s with a retry time) a provider answered."),
		grants:   desc("grants_total", "Model calls admitted."),
	}
}

type collector struct {
	s                                                 *Seam
	waits, waitSecs, reserved, used, throttle, grants *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.waits, c.waitSecs, c.reserved, c.used, c.throttle, c.grants} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	l := c.s.l.Load()
	if l == nil {
		return
	}
	for g, st := range l.Stats() {
		ch <- prometheus.MustNewConstMetric(c.waits, prometheus.CounterValue, float64(st.Waits), g)
		ch <- prometheus.MustNewConstMetric(c.waitSecs, prometheus.CounterValue, st.WaitTime.Seconds(), g)
		ch <- prometheus.MustNewConstMetric(c.reserved, prometheus.CounterValue, float64(st.Reserved), g)
		ch <- prometheus.MustNewConstMetric(c.used, prometheus.CounterValue, float64(st.Used), g)
		ch <- prometheus.MustNewConstMetric(c.throttle, prometheus.CounterValue, float64(st.RetryAfter), g)
		ch <- prometheus.MustNewConstMetric(c.grants, prometheus.CounterValue, float64(st.Grants), g)
	}
}
