package verify

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	yaml3 "go.yaml.in/yaml/v3"
)

// chartValues reads deploy/k8s/nats-values.yaml.
func chartValues(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile("../k8s/nats-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml3.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// get walks nested maps; nil when a key is missing.
func get(v any, path ...string) any {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func orDefault(v, def any) any {
	if v == nil {
		return def
	}
	return v
}

// mergeOverwrite is sprig's mergeOverwrite on maps (the chart's merge).
func mergeOverwrite(dst, src map[string]any) map[string]any {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				dst[k] = mergeOverwrite(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
	return dst
}

func asMap(v any) map[string]any {
	if m, ok := v.(map[string]any); ok {
		return m
	}
	return map[string]any{}
}

// renderChartConfig builds the nats.conf the NATS Helm chart (1.x/2.x,
// files/config/*.yaml) renders for these values and release "nats": the
// chart's base config for the enabled blocks, config.*.merge merged over
// it, written as JSON, then the chart's nats.formatConfig rewrites
// ("<< x >>" unquoted, "...$include" keys to include directives). Only the
// parts the values use are modelled; unknown sections fail.
func renderChartConfig(t *testing.T, values map[string]any) string {
	t.Helper()
	cfg := asMap(values["config"])
	for k := range cfg {
		switch k {
		case "cluster", "jetstream", "monitor", "merge", "nats":
		default:
			t.Fatalf("config.%s is not modelled by this renderer: extend it", k)
		}
	}
	conf := map[string]any{
		"server_name":            "<< $SERVER_NAME >>",
		"lame_duck_grace_period": "10s",
		"lame_duck_duration":     "30s",
		"pid_file":               "/var/run/nats/nats.pid",
		"port":                   orDefault(get(cfg, "nats", "port"), 4222),
	}
	if get(cfg, "cluster", "enabled") == true {
		port := orDefault(get(cfg, "cluster", "port"), 6222)
		replicas := orDefault(get(cfg, "cluster", "replicas"), 3).(int)
		var routes []any
		for i := range replicas {
			routes = append(routes, fmt.Sprintf("nats://nats-%d.nats-headless:%v", i, port))
		}
		cluster := map[string]any{"name": "nats", "port": port, "no_advertise": true, "routes": routes}
		conf["cluster"] = mergeOverwrite(cluster, asMap(get(cfg, "cluster", "merge")))
	}
	if orDefault(get(cfg, "monitor", "enabled"), true) == true {
		conf["http_port"] = orDefault(get(cfg, "monitor", "port"), 8222)
	}
	if get(cfg, "jetstream", "enabled") == true {
		js := map[string]any{}
		if get(cfg, "jetstream", "memoryStore", "enabled") == true {
			js["max_memory_store"] = fmt.Sprintf("<< %v >>", orDefault(get(cfg, "jetstream", "memoryStore", "maxSize"), "1Gi"))
		} else {
			js["max_memory_store"] = 0
		}
		if orDefault(get(cfg, "jetstream", "fileStore", "enabled"), true) == true {
			js["store_dir"] = orDefault(get(cfg, "jetstream", "fileStore", "dir"), "/data")
			if s := get(cfg, "jetstream", "fileStore", "maxSize"); s != nil {
				js["max_file_store"] = fmt.Sprintf("<< %v >>", s)
			} else if orDefault(get(cfg, "jetstream", "fileStore", "pvc", "enabled"), true) == true {
				js["max_file_store"] = fmt.Sprintf("<< %v >>", orDefault(get(cfg, "jetstream", "fileStore", "pvc", "size"), "10Gi"))
			}
		} else {
			js["max_file_store"] = 0
		}
		conf["jetstream"] = mergeOverwrite(js, asMap(get(cfg, "jetstream", "merge")))
	}
	conf = mergeOverwrite(conf, asMap(cfg["merge"]))

	// toPrettyJson (sorted keys, two-space indent) without HTML escaping:
	// the chart's toPrettyRawJson undoes \u003c, \u003e and \u0026.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(conf); err != nil {
		t.Fatal(err)
	}
	out := regexp.MustCompile(`".*\$include": "(.*)",?`).ReplaceAllString(strings.TrimSpace(buf.String()), "include ${1};")
	return regexp.MustCompile(`"<<\s+(.*?)\s+>>"`).ReplaceAllString(out, "${1}")
}

// passwords are the environment accounts.conf reads (the chart's pods get
// them from the Secret agentfleet-nats-passwords).
var passwords = []string{"AGENTS_WORKER_PASSWORD", "AGENTS_SUBMITTER_PASSWORD", "AGENTS_OBSERVER_PASSWORD", "AGENTS_TOOLSERVICE_PASSWORD", "AGENTS_TOOLSERVICE_TEXT_PASSWORD", "AGENTS_TOOLSERVICE_CALC_PASSWORD", "AGENTS_TOOLCALLER_PASSWORD", "AGENTS_CONSOLE_PASSWORD", "AGENTS_APPROVER_PASSWORD", "OTHER_PASSWORD", "SYS_PASSWORD"}

// loadChartConfig lays the rendered nats.conf out as in the pod
// (/etc/nats-config/nats.conf, the accounts ConfigMap at
// /etc/nats-accounts) and loads it with nats-server's own parser.
func loadChartConfig(t *testing.T, values map[string]any) (*server.Options, string, error) {
	t.Helper()
	root := t.TempDir()
	rendered := renderChartConfig(t, values)
	confDir := filepath.Join(root, "etc", "nats-config")
	accDir := filepath.Join(root, "etc", "nats-accounts")
	for _, d := range []string{confDir, accDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	accounts, err := os.ReadFile("../nats/accounts.conf")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(accDir, "accounts.conf"), accounts, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(confDir, "nats.conf"), []byte(rendered), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SERVER_NAME", "nats-0")
	for _, p := range passwords {
		t.Setenv(p, "secret-"+p)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(confDir, "nats.conf"))
	return opts, rendered, err
}

// The NATS configuration of the Kubernetes path parses with nats-server's
// own parser and says what the fleet needs.
func TestChartNATSConfigParses(t *testing.T) {
	values := chartValues(t)
	// The chart must mount the accounts file where the include looks.
	if inc := get(values, "config", "merge", "00$include"); inc != "../nats-accounts/accounts.conf" {
		t.Fatalf("config.merge include is %v", inc)
	}
	mounts := fmt.Sprint(get(values, "container", "patch"))
	vols := fmt.Sprint(get(values, "podTemplate", "patch"))
	if !strings.Contains(mounts, "/etc/nats-accounts") || !strings.Contains(vols, "agentfleet-nats-accounts") {
		t.Errorf("the accounts ConfigMap is not mounted at /etc/nats-accounts")
	}
	if get(values, "promExporter", "podMonitor", "merge", "spec", "jobLabel") != "app.kubernetes.io/name" {
		t.Errorf("the chart's PodMonitor needs jobLabel app.kubernetes.io/name (job=\"nats\" as the alerts expect)")
	}

	opts, rendered, err := loadChartConfig(t, values)
	if err != nil {
		t.Fatalf("nats-server refuses the chart's config: %v\n%s", err, rendered)
	}
	t.Logf("rendered nats.conf:\n%s", rendered)
	if opts.MaxPayload != 1<<20 {
		t.Errorf("max_payload %d, want 1MB", opts.MaxPayload)
	}
	if !opts.JetStream || opts.StoreDir != "/data" || opts.JetStreamMaxStore != 20<<30 || opts.JetStreamMaxMemory != 512<<20 {
		t.Errorf("jetstream: enabled %v, store %q, max file %d, max memory %d", opts.JetStream, opts.StoreDir, opts.JetStreamMaxStore, opts.JetStreamMaxMemory)
	}
	if opts.SyncInterval != 2*time.Minute || opts.SyncAlways {
		t.Errorf("sync_interval %v (always %v), want an explicit 2m", opts.SyncInterval, opts.SyncAlways)
	}
	if opts.ServerName != "nats-0" || opts.Cluster.Port != 6222 || len(opts.Routes) != 3 || opts.HTTPPort != 8222 {
		t.Errorf("server %q cluster port %d routes %d http %d", opts.ServerName, opts.Cluster.Port, len(opts.Routes), opts.HTTPPort)
	}
	if opts.LameDuckDuration != 30*time.Second || opts.LameDuckGracePeriod != 10*time.Second {
		t.Errorf("lame duck %v / %v", opts.LameDuckDuration, opts.LameDuckGracePeriod)
	}
	// Auth: account AGENTS with its three users, as KEDA's trigger expects.
	var agents bool
	for _, a := range opts.Accounts {
		agents = agents || a.Name == "AGENTS"
	}
	users := map[string]string{}
	for _, u := range opts.Users {
		if u.Account != nil {
			users[u.Username] = u.Account.Name
		}
	}
	if !agents || users["worker"] != "AGENTS" || users["submitter"] != "AGENTS" || users["observer"] != "AGENTS" {
		t.Errorf("accounts: AGENTS %v, users %v", agents, users)
	}
	if opts.SystemAccount != "SYS" {
		t.Errorf("system account %q", opts.SystemAccount)
	}
}

// The renderer reproduces the chart's failure mode: a size written
// without << >> in config.merge is a quoted string nats-server refuses.
func TestChartNATSConfigRejectsQuotedUnits(t *testing.T) {
	values := chartValues(t)
	asMap(get(values, "config", "merge"))["max_payload"] = "1MB"
	if _, rendered, err := loadChartConfig(t, values); err == nil {
		t.Fatalf("nats-server accepted a quoted size:\n%s", rendered)
	}
	asMap(get(values, "config", "merge"))["max_payload"] = "<< 1MB >>"
	if _, rendered, err := loadChartConfig(t, values); err != nil {
		t.Fatalf("<< 1MB >>: %v\n%s", err, rendered)
	}
}

// The compose servers' configs and the single-server accounts example
// parse too, each with an explicit sync interval (an unquoted 2m would be
// 2,000,000 seconds).
func TestComposeNATSConfigsParse(t *testing.T) {
	files, _ := filepath.Glob("../nats/nats*.conf")
	if len(files) != 3 {
		t.Fatalf("want nats1..3.conf, got %v", files)
	}
	for _, p := range passwords {
		t.Setenv(p, "secret-"+p)
	}
	for _, f := range append(files, "../nats/accounts.conf") {
		opts, err := server.ProcessConfigFile(f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if opts.SyncInterval != 2*time.Minute || opts.SyncAlways || opts.MaxPayload != 1<<20 {
			t.Errorf("%s: sync_interval %v, max_payload %d", f, opts.SyncInterval, opts.MaxPayload)
		}
		if f != "../nats/accounts.conf" && (len(opts.Routes) != 3 || opts.LameDuckDuration != 30*time.Second) {
			t.Errorf("%s: routes %d, lame duck %v", f, len(opts.Routes), opts.LameDuckDuration)
		}
	}
}
