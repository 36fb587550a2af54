package verify

import (
	"os"
	"slices"
	"strings"
	"testing"

	yaml3 "go.yaml.in/yaml/v3"
)

// The compose NATS servers go through lame duck mode on docker stop, have
// healthchecks the workers wait for, and each has its own exporter that
// Prometheus scrapes.
func TestComposeNATSLifecycle(t *testing.T) {
	raw, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command         []string       `yaml:"command"`
			StopSignal      string         `yaml:"stop_signal"`
			StopGracePeriod string         `yaml:"stop_grace_period"`
			Healthcheck     map[string]any `yaml:"healthcheck"`
			DependsOn       map[string]struct {
				Condition string `yaml:"condition"`
			} `yaml:"depends_on"`
		} `yaml:"services"`
	}
	if err := yaml3.Unmarshal(raw, &compose); err != nil {
		t.Fatal(err)
	}
	servers := []string{"nats1", "nats2", "nats3"}
	for _, n := range servers {
		s := compose.Services[n]
		if s.StopSignal != "SIGUSR2" || s.StopGracePeriod == "" || s.Healthcheck == nil {
			t.Errorf("%s: stop_signal %q, stop_grace_period %q, healthcheck %v", n, s.StopSignal, s.StopGracePeriod, s.Healthcheck != nil)
		}
	}
	for _, w := range []string{"worker1", "worker2"} {
		for _, n := range servers {
			if compose.Services[w].DependsOn[n].Condition != "service_healthy" {
				t.Errorf("%s does not wait for %s to be healthy", w, n)
			}
		}
	}
	prom, err := os.ReadFile("../prometheus/prometheus-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range servers {
		exporter := "nats-exporter" + strings.TrimPrefix(n, "nats")
		cmd := compose.Services[exporter].Command
		if !slices.Contains(cmd, "http://"+n+":8222/") || !slices.Contains(cmd, "-jsz=all") {
			t.Errorf("%s does not export %s's JetStream figures: %v", exporter, n, cmd)
		}
		if !strings.Contains(string(prom), exporter+":7777") {
			t.Errorf("Prometheus does not scrape %s", exporter)
		}
	}
}
