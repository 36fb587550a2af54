package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// workerHelp builds cmd/worker and returns its --help text.
func workerHelp(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "worker")
	build := exec.Command("go", "build", "-o", bin, "../cmd/worker")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/worker: %v\n%s", err, out)
	}
	var out bytes.Buffer
	cmd := exec.Command(bin, "--help")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("worker --help: %v\n%s", err, out.String())
	}
	return out.String()
}

// workerArgs collects the arguments and environment variable names given to
// worker containers in the compose file and the Kubernetes manifests.
func workerArgs(t *testing.T) (args, env []string, ports []int) {
	t.Helper()
	var compose struct {
		XWorker struct {
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
		} `yaml:"x-worker"`
	}
	raw, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatal(err)
	}
	args = append(args, compose.XWorker.Command...)
	for k := range compose.XWorker.Environment {
		env = append(env, k)
	}

	raw, err = os.ReadFile("k8s/worker.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var doc struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Args []string `yaml:"args"`
							Env  []struct {
								Name string `yaml:"name"`
							} `yaml:"env"`
							Ports []struct {
								ContainerPort int `yaml:"containerPort"`
							} `yaml:"ports"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); err != nil {
			break
		}
		if doc.Kind != "Deployment" {
			continue
		}
		for _, c := range doc.Spec.Template.Spec.Containers {
			args = append(args, c.Args...)
			for _, e := range c.Env {
				env = append(env, e.Name)
			}
			for _, p := range c.Ports {
				ports = append(ports, p.ContainerPort)
			}
		}
	}
	if len(args) == 0 || len(ports) == 0 {
		t.Fatal("no worker arguments or ports found in the manifests")
	}
	return args, env, ports
}

var flagName = regexp.MustCompile(`^--?([a-z0-9-]+)`)

// Every flag and environment variable the manifests give the worker exists,
// and the ports they expose are the ones it serves on.
func TestManifestsUseRealWorkerFlags(t *testing.T) {
	help := workerHelp(t)
	args, env, ports := workerArgs(t)
	for _, a := range args {
		m := flagName.FindStringSubmatch(a)
		if m == nil {
			continue
		}
		if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(m[1]) + `\b`).MatchString(help) {
			t.Errorf("manifests pass %s, which worker --help does not list", a)
		}
	}
	for _, e := range env {
		if !strings.Contains(help, e) {
			t.Errorf("manifests set %s, which worker --help does not mention", e)
		}
	}
	metricsPort := "9464"
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--metrics-addr="); ok {
			metricsPort = v[strings.LastIndex(v, ":")+1:]
		}
	}
	// The default is loopback: a container scraped from outside must say
	// every interface itself.
	if !strings.Contains(help, `"127.0.0.1:`+metricsPort+`"`) && !containsArg(args, "--metrics-addr=:"+metricsPort) {
		t.Errorf("metrics port %s is neither the default nor configured", metricsPort)
	}
	if !containsArg(args, "--metrics-addr=:"+metricsPort) {
		t.Errorf("the manifests do not pass --metrics-addr=:%s: the worker's default listens on loopback only, out of Prometheus's reach", metricsPort)
	}
	for _, p := range ports {
		if strconv.Itoa(p) != metricsPort {
			t.Errorf("the Deployment exposes port %d; the worker serves metrics on %s", p, metricsPort)
		}
	}
	for _, f := range []string{"prometheus/prometheus-compose.yml"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(raw), ":"+metricsPort) {
			t.Errorf("%s does not scrape the workers on :%s", f, metricsPort)
		}
	}
}

func containsArg(args []string, want string) bool {
	for _, a := range args {
		if a == want {
			return true
		}
	}
	return false
}
