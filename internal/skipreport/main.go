// Command skipreport reads `go test -json` and prints what go test prints
// without -json (a line per package, a failing package's output in full,
// build errors), then one line naming every test that skipped and why, so
// that a test run never skips in silence:
//
//	go test -race -count=1 -timeout 20m -json ./... | go run ./internal/skipreport
//
// It exits 1 when a package failed or did not build, or when no package
// reported (go test itself failed).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

func main() {
	os.Exit(report(os.Stdin, os.Stdout))
}

// event is a line of `go test -json` (test2json), with the build events.
type event struct {
	Action, Package, Test, Output, ImportPath string
}

// skip is a test that skipped.
type skip struct{ pkg, test, reason string }

// pkgOut is a package's output until it ends.
type pkgOut struct {
	lines []line              // everything, in order
	tests map[string][]string // each test's own output
	// ended holds the tests that passed or skipped: a failed package's
	// output is every line but theirs. A test that timed out or whose
	// goroutine panicked gets no fail event, only the dump in its name.
	ended map[string]bool
}

type line struct{ test, text string }

func report(in io.Reader, out io.Writer) int {
	pkgs := map[string]*pkgOut{}
	var order []string // packages started, for those that never end
	var skips []skip
	failed, ended := false, 0
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			fmt.Fprintln(out, sc.Text()) // not JSON: go test's own message
			continue
		}
		switch e.Action {
		case "build-output":
			fmt.Fprint(out, e.Output)
			continue
		case "build-fail":
			failed = true
			continue
		}
		p := pkgs[e.Package]
		if p == nil {
			p = &pkgOut{tests: map[string][]string{}, ended: map[string]bool{}}
			pkgs[e.Package] = p
			order = append(order, e.Package)
		}
		switch {
		case e.Action == "output":
			p.lines = append(p.lines, line{e.Test, e.Output})
			if e.Test != "" {
				p.tests[e.Test] = append(p.tests[e.Test], e.Output)
			}
		case e.Action == "skip" && e.Test != "":
			skips = append(skips, skip{e.Package, e.Test, reason(p.tests[e.Test])})
			p.ended[e.Test] = true
		case e.Action == "pass" && e.Test != "":
			p.ended[e.Test] = true
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			ended++
			if e.Action == "fail" {
				failed = true
			}
			p.print(out, e.Action == "fail")
			delete(pkgs, e.Package)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "skipreport: reading go test's output: %v\n", err)
		failed = true
	}
	for _, name := range order {
		if p := pkgs[name]; p != nil { // the stream ended before the package did
			failed = true
			p.print(out, true)
			fmt.Fprintf(out, "FAIL\t%s\t(no result)\n", name)
		}
	}
	fmt.Fprintln(out, summary(skips))
	if failed || ended == 0 {
		return 1
	}
	return 0
}

// print prints a package's output as go test without -v does: its
// result line; when it failed, also what the package and its failed tests
// printed.
func (p *pkgOut) print(out io.Writer, failed bool) {
	for _, l := range p.lines {
		switch {
		case strings.HasPrefix(l.text, "ok  \t") || strings.HasPrefix(l.text, "?   \t"):
		case !failed || strings.HasPrefix(l.text, "=== ") || p.ended[l.test]:
			continue
		}
		fmt.Fprint(out, l.text)
	}
}

var logPrefix = regexp.MustCompile(`^\s*[\w.-]+\.go:\d+: `)

// reason is what a skipped test said: its output but the run markers.
func reason(lines []string) string {
	var parts []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		parts = append(parts, logPrefix.ReplaceAllString(t, ""))
	}
	r := strings.Join(parts, " ")
	if rs := []rune(r); len(rs) > 240 {
		r = string(rs[:239]) + "…"
	}
	if r == "" {
		r = "no reason given"
	}
	return r
}

// summary is the one line about skips: the tests of a package that gave
// one reason are named together.
func summary(skips []skip) string {
	if len(skips) == 0 {
		return "skipped: none"
	}
	type group struct {
		pkg, reason string
		tests       []string
	}
	var groups []*group
	for _, s := range skips {
		var g *group
		for _, h := range groups {
			if h.pkg == s.pkg && h.reason == s.reason {
				g = h
			}
		}
		if g == nil {
			g = &group{pkg: s.pkg, reason: s.reason}
			groups = append(groups, g)
		}
		g.tests = append(g.tests, s.test)
	}
	parts := make([]string, len(groups))
	for i, g := range groups {
		parts[i] = fmt.Sprintf("%s %s (%s)", strings.TrimPrefix(g.pkg, "github.com/agentfleet/agentfleet/"), strings.Join(g.tests, ", "), g.reason)
	}
	n := "tests"
	if len(skips) == 1 {
		n = "test"
	}
	return fmt.Sprintf("SKIPPED %d %s: %s", len(skips), n, strings.Join(parts, "; "))
}
