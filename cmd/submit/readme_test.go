package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestREADMECommands runs every shell block of README.md against the test
// fleet: "go run ./cmd/worker ..." starts the worker binary (its embedded
// server on a random port instead of 4222, which later lines of the block
// then use), the other lines run in bash with "go run ./cmd/submit" being
// the built binary, and "node clients/typescript/..." lines run the
// TypeScript client's examples (the package's dependencies installed: the
// block says "# uses AGENTFLEET_TS_CLIENT"). Blocks whose first line says
// "# needs ..." (a model endpoint, Docker) are skipped; the test command is
// what .ci/run runs.
func TestREADMECommands(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) < 8 {
		t.Fatalf("only %d sh blocks in README.md", len(blocks))
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci/run"))
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for i, b := range blocks {
		block := b[1]
		first := strings.SplitN(strings.TrimSpace(block), "\n", 2)[0]
		if strings.HasPrefix(first, "# needs ") {
			t.Logf("block %d skipped (%s)", i, first)
			continue
		}
		// "# uses VAR ...": runs where VAR is set (CI installs what it names).
		if v, ok := strings.CutPrefix(first, "# uses "); ok {
			if name, _, _ := strings.Cut(v, " "); os.Getenv(name) == "" {
				if os.Getenv("CI") == "true" {
					t.Errorf("block %d needs %s, which CI must set", i, name)
				}
				t.Logf("block %d skipped: %s is not set", i, name)
				continue
			}
		}
		if cmds := testCommands(block); cmds != nil {
			// The test commands: CI runs them (.ci/run); here they are only
			// checked to be the same.
			for _, c := range cmds {
				if !strings.Contains(string(ci), c) {
					t.Errorf(".ci/run does not run %q", c)
				}
			}
			continue
		}
		t.Run(fmt.Sprintf("block%d", i), func(t *testing.T) {
			runREADMEBlock(t, root, block)
		})
		ran++
	}
	if ran < 6 {
		t.Errorf("ran %d blocks", ran)
	}
	// Inline commands.
	if !strings.Contains(string(readme), "`go run ./cmd/worker --help`") {
		t.Error("README lost `go run ./cmd/worker --help`")
	}
	if out, err := exec.Command(fleet.worker, "--help").CombinedOutput(); err != nil {
		t.Errorf("worker --help: %v\n%s", err, out)
	}
}

// testCommands returns the commands of a block made only of go vet / go
// test commands (joined by &&), or nil.
func testCommands(block string) []string {
	var cmds []string
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		for _, c := range strings.Split(line, "&&") {
			c = strings.TrimSpace(c)
			if !strings.HasPrefix(c, "go vet ") && !strings.HasPrefix(c, "go test ") {
				return nil
			}
			cmds = append(cmds, c)
		}
	}
	return cmds
}

func runREADMEBlock(t *testing.T, root, block string) {
	url := fleet.url
	var script []string
	for _, line := range strings.Split(block, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if args, ok := strings.CutPrefix(line, "go run ./cmd/worker"); ok {
			fields := strings.Fields(strings.ReplaceAll(args, "nats://127.0.0.1:4222", url))
			for i := range fields {
				if strings.HasPrefix(fields[i], "examples/") {
					fields[i] = filepath.Join(root, fields[i]) // the worker runs elsewhere
				}
				if fields[i] == "--metrics-addr" && i+1 < len(fields) {
					fields[i+1] = "127.0.0.1:0" // the README's ports may be taken here
				}
			}
			if !strings.Contains(args, "--nats ") {
				fields = append(fields, "--nats-listen", "127.0.0.1:0", "--data-dir", t.TempDir())
			}
			stop, embedded, err := startWorkerProcess(filepath.Join(t.TempDir(), "worker.log"), nil, fields...)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			t.Cleanup(func() {
				if err := stop(); err != nil {
					t.Errorf("%s: %v", line, err)
				}
			})
			if embedded != "" {
				url = embedded
			}
			continue
		}
		if !strings.Contains(line, "go run ./cmd/submit") && !strings.Contains(line, "node clients/typescript/") {
			t.Fatalf("README line %q is neither a worker nor a submit command: teach this test about it", line)
		}
		line = strings.ReplaceAll(line, "go run ./cmd/submit", `"$SUBMIT"`)
		script = append(script, strings.ReplaceAll(line, "nats://127.0.0.1:4222", url))
	}
	if len(script) == 0 {
		return
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", strings.Join(script, "\n"))
	cmd.Dir = root
	cmd.Env = append(submitEnv("SUBMIT="+fleet.submit), "NATS_URL="+url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s\n--- output:\n%s", err, strings.Join(script, "\n"), out)
	}
	t.Logf("%s\n--- output:\n%s", strings.Join(script, "\n"), out)
}
