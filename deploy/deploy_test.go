// Package deploy holds what an operator needs to run the fleet; its test
// checks that the manifests parse and agree with the code: every metric a
// dashboard or alert uses is exported by the worker, and every worker flag
// and port they use exists.
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/agentfleet/agentfleet/metrics"
)

// Every YAML and JSON file under deploy/ parses (all documents of a stream).
func TestManifestsParse(t *testing.T) {
	n := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		switch filepath.Ext(path) {
		case ".json":
			n++
			var v any
			if err := json.Unmarshal(raw, &v); err != nil {
				t.Errorf("%s: %v", path, err)
			}
		case ".yml", ".yaml":
			n++
			dec := yaml.NewDecoder(bytes.NewReader(raw))
			for {
				var v any
				if err := dec.Decode(&v); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Errorf("%s: %v", path, err)
					break
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("only %d manifests found", n)
	}
}

// natsExporterMetrics are the prometheus-nats-exporter series the alerts
// use (-prefix=nats -jsz=all; names from its collector/jsz.go).
var natsExporterMetrics = map[string]bool{
	"nats_consumer_num_pending":           true,
	"nats_consumer_last_delivery_seconds": true,
	"nats_server_total_streams":           true,
	"nats_server_total_message_bytes":     true,
	"nats_server_max_storage":             true,
	"nats_stream_total_messages":          true,
	"nats_stream_limit_messages":          true,
}

// exportedNames are the metric names the worker's registry exposes.
func exportedNames(t *testing.T) map[string]bool {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, metrics.Config{})
	names := map[string]bool{"up": true} // Prometheus' own series for scrape targets
	for _, n := range m.Names() {
		names[n] = true
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		names[f.GetName()] = true
	}
	return names
}

// promqlExprs returns every PromQL expression of the dashboard and the rules.
func promqlExprs(t *testing.T) map[string][]string {
	out := map[string][]string{}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	raw, err := os.ReadFile("grafana/agentfleet.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			out["dashboard: "+p.Title] = append(out["dashboard: "+p.Title], tg.Expr)
		}
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	raw, err = os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out["alert: "+r.Alert] = append(out["alert: "+r.Alert], r.Expr)
		}
	}
	return out
}

var (
	promString    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers  = regexp.MustCompile(`\{[^}]*\}`)
	promRange     = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promVariables = regexp.MustCompile(`\$\w+`)
	promKeywords  = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// metricNames finds the metric names in a PromQL expression: identifiers
// that are not functions, keywords, labels, strings or durations.
func metricNames(expr string) []string {
	e := promString.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRange.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	e = promVariables.ReplaceAllString(e, " ")
	var names []string
	for _, m := range promIdent.FindAllString(e, -1) {
		if strings.HasSuffix(strings.TrimSpace(m), "(") || promKeywords[strings.ToLower(m)] {
			continue // a function call, or a keyword
		}
		names = append(names, m)
	}
	return names
}

func TestMetricNamesParser(t *testing.T) {
	got := metricNames(`sum by (le, model) (rate(agentfleet_x_bucket{status!="a b"}[5m])) / on (q) group_left foo_total and bool 2 > 0.5 or absent(up{job="w"})`)
	want := []string{"agentfleet_x_bucket", "foo_total", "up"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// Every metric in the dashboard and the alert rules is one the worker exports.
func TestDashboardsAndAlertsUseExportedMetrics(t *testing.T) {
	exported := exportedNames(t)
	exprs := promqlExprs(t)
	if len(exprs) < 10 {
		t.Fatalf("only %d panels and rules found", len(exprs))
	}
	used := map[string]bool{}
	for where, list := range exprs {
		for _, expr := range list {
			names := metricNames(expr)
			if len(names) == 0 {
				t.Errorf("%s: no metric in %q", where, expr)
			}
			for _, n := range names {
				used[n] = true
				base := n
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if exported[strings.TrimSuffix(n, suffix)] {
						base = strings.TrimSuffix(n, suffix)
					}
				}
				if !exported[base] && !natsExporterMetrics[n] {
					t.Errorf("%s: metric %s is not exported by the worker", where, n)
				}
			}
		}
	}
	var all []string
	for n := range used {
		all = append(all, n)
	}
	sort.Strings(all)
	t.Logf("%d expressions use %d metrics: %s", len(exprs), len(all), strings.Join(all, " "))
}

// The dashboard picks its data source and filters by queue and model: every
// panel reads ${datasource}, and the variables exist.
func TestDashboardVariables(t *testing.T) {
	raw, err := os.ReadFile("grafana/agentfleet.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title      string `json:"title"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
				Type string `json:"type"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["queue"] != "query" || vars["model"] != "query" {
		t.Errorf("dashboard variables %v: want datasource, queue and model", vars)
	}
	var queue, model bool
	for _, p := range dash.Panels {
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source %q, want ${datasource}", p.Title, p.Datasource.UID)
		}
		for _, tg := range p.Targets {
			queue = queue || strings.Contains(tg.Expr, `queue=~"$queue"`)
			model = model || strings.Contains(tg.Expr, `model=~"$model"`)
		}
	}
	if !queue || !model {
		t.Errorf("no panel filters by $queue (%v) or $model (%v)", queue, model)
	}
}

// Two panels with one id, or on one place of the grid, show as one in
// Grafana (a merge once gave the schedules and priorities panels both id
// 17 at x=0, y=64): ids are unique and no two panels overlap.
func TestDashboardLayout(t *testing.T) {
	raw, err := os.ReadFile("grafana/agentfleet.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			GridPos struct {
				H, W, X, Y int
			} `json:"gridPos"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	ids := map[int]string{}
	cells := map[[2]int]string{}
	for _, p := range dash.Panels {
		if other, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: grid position %+v is off the 24-column grid", p.Title, g)
		}
		for y := g.Y; y < g.Y+g.H; y++ {
			for x := g.X; x < g.X+g.W; x++ {
				if other, ok := cells[[2]int{x, y}]; ok {
					t.Errorf("panels %q and %q overlap at x=%d, y=%d", other, p.Title, x, y)
					return
				}
				cells[[2]int{x, y}] = p.Title
			}
		}
	}
}
