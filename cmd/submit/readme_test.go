package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestREADMECommands runs every shell block of README.md as a newcomer
// would, in order, with the commands installed: the test's binaries are
// submit and worker in $(go env GOPATH)/bin, for `go install ./cmd/...`,
// put on the PATH only by the Quickstart's own export line (checked), whose
// PATH the later blocks keep. The Quickstart block's `worker` is the Quickstart worker,
// started once (its embedded server on a random port stands for
// 127.0.0.1:4222), and every later block runs next to it: a later `worker`
// with --nats joins it; one without starts a server of its own on 4222,
// which the Quickstart worker holds, so its block must say to stop the
// Quickstart worker first (it then runs with a server of its own). That
// rule is checked on every block, the skipped ones too. Blocks whose first
// line says "# needs ..." (a model endpoint, Docker) are skipped; the test
// commands are what .ci/run runs. A line `... || echo "exit code $? (N: ...)"`
// must print exit code N. "node clients/typescript/..." lines run the
// TypeScript client's examples (the package's dependencies installed: the
// block says "# uses AGENTFLEET_TS_CLIENT").
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
	r := &readmeRun{root: root, gopath: installCommands(t)}
	ran := 0
	for i, b := range blocks {
		block := b[1]
		if err := checkWorkerLines(block, i == 0); err != nil {
			t.Errorf("block %d: %v", i, err)
		}
		first := strings.SplitN(strings.TrimSpace(block), "\n", 2)[0]
		if i == 0 {
			// The Quickstart: install, then the worker the other blocks
			// run next to.
			if !strings.Contains(block, "go install ./cmd/...\n") || !regexp.MustCompile(`(?m)^worker$`).MatchString(block) {
				t.Fatalf("README's first block is not the Quickstart (go install ./cmd/..., then worker):\n%s", block)
			}
			r.runBlock(t, block, true)
			ran++
			continue
		}
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
				t.Run(fmt.Sprintf("block%d", i), func(t *testing.T) {
					t.Skipf("%s is not set (README.md, Tests, says how to get it)", name)
				})
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
			r.runBlock(t, block, false)
		})
		ran++
	}
	if ran < 7 {
		t.Errorf("ran %d blocks", ran)
	}
	// Inline commands and what the Quickstart says.
	for _, want := range []string{"`worker --help`", "`~/.agentfleet`"} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("README lost %s", want)
		}
	}
	out, err := exec.Command(fleet.worker, "--help").CombinedOutput()
	if err != nil {
		t.Errorf("worker --help: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), filepath.Join(".agentfleet")+`")`) {
		t.Errorf("the worker's data directory is no longer ~/.agentfleet, as README says:\n%s", out)
	}
}

// installCommands is `go install ./cmd/...` for the test: a GOPATH whose
// bin holds the test's submit and worker.
func installCommands(t *testing.T) string {
	gopath := t.TempDir()
	bin := filepath.Join(gopath, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"submit": fleet.submit, "worker": fleet.worker} {
		if err := os.Symlink(path, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	return gopath
}

// readmeRun is the state the README's blocks share: the Quickstart
// worker's NATS.
type readmeRun struct {
	root, gopath string
	quickstart   string // the Quickstart worker's URL, for nats://127.0.0.1:4222
	// path is the PATH the Quickstart block leaves (its export line), which
	// the later blocks run with, as in the newcomer's shell.
	path string
}

var (
	envPrefix  = regexp.MustCompile(`^(?:[A-Z_]+=\S+ )*`)
	stopsFirst = regexp.MustCompile(`(?m)^# stop .* first`)
	exitCodeIs = regexp.MustCompile(`\|\| echo "exit code \$\? \((\d+):`)
)

// checkWorkerLines checks a block's `worker` lines: after the Quickstart,
// one that starts an embedded server (no --nats) needs its block to say
// what to stop first.
func checkWorkerLines(block string, quickstart bool) error {
	for _, line := range strings.Split(block, "\n") {
		line = envPrefix.ReplaceAllString(strings.TrimSpace(line), "")
		if line != "worker" && !strings.HasPrefix(line, "worker ") || quickstart || strings.Contains(line, "--nats ") {
			continue
		}
		if !stopsFirst.MatchString(block) {
			return fmt.Errorf("%q starts a NATS server on 127.0.0.1:4222, which the Quickstart worker holds: give it --nats nats://127.0.0.1:4222 (and a queue of its own if its tools differ) or say \"# stop the Quickstart worker first\"", line)
		}
	}
	return nil
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

// runBlock starts the block's workers (the Quickstart one for the
// Quickstart block, kept for the blocks after it) and runs its other lines
// in bash, next to them.
func (r *readmeRun) runBlock(t *testing.T, block string, quickstart bool) {
	url := r.quickstart
	var script []string
	for _, line := range strings.Split(block, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || quickstart && line == "go install ./cmd/..." {
			continue
		}
		if args, ok := strings.CutPrefix(line+" ", "worker "); ok {
			fields := strings.Fields(strings.ReplaceAll(args, "nats://127.0.0.1:4222", r.quickstart))
			for i := range fields {
				if strings.HasPrefix(fields[i], "examples/") {
					fields[i] = filepath.Join(r.root, fields[i]) // the worker runs elsewhere
				}
				if fields[i] == "--metrics-addr" && i+1 < len(fields) {
					fields[i+1] = "127.0.0.1:0" // the README's ports may be taken here
				}
			}
			if !strings.Contains(args, "--nats ") {
				// Its own embedded server: 4222 stands for a free port.
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
		if !regexp.MustCompile(`(^|[($ ])submit( |$)|^export |(^|[($ ])node clients/typescript/`).MatchString(line) {
			t.Fatalf("README line %q is neither a worker nor a submit command: teach this test about it", line)
		}
		script = append(script, strings.ReplaceAll(line, "nats://127.0.0.1:4222", url))
	}
	if quickstart {
		r.quickstart = url
	}
	if len(script) == 0 {
		return
	}
	run := strings.Join(script, "\n")
	path := r.path
	pathFile := filepath.Join(t.TempDir(), "path")
	if quickstart {
		// The installed commands are on the PATH only if the block's own
		// export line puts them there: it starts from a PATH without them
		// (nor a stale install of them), and what it leaves is kept.
		path = pathWithout(os.Getenv("PATH"), "submit", "worker")
		run += "\nprintf %s \"$PATH\" > " + shellQuote(pathFile)
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", run)
	cmd.Dir = r.root
	cmd.Env = append(submitEnv(), "NATS_URL="+url, "GOPATH="+r.gopath, "PATH="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s\n--- output:\n%s", err, strings.Join(script, "\n"), out)
	}
	if quickstart {
		b, err := os.ReadFile(pathFile)
		if err != nil {
			t.Fatal(err)
		}
		r.path = string(b)
		if err := installedOnPath(r.path, filepath.Join(r.gopath, "bin"), "submit", "worker"); err != nil {
			t.Fatalf("after the Quickstart block (%s): %v", strings.Join(script, "; "), err)
		}
	}
	for _, m := range exitCodeIs.FindAllStringSubmatch(strings.Join(script, "\n"), -1) {
		if !strings.Contains(string(out), "exit code "+m[1]+" (") {
			t.Errorf("no \"exit code %s\" in the output:\n%s", m[1], out)
		}
	}
	t.Logf("%s\n--- output:\n%s", strings.Join(script, "\n"), out)
}

// pathWithout is path less the directories that hold any of names.
func pathWithout(path string, names ...string) string {
	var keep []string
	for _, dir := range filepath.SplitList(path) {
		if !slices.ContainsFunc(names, func(n string) bool { return isExecutable(filepath.Join(dir, n)) }) {
			keep = append(keep, dir)
		}
	}
	return strings.Join(keep, string(os.PathListSeparator))
}

func isExecutable(file string) bool {
	fi, err := os.Stat(file)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// installedOnPath checks that each of names is found on path first in bin,
// as a shell looks commands up.
func installedOnPath(path, bin string, names ...string) error {
	for _, n := range names {
		found := ""
		for _, dir := range filepath.SplitList(path) {
			if dir != "" && isExecutable(filepath.Join(dir, n)) {
				found = filepath.Join(dir, n)
				break
			}
		}
		if filepath.Dir(found) != filepath.Clean(bin) {
			return fmt.Errorf("%s is %q on PATH %q, not the one installed in %s", n, found, path, bin)
		}
	}
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// The rule TestREADMECommands applies to worker lines, on the MCP block
// as it was (issue 62: port 4222 taken by the Quickstart worker) and as
// it may be.
func TestREADMEWorkerLineRule(t *testing.T) {
	for block, ok := range map[string]bool{
		"# uses X\nworker --tools-config examples/mcp/everything.json\nsubmit tools\n":                                       false,
		"# uses X\nworker --nats nats://127.0.0.1:4222 --queue mcp --tools-config examples/mcp/everything.json\n":            true,
		"# needs Y\n# stop the Quickstart worker first (Ctrl-C)\nOPENAI_BASE_URL=http://x worker --default-model openai/m\n": true,
		"# needs Y\nOPENAI_BASE_URL=http://x worker --default-model openai/m\n":                                              false,
	} {
		if err := checkWorkerLines(block, false); (err == nil) != ok {
			t.Errorf("%q: %v", block, err)
		}
	}
}
