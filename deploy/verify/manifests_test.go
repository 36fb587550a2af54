package verify

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	keda "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// manifests are every Kubernetes object under deploy/k8s (the Helm values
// file is not a manifest), each decoded strictly into its upstream type.
type manifests struct {
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	configMaps      []*corev1.ConfigMap
	secrets         []*corev1.Secret
	pdbs            []*policyv1.PodDisruptionBudget
	networkPolicies []*networkingv1.NetworkPolicy
	podMonitors     []*monv1.PodMonitor
	rules           []*monv1.PrometheusRule
	scaledObjects   []*keda.ScaledObject
}

// splitDocs splits a YAML stream into its documents.
func splitDocs(raw []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(raw), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(d, "")) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// decodeStrict decodes one document, failing on unknown or duplicate fields.
func decodeStrict(doc []byte, into any) error {
	return yaml.UnmarshalStrict(doc, into)
}

func decodeManifest(m *manifests, doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	var obj any
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 Deployment":
		o := &appsv1.Deployment{}
		m.deployments, obj = append(m.deployments, o), o
	case "v1 Service":
		o := &corev1.Service{}
		m.services, obj = append(m.services, o), o
	case "v1 ConfigMap":
		o := &corev1.ConfigMap{}
		m.configMaps, obj = append(m.configMaps, o), o
	case "v1 Secret":
		o := &corev1.Secret{}
		m.secrets, obj = append(m.secrets, o), o
	case "policy/v1 PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		m.pdbs, obj = append(m.pdbs, o), o
	case "networking.k8s.io/v1 NetworkPolicy":
		o := &networkingv1.NetworkPolicy{}
		m.networkPolicies, obj = append(m.networkPolicies, o), o
	case "monitoring.coreos.com/v1 PodMonitor":
		o := &monv1.PodMonitor{}
		m.podMonitors, obj = append(m.podMonitors, o), o
	case "monitoring.coreos.com/v1 PrometheusRule":
		o := &monv1.PrometheusRule{}
		m.rules, obj = append(m.rules, o), o
	case "keda.sh/v1alpha1 ScaledObject":
		o := &keda.ScaledObject{}
		m.scaledObjects, obj = append(m.scaledObjects, o), o
	default:
		return fmt.Errorf("no upstream type known for %s %s", tm.APIVersion, tm.Kind)
	}
	return decodeStrict(doc, obj)
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	files, err := filepath.Glob("../k8s/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := &manifests{}
	n := 0
	for _, f := range files {
		if filepath.Base(f) == "nats-values.yaml" {
			continue // Helm values: checked by the NATS config test
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitDocs(raw) {
			n++
			if err := decodeManifest(m, doc); err != nil {
				t.Errorf("%s document %d: %v", f, i+1, err)
			}
		}
	}
	if n < 12 {
		t.Fatalf("only %d manifests found", n)
	}
	return m
}

// The strict decoder is strict: a misspelt field fails.
func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n",
		"apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nspec:\n  scaleTargetRef: {name: x}\n  minReplicas: 1\n",
		"apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nspec:\n  podMetricsEndpoints: [{portName: metrics}]\n",
		"apiVersion: policy/v1\nkind: PodDisruptionBudget\nspec:\n  maxUnavailable: 1\n  maxUnavailable: 2\n",
	} {
		if err := decodeManifest(&manifests{}, []byte(doc)); err == nil {
			t.Errorf("accepted:\n%s", doc)
		}
	}
}

func matches(t *testing.T, sel *metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return !s.Empty() && s.Matches(labels.Set(podLabels))
}

// worker returns the worker Deployment and its container.
func worker(t *testing.T, m *manifests) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	if len(m.deployments) != 1 || len(m.deployments[0].Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("want one Deployment with one container")
	}
	d := m.deployments[0]
	return d, &d.Spec.Template.Spec.Containers[0]
}

// args maps --name=value arguments to their values.
func args(t *testing.T, c *corev1.Container) map[string]string {
	out := map[string]string{}
	for _, a := range c.Args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			t.Fatalf("argument %q: write --name=value", a)
		}
		out[name] = value
	}
	return out
}

func containerPort(c *corev1.Container, name string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

func TestManifestsCrossReferences(t *testing.T) {
	m := loadManifests(t)
	d, c := worker(t, m)
	pod := d.Spec.Template.Labels
	a := args(t, c)

	if !matches(t, d.Spec.Selector, pod) {
		t.Errorf("Deployment selector does not select its own pods")
	}
	// KEDA owns the replica count; a fixed one would reset it on apply.
	if d.Spec.Replicas != nil {
		t.Errorf("Deployment sets replicas (%d) though KEDA scales it", *d.Spec.Replicas)
	}

	// Services and the PodMonitor select the worker pods and name ports it has.
	for _, s := range m.services {
		if !matches(t, &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, pod) {
			t.Errorf("Service %s selects no worker pod", s.Name)
		}
		for _, p := range s.Spec.Ports {
			if _, ok := containerPort(c, p.TargetPort.StrVal); !ok {
				t.Errorf("Service %s targets port %q, which the container does not name", s.Name, p.TargetPort.String())
			}
		}
	}
	if len(m.podMonitors) != 1 {
		t.Fatalf("want one PodMonitor, got %d", len(m.podMonitors))
	}
	for _, pm := range m.podMonitors {
		if !matches(t, &pm.Spec.Selector, pod) {
			t.Errorf("PodMonitor %s selects no worker pod", pm.Name)
		}
		// job="agentfleet-worker", as the alerts and the dashboard expect.
		if pm.Spec.JobLabel == "" || pod[pm.Spec.JobLabel] != "agentfleet-worker" {
			t.Errorf("PodMonitor %s: jobLabel %q does not make job=\"agentfleet-worker\"", pm.Name, pm.Spec.JobLabel)
		}
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			if ep.Port == nil {
				t.Errorf("PodMonitor %s: endpoint without a port name", pm.Name)
			} else if _, ok := containerPort(c, *ep.Port); !ok {
				t.Errorf("PodMonitor %s scrapes port %q, which the container does not name", pm.Name, *ep.Port)
			}
			if ep.Path != "/metrics" {
				t.Errorf("PodMonitor %s scrapes %q, not /metrics", pm.Name, ep.Path)
			}
		}
	}

	// The metrics port is the one --metrics-addr listens on.
	port, ok := containerPort(c, "metrics")
	_, listen, _ := strings.Cut(a["metrics-addr"], ":")
	if !ok || strconv.Itoa(int(port)) != listen {
		t.Errorf("container port metrics (%d) is not --metrics-addr %q", port, a["metrics-addr"])
	}

	// PDB: node drains may evict a worker; unhealthy pods never block them.
	if len(m.pdbs) != 1 {
		t.Fatalf("want one PodDisruptionBudget")
	}
	pdb := m.pdbs[0]
	if !matches(t, pdb.Spec.Selector, pod) {
		t.Errorf("PodDisruptionBudget selects no worker pod")
	}
	if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() < 1 {
		t.Errorf("PodDisruptionBudget must use maxUnavailable >= 1 (minAvailable blocks drains at one replica)")
	}
	if pdb.Spec.UnhealthyPodEvictionPolicy == nil || *pdb.Spec.UnhealthyPodEvictionPolicy != policyv1.AlwaysAllow {
		t.Errorf("PodDisruptionBudget: unhealthyPodEvictionPolicy must be AlwaysAllow")
	}

	// The grace period covers the drain and the hand-back after it.
	drain, err := time.ParseDuration(a["drain-timeout"])
	if err != nil {
		t.Fatalf("--drain-timeout: %v", err)
	}
	grace := time.Duration(*d.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	if grace < drain+15*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v is not longer than --drain-timeout %v plus the hand-back", grace, drain)
	}

	// runAsNonRoot needs a numeric user, in the pod and in the image.
	sc := d.Spec.Template.Spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("pod must run as a numeric non-root user")
	}
	dockerfile, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("USER %d:%d", *sc.RunAsUser, *sc.RunAsUser); !bytes.Contains(dockerfile, []byte("\n"+want+"\n")) {
		t.Errorf("Dockerfile has no %q", want)
	}

	// NetworkPolicies: the worker's selects the worker pods and opens its
	// metrics port; every named port exists on the pods it selects.
	var workerPolicy bool
	for _, np := range m.networkPolicies {
		if np.Namespace == "nats" {
			// The chart's pods: its container port names.
			if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "nats" {
				t.Errorf("NetworkPolicy %s selects no chart pod", np.Name)
			}
			for _, in := range np.Spec.Ingress {
				for _, p := range in.Ports {
					if p.Port == nil || !slices.Contains([]string{"nats", "cluster", "monitor", "prom-metrics"}, p.Port.StrVal) {
						t.Errorf("NetworkPolicy %s: port %v is not one the chart's pods name", np.Name, p.Port)
					}
				}
			}
			continue
		}
		if !matches(t, &np.Spec.PodSelector, pod) {
			t.Errorf("NetworkPolicy %s selects no worker pod", np.Name)
			continue
		}
		workerPolicy = true
		for _, in := range np.Spec.Ingress {
			for _, p := range in.Ports {
				if p.Port != nil && p.Port.StrVal != "" {
					if _, ok := containerPort(c, p.Port.StrVal); !ok {
						t.Errorf("NetworkPolicy %s opens port %q, which the container does not name", np.Name, p.Port.StrVal)
					}
				}
			}
		}
	}
	if !workerPolicy {
		t.Errorf("no NetworkPolicy for the workers")
	}

	// Every ConfigMap and Secret the pod refers to is shipped (the example
	// secrets stand for the real ones).
	shipped := map[string]bool{}
	for _, cm := range m.configMaps {
		shipped["configmap/"+cm.Name] = true
		for k := range cm.Data {
			shipped["configmap/"+cm.Name+"/"+k] = true
		}
	}
	for _, s := range m.secrets {
		shipped["secret/"+s.Name] = true
		for k := range s.StringData {
			shipped["secret/"+s.Name+"/"+k] = true
		}
	}
	for _, e := range c.Env {
		if r := e.ValueFrom; r != nil && r.ConfigMapKeyRef != nil && !shipped["configmap/"+r.ConfigMapKeyRef.Name+"/"+r.ConfigMapKeyRef.Key] {
			t.Errorf("env %s: ConfigMap key %s/%s is not shipped", e.Name, r.ConfigMapKeyRef.Name, r.ConfigMapKeyRef.Key)
		}
		if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && !shipped["secret/"+r.SecretKeyRef.Name+"/"+r.SecretKeyRef.Key] {
			t.Errorf("env %s: Secret key %s/%s has no example", e.Name, r.SecretKeyRef.Name, r.SecretKeyRef.Key)
		}
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && !shipped["configmap/"+v.ConfigMap.Name] {
			t.Errorf("volume %s: ConfigMap %s is not shipped", v.Name, v.ConfigMap.Name)
		}
		if v.Secret != nil && !shipped["secret/"+v.Secret.SecretName] {
			t.Errorf("volume %s: Secret %s has no example", v.Name, v.Secret.SecretName)
		}
	}
	if f, ok := a["models"]; ok {
		if !strings.HasPrefix(f, "/etc/agentfleet/") || !shipped["configmap/agentfleet-worker/"+strings.TrimPrefix(f, "/etc/agentfleet/")] {
			t.Errorf("--models %s is not a key of the mounted ConfigMap", f)
		}
	}
}

// The probes ask for paths the worker serves, on its metrics port, and
// wait longer than /readyz's own JetStream budget (2 s).
func TestProbesHitTheWorkersHandlers(t *testing.T) {
	m := loadManifests(t)
	_, c := worker(t, m)
	srv := httptest.NewServer(metrics.Handler(prometheus.NewRegistry(), func(context.Context) error { return nil }))
	defer srv.Close()
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe: want an HTTP probe", name)
			continue
		}
		if _, ok := containerPort(c, p.HTTPGet.Port.StrVal); !ok {
			t.Errorf("%s probe: port %q is not a container port name", name, p.HTTPGet.Port.String())
		}
		resp, err := http.Get(srv.URL + p.HTTPGet.Path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s probe: the worker answers %s %d", name, p.HTTPGet.Path, resp.StatusCode)
		}
	}
	if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("readiness must use /readyz and liveness /healthz")
	}
	if c.ReadinessProbe.TimeoutSeconds <= 2 {
		t.Errorf("readiness timeoutSeconds %d: /readyz may take 2 s", c.ReadinessProbe.TimeoutSeconds)
	}
}

// natsJetStreamMetadata are the trigger metadata keys of KEDA's
// nats-jetstream scaler (pkg/scalers/nats_jetstream_scaler.go, v2.21):
// trigger metadata is a map, so a misspelt key would pass decoding.
var natsJetStreamMetadata = []string{"natsServerMonitoringEndpoint", "account", "accountID", "stream",
	"consumer", "lagThreshold", "activationLagThreshold", "useHttps"}

func TestScaledObjectMatchesTheWorker(t *testing.T) {
	m := loadManifests(t)
	d, c := worker(t, m)
	a := args(t, c)
	if len(m.scaledObjects) != 1 {
		t.Fatalf("want one ScaledObject")
	}
	so := m.scaledObjects[0]
	if so.Spec.ScaleTargetRef == nil || so.Spec.ScaleTargetRef.Name != d.Name {
		t.Errorf("ScaledObject targets %+v, not Deployment %s", so.Spec.ScaleTargetRef, d.Name)
	}
	if so.Spec.Fallback == nil {
		t.Errorf("ScaledObject has no fallback")
	}
	hpa := so.Spec.Advanced
	if hpa == nil || hpa.HorizontalPodAutoscalerConfig == nil || hpa.HorizontalPodAutoscalerConfig.Behavior == nil ||
		hpa.HorizontalPodAutoscalerConfig.Behavior.ScaleDown == nil {
		t.Fatalf("ScaledObject has no scaleDown behaviour: scale-in would remove busy pods at will")
	}
	for _, p := range hpa.HorizontalPodAutoscalerConfig.Behavior.ScaleDown.Policies {
		if p.Type != "Pods" || p.Value != 1 || p.PeriodSeconds < 60 {
			t.Errorf("scaleDown policy %+v: want one pod per period of minutes", p)
		}
	}
	names := bus.MustNames(bus.DefaultPrefix)
	if len(so.Spec.Triggers) != 1 {
		t.Fatalf("want one trigger")
	}
	tr := so.Spec.Triggers[0]
	if tr.Type != "nats-jetstream" {
		t.Fatalf("trigger type %q", tr.Type)
	}
	for k := range tr.Metadata {
		if !slices.Contains(natsJetStreamMetadata, k) {
			t.Errorf("trigger metadata %q is not a key of KEDA's nats-jetstream scaler", k)
		}
	}
	md := tr.Metadata
	if md["stream"] != names.RunsStream() {
		t.Errorf("trigger stream %q, the worker's is %q", md["stream"], names.RunsStream())
	}
	if want := names.Consumer(a["queue"]); md["consumer"] != want {
		t.Errorf("trigger consumer %q, the worker's (--queue=%s) is %q", md["consumer"], a["queue"], want)
	}
	if md["lagThreshold"] != a["concurrency"] {
		t.Errorf("lagThreshold %q is not the slots per worker (--concurrency=%s)", md["lagThreshold"], a["concurrency"])
	}
	// KEDA finds the consumer's leader as <pod>.<endpoint>: only the
	// headless Service resolves that, and it must expose the monitor port.
	values := chartValues(t)
	host, port, _ := strings.Cut(md["natsServerMonitoringEndpoint"], ":")
	if !strings.HasPrefix(host, "nats-headless.") {
		t.Errorf("natsServerMonitoringEndpoint %q is not the chart's headless Service", host)
	}
	if want := fmt.Sprint(get(values, "config", "monitor", "port")); port != want {
		t.Errorf("natsServerMonitoringEndpoint port %q, the chart's monitor port is %s", port, want)
	}
	if md["account"] != "AGENTS" {
		t.Errorf("trigger account %q, the workers' account in deploy/nats/accounts.conf is AGENTS", md["account"])
	}
}

// Every flag the manifests pass exists in the worker's --help, and so does
// every environment variable the worker reads from them.
func TestWorkerFlagsExist(t *testing.T) {
	m := loadManifests(t)
	_, c := worker(t, m)
	cmd := exec.Command("go", "run", "./cmd/worker", "--help")
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("worker --help: %v\n%s", err, out)
	}
	help := string(out)
	for name := range args(t, c) {
		if !strings.Contains(help, "  -"+name+" ") && !strings.Contains(help, "  -"+name+"\n") {
			t.Errorf("--%s is not a worker flag", name)
		}
	}
	for _, e := range c.Env {
		known := strings.Contains(help, "["+e.Name+"]") || e.Name == "NATS_PASSWORD" || e.Name == "OPENAI_API_KEY"
		if e.Name == "GOMEMLIMIT" { // read by the Go runtime; the help says when to set it
			known = strings.Contains(help, "GOMEMLIMIT")
			checkMemLimit(t, e.Value, c)
		}
		if !known {
			t.Errorf("env %s is not read by the worker", e.Name)
		}
	}
	if !strings.Contains(help, "NATS_PASSWORD") || !strings.Contains(help, "OPENAI_API_KEY") {
		t.Errorf("worker --help no longer names NATS_PASSWORD / OPENAI_API_KEY")
	}
}

// checkMemLimit holds the Go runtime's soft limit under the container's
// memory limit: above it the kernel kills the worker before the collector
// works harder.
func checkMemLimit(t *testing.T, v string, c *corev1.Container) {
	t.Helper()
	units := map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
	var soft int64
	for suffix, unit := range units {
		if n, err := strconv.ParseInt(strings.TrimSuffix(v, suffix), 10, 64); strings.HasSuffix(v, suffix) && err == nil {
			soft = n * unit
		}
	}
	hard := c.Resources.Limits.Memory()
	switch {
	case soft <= 0:
		t.Errorf("GOMEMLIMIT %q: want a number of KiB, MiB or GiB", v)
	case hard.IsZero():
		t.Errorf("GOMEMLIMIT is set but the container has no memory limit")
	case soft >= hard.Value():
		t.Errorf("GOMEMLIMIT %s is not under the container's memory limit %s", v, hard)
	}
}

// The PrometheusRule carries exactly the rules of alerts.yml.
func TestPrometheusRuleMatchesAlerts(t *testing.T) {
	m := loadManifests(t)
	if len(m.rules) != 1 {
		t.Fatalf("want one PrometheusRule")
	}
	raw, err := os.ReadFile("../prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var spec monv1.PrometheusRuleSpec
	if err := decodeStrict(raw, &spec); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	got, _ := yaml.Marshal(m.rules[0].Spec)
	want, _ := yaml.Marshal(spec)
	if !bytes.Equal(got, want) {
		t.Errorf("deploy/k8s/prometheus-rule.yaml differs from deploy/prometheus/alerts.yml; regenerate it (see its header)")
	}
	// Every alert has a runbook in docs/operations.md.
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			want := "https://github.com/agentfleet/agentfleet/blob/main/docs/operations.md#" + strings.ToLower(r.Alert)
			if r.Annotations["runbook_url"] != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !bytes.Contains(ops, []byte("\n### "+r.Alert+"\n")) {
				t.Errorf("%s: no \"### %s\" runbook section in docs/operations.md", r.Alert, r.Alert)
			}
		}
	}
	if n < 10 {
		t.Errorf("only %d alerts", n)
	}
}

// The Dockerfile's -X main.version reaches the worker: a build with it
// prints that version for --version (-X on a missing variable does nothing).
func TestImageVersionIsSet(t *testing.T) {
	dockerfile, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(dockerfile, []byte(`-X main.version=${VERSION}" -o /out/worker ./cmd/worker`)) {
		t.Fatalf("the Dockerfile no longer sets main.version of the worker")
	}
	bin := filepath.Join(t.TempDir(), "worker")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v0.0.0-verify", "-o", bin, "./cmd/worker")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "v0.0.0-verify") {
		t.Fatalf("worker --version: %v, %q", err, out)
	}
}
